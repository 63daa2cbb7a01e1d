"""What Flower's processes cost: one config run in-process, on Flower's simulation engine
and as a localhost deployment (SuperLink + one SuperNode per client), same rounds.

Prints, per mode: seconds of the round loop (validation included) and per round, wall
seconds of the whole command (start-up, registration and the final test included), tensor
bytes and serialized (wire) bytes per round, the weighted test MRR, the ratio to
in-process, and for the Flower modes the clients' own compute per round (each stage as
long as its slowest client's work, as on machines of their own) and the overhead: the
round's seconds beyond that compute, also as a share of the in-process round. On a
machine with fewer cores than clients the clients' compute itself is slowed by sharing
the cores; that is in the compute column, not the overhead. Run it on a quiet machine
(two runs at once share the cores).

    python scripts/benchmarks/bench_flower.py -c configs/fede/umls_fede.yaml --rounds 4 \\
        --out docs/results/flower/umls.json
    python scripts/benchmarks/bench_flower.py -c configs/fede/fb15k237_fed3_fede.yaml --rounds 2 \\
        --out docs/results/flower/fb15k237_fed3.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from lightning_fedkg import measure

ROOT = measure.repo_root(__file__)


def run_mode(mode: str, config: str, overrides: list[str], work: Path) -> dict:
    from lightning_fedkg.config import load_config, resolve_auto_settings
    from lightning_fedkg.run import fit

    run_dir = work / mode
    shutil.rmtree(run_dir, ignore_errors=True)
    extra = {"local": [], "simulation": ["federated.backend=flower"],
             "deployment": ["federated.backend=flower", "federated.flower.mode=deployment"]}[mode]
    cfg = resolve_auto_settings(load_config(config, [*overrides, *extra]))
    start = time.perf_counter()
    if mode == "deployment":
        from lightning_fedkg.backends.flower.deploy import up

        metrics = up(cfg, run_dir)
    else:
        metrics = fit(cfg, run_dir)
    wall = time.perf_counter() - start
    rounds = metrics["rounds"]
    wire_rounds = sum(r["wire_bytes"] for r in map(json.loads, (run_dir / "channel_log.jsonl").read_text().splitlines())
                      if r["round"] >= 1)
    row = {"mode": mode, "rounds": rounds, "seconds": metrics["seconds"], "seconds_per_round": metrics["seconds"] / rounds,
           "wall_seconds": round(wall, 2), "bytes_per_round": metrics["bytes_sent"] / rounds,
           "wire_bytes_per_round": wire_rounds / rounds, "test_mrr": metrics["test"]["mrr"],
           "failures": len(metrics["failures"])}
    if mode != "local":
        row.update(client_breakdown(run_dir, rounds))
    return row


def client_breakdown(run_dir: Path, rounds: int) -> dict:
    """From the clients' ``messages.jsonl``: per round, the clients' own compute if each had
    its own machine (each stage as long as its slowest client's ``work``, summed over the
    round's stages) and what the round took beyond it (the overhead: process starts,
    imports, rebuilds, state files, serialization, transport, polling), plus the seconds the
    clients spent rebuilding, loading and saving. Only the round loop counts: a client's
    rows end where the final test begins (its first ``restore`` after training)."""
    slowest: dict[tuple, float] = {}
    spent = {"build": 0.0, "load": 0.0, "save": 0.0}
    pids = set()
    for path in (run_dir / "flower" / "clients").glob("*/*/messages.jsonl"):
        seen: dict[tuple, int] = {}
        trained = False
        for r in map(json.loads, path.read_text().splitlines()):
            pids.add(r["pid"])
            if r["kind"] == "restore" and trained:
                break
            if r["kind"] != "stage" or r["round"] < 1:
                continue
            trained = True
            stage = (r["round"], r["stage"])
            seen[stage] = seen.get(stage, 0) + 1  # a stage sent twice in a round (a retry) counts twice
            key = (*stage, seen[stage])
            slowest[key] = max(slowest.get(key, 0.0), r.get("work", 0.0))
            for k in spent:
                spent[k] += r.get(k, 0.0)
    return {"client_compute_per_round": sum(slowest.values()) / rounds,
            "client_runtime_per_round": {k: v / rounds for k, v in spent.items()}, "client_processes": len(pids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config")
    parser.add_argument("--breakdown", nargs="+", metavar="RUN_DIR",
                        help="only print client_breakdown (and the overhead per round) of finished Flower runs")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="trainer.threads of every process")
    parser.add_argument("--modes", nargs="+", default=["local", "simulation", "deployment"])
    parser.add_argument("--work", default=str(ROOT / "runs" / "bench_flower"))
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.breakdown:
        for run_dir in map(Path, args.breakdown):
            metrics = json.loads((run_dir / "metrics.json").read_text())
            row = client_breakdown(run_dir, metrics["rounds"])
            row["overhead_per_round"] = metrics["seconds"] / metrics["rounds"] - row["client_compute_per_round"]
            print(json.dumps({"run": str(run_dir), "seconds_per_round": metrics["seconds"] / metrics["rounds"], **row}))
        return
    if not args.config:
        parser.error("-c/--config is required (unless --breakdown)")
    # One secret for every mode: the alignment's order of rows depends on it, so equal
    # secrets give equal numbers (the MRR column checks that the modes ran the same thing).
    overrides = [f"federated.rounds={args.rounds}", f"federated.eval_every={args.rounds}",
                 f"trainer.threads={args.threads}", "trainer.progress_bar=false",
                 "federated.federation_key=bench-flower", *args.overrides]
    work = Path(args.work) / Path(args.config).stem
    results = []
    for mode in args.modes:
        row = run_mode(mode, args.config, overrides, work)
        results.append(row)
        print(json.dumps(row), flush=True)
    base = next((r for r in results if r["mode"] == "local"), None)
    print(f"\n{'mode':<11}{'s/round':>9}{'wall s':>9}{'MB/round':>10}{'wire MB/round':>15}{'test MRR':>10}"
          f"{'vs local':>10}{'compute/round':>15}{'overhead/round':>16}")
    for r in results:
        ratio = f"{(r['seconds_per_round'] / base['seconds_per_round'] - 1) * 100:+.1f}%" if base else "-"
        compute = r.get("client_compute_per_round")
        over = "-" if compute is None else f" {r['seconds_per_round'] - compute:.2f} s" + (
            f" ({(r['seconds_per_round'] - compute) / base['seconds_per_round'] * 100:.1f}%)" if base else "")
        print(f"{r['mode']:<11}{r['seconds_per_round']:>9.2f}{r['wall_seconds']:>9.1f}{r['bytes_per_round'] / 1e6:>10.3f}"
              f"{r['wire_bytes_per_round'] / 1e6:>15.3f}{r['test_mrr']:>10.4f}{ratio:>10}"
              f"{'-' if compute is None else f'{compute:.2f}':>15}{over:>16}")
    if args.out:
        measure.write_json(args.out, {"config": args.config, "overrides": overrides, "results": results})


if __name__ == "__main__":
    main()
