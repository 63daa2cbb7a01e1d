#!/usr/bin/env python
"""FedE vs FedProx vs FedLU on FB15k-237-R10 for a bounded number of rounds, then unlearning.

Each strategy runs its config ``configs/fedlu/fb15k237_r10_<strategy>.yaml`` (the official
FedLU code's hyperparameters; see the configs' headers) for ``--rounds`` rounds with early
stopping disabled, in its own child process so that its peak memory is its own. Per
strategy it records the wall-clock seconds of every round's training (``train_round``:
download, E local epochs on every client, upload, aggregation), of every evaluation
(validation every ``federated.eval_every`` rounds and at the last round; the final test),
the peak resident memory, and the test metrics (FedLU: the local embeddings' ``test`` and
the avatar's ``test_global``).

``--unlearn`` then runs ``fedkg unlearn`` with ``configs/fedlu/fb15k237_r10_unlearn.yaml``
on the FedLU run (each client forgets its ``unlearn.txt``; the retrained gold standard
gets the same round budget) and records forgetting-set and test metrics, the
membership-inference AUC and the seconds of unlearning and retraining.

    python scripts/benchmarks/bench_fedlu.py --rounds 5 --threads 1 --unlearn \\
        --json-out docs/results/fedlu/bench_fedlu_r10.json
    python scripts/benchmarks/bench_fedlu.py --rounds 1 --strategies fedlu model.dim=64     # a quick look
    python scripts/benchmarks/bench_fedlu.py --rounds 1 --strategies fedlu --limit-batches 10 trainer.accelerator=cpu

``--limit-batches M`` trains M batches per client and local epoch and extrapolates a full
round from the seconds per trained batch (labelled as extrapolated in the JSON); the
evaluations stay complete.

``scripts/reference/bench_official_fedlu.py`` runs the official code on the same split for the
side-by-side in docs/results/fedlu.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)
DEFAULT_DATA = "../shared/data/FB15k-237-R10"
CONFIGS = REPO / "configs" / "fedlu"


def overrides(args) -> list[str]:
    return [f"data.name={args.data}", f"federated.rounds={args.rounds}", "federated.patience=100000",
            f"trainer.threads={args.threads}", "trainer.progress_bar=false", *args.overrides]


def run_strategy(args) -> dict:
    """Child process: one strategy's run with every round and evaluation timed."""
    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated import federation
    from lightning_fedkg.run import fit

    cfg = load_config(CONFIGS / f"fb15k237_r10_{args.one}.yaml", overrides(args))
    rounds, evaluations = [], []
    train_round, evaluate = federation.FederatedRun.train_round, federation.FederatedRun.evaluate

    def timed_train_round(self, r):
        start, cpu = time.perf_counter(), time.process_time()
        out = train_round(self, r)
        rounds.append({"round": int(r), "seconds": time.perf_counter() - start,
                       "cpu_seconds": time.process_time() - cpu})
        print(f"[{args.one}] round {r}: {rounds[-1]['seconds']:.1f} s", flush=True)
        return out

    def timed_evaluate(self, split, r, **kwargs):
        start, cpu = time.perf_counter(), time.process_time()
        out = evaluate(self, split, r, **kwargs)
        evaluations.append({"split": split, "round": int(r), "seconds": time.perf_counter() - start,
                            "cpu_seconds": time.process_time() - cpu,
                            "mrr": float(out[0]["mrr"])})
        print(f"[{args.one}] {split} at round {r}: {evaluations[-1]['seconds']:.1f} s, MRR {out[0]['mrr']:.4f}",
              flush=True)
        return out

    federation.FederatedRun.train_round = timed_train_round
    federation.FederatedRun.evaluate = timed_evaluate
    batches = {}
    if args.limit_batches:
        build = federation.FederatedRun.__init__

        def limited_init(self, *a, **kw):
            build(self, *a, **kw)
            for party in self.clients:
                party.trainer.limit_train_batches = args.limit_batches
                batches[party.name] = party.datamodule.num_train_batches

        federation.FederatedRun.__init__ = limited_init
    start = time.perf_counter()
    metrics = fit(cfg, args.run_dir)
    total = time.perf_counter() - start
    other = other_scoring(cfg, args.run_dir) if args.both_ways else None
    later = [r["seconds"] for r in rounds[1:]] or [r["seconds"] for r in rounds]
    extrapolated = None
    if args.limit_batches:
        # seconds per trained batch (all of a round's time charged to its batches: an upper
        # bound) times the batches of a full round
        trained = sum(min(args.limit_batches, b) for b in batches.values()) * cfg.federated.local_epochs
        full = sum(batches.values()) * cfg.federated.local_epochs
        per_batch = (sum(later) / len(later)) / trained
        extrapolated = {"batches_per_epoch_limit": args.limit_batches, "seconds_per_batch": per_batch,
                        "batches_per_full_round": full, "seconds_per_full_round": per_batch * full}
        print(f"[{args.one}] {per_batch * 1000:.0f} ms per batch -> ~{per_batch * full:.0f} s per full round "
              f"({full} batches; extrapolated)", flush=True)
    return {
        "extrapolated": extrapolated,
        "strategy": args.one,
        "rounds": rounds,
        "seconds_per_round": sum(r["seconds"] for r in rounds) / len(rounds),
        "seconds_per_round_after_first": sum(later) / len(later),
        "cpu_seconds_per_round": sum(r["cpu_seconds"] for r in rounds) / len(rounds),
        "best": metrics.get("best"),
        "client_best_rounds": metrics.get("client_best_rounds"),
        "evaluations": evaluations,
        "wall_seconds": total,
        "peak_rss_mib": measure.peak_rss_mib(),
        "test": metrics["test"],
        "evaluate": cfg.federated.evaluate,
        "test_other_scoring": other,
        "test_global": metrics.get("test_global", {}).get("mrr") and {
            k: v for k, v in metrics["test_global"].items() if k != "clients"},
        "distillation": metrics.get("distillation"),
        "bytes_sent": metrics["bytes_sent"],
        "config": str(CONFIGS / f"fb15k237_r10_{args.one}.yaml"),
        "overrides": overrides(args),
    }


def other_scoring(cfg, run_dir) -> dict:
    """The test of the same best state scored with the aggregated rows, for a run scored
    ``before_aggregation``: its best set holds each client's table as its fit left it and
    the server's aggregate of them. (The best set of an ``aggregated`` run holds the
    aggregated rows in the clients too, its validation having downloaded them, so the
    other way cannot be recovered from it.)"""
    import copy

    from lightning_fedkg.federated.entry import restore_finished_run
    from lightning_fedkg.federated.tasks import with_count

    if cfg.federated.evaluate != "before_aggregation":
        raise SystemExit("--both-ways needs federated.evaluate=before_aggregation (see other_scoring)")
    flipped = copy.deepcopy(cfg)
    flipped.federated.evaluate = "aggregated"
    run, round_ = restore_finished_run(flipped, run_dir)
    try:
        avg, per_client = run.evaluate("test", round_)
    finally:
        run.close()
    print(f"[{cfg.federated.strategy}] test scored {flipped.federated.evaluate}: MRR {avg['mrr']:.4f}", flush=True)
    return {"evaluate": flipped.federated.evaluate, **with_count(avg, per_client)}


def run_unlearning(args) -> dict:
    """Child process: unlearning of the FedLU run, with retraining and the MIA AUC."""
    from lightning_fedkg.config import load_config
    from lightning_fedkg.methods.fedlu.phase import run_unlearn
    from lightning_fedkg.runtime import configure_torch

    cfg = load_config(CONFIGS / "fb15k237_r10_unlearn.yaml", overrides(args))
    configure_torch(cfg.trainer)
    start = time.perf_counter()
    metrics = run_unlearn(cfg, Path(args.run_dir).parent / "fedlu", args.run_dir)
    keep = ("forget", "test", "forget_global", "test_global", "seconds", "mia_auc")
    return {
        "strategy": "unlearn",
        **{stage: {k: metrics[stage][k] for k in keep if k in metrics[stage]}
           for stage in ("before", "after", "retrain") if stage in metrics},
        "mia_auc": metrics["mia_auc"],
        "wall_seconds": time.perf_counter() - start,
        "peak_rss_mib": measure.peak_rss_mib(),
    }


def child(args) -> int:
    result = run_unlearning(args) if args.one == "unlearn" else run_strategy(args)
    measure.write_json(args.json_out, result)
    return 0


def table(results: list[dict]) -> str:
    lines = [f"{'strategy':<10}{'s/round':>10}{'s/val':>9}{'s/test':>9}{'peak MiB':>10}{'test MRR':>10}"
             f"{'H@1':>8}{'H@10':>8}{'global MRR':>12}"]
    for r in results:
        if r["strategy"] == "unlearn":
            continue
        val = [e["seconds"] for e in r["evaluations"] if e["split"] == "val"]
        test = [e["seconds"] for e in r["evaluations"] if e["split"] == "test"]
        g = r.get("test_global") or {}
        lines.append(f"{r['strategy']:<10}{r['seconds_per_round']:>10.1f}{(sum(val) / len(val) if val else 0):>9.1f}"
                     f"{(test[-1] if test else 0):>9.1f}{r['peak_rss_mib']:>10.0f}{r['test']['mrr']:>10.4f}"
                     f"{r['test']['hits@1']:>8.4f}{r['test']['hits@10']:>8.4f}"
                     f"{g.get('mrr', float('nan')):>12.4f}")
    for r in results:
        if r["strategy"] != "unlearn":
            continue
        lines.append(f"{'unlearning':<10}{'forget MRR':>12}{'forget H@10':>12}{'test MRR':>10}{'MIA AUC':>9}{'seconds':>10}")
        for stage in ("before", "after", "retrain"):
            b = r.get(stage)
            if b:
                secs = b.get("seconds")
                lines.append(f"{stage:<10}{b['forget']['mrr']:>12.4f}{b['forget']['hits@10']:>12.4f}"
                             f"{b['test']['mrr']:>10.4f}{b['mia_auc']:>9.4f}"
                             f"{(secs if secs is not None else float('nan')):>10.1f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=DEFAULT_DATA)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--strategies", default="fede,fedprox,fedlu")
    parser.add_argument("--unlearn", action="store_true", help="unlearn from the FedLU run afterwards")
    parser.add_argument("--runs-dir", help="where the runs go (default: a temporary folder)")
    parser.add_argument("--json-out")
    parser.add_argument("--limit-batches", type=int, default=0,
                        help="train only this many batches per local epoch and extrapolate a full round")
    parser.add_argument("--both-ways", action="store_true",
                        help="with federated.evaluate=before_aggregation: also test each run's best state "
                             "scored with the aggregated rows")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every run")
    args = parser.parse_args()
    if args.one:
        return child(args)

    runs = Path(args.runs_dir or tempfile.mkdtemp(prefix="bench_fedlu_"))
    steps = [s for s in args.strategies.split(",") if s]
    if args.unlearn:
        if "fedlu" not in steps:
            raise SystemExit("--unlearn needs the fedlu strategy")
        steps.append("unlearn")
    results = []
    for step in steps:
        out = runs / f"{step}.json"
        cmd = [sys.executable, __file__, "--one", step, "--run-dir", str(runs / step), "--json-out", str(out),
               "--data", args.data, "--rounds", str(args.rounds), "--threads", str(args.threads),
               "--limit-batches", str(args.limit_batches), *(["--both-ways"] if args.both_ways else []),
               *args.overrides]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
        results.append(json.loads(out.read_text()))
    print(table(results))
    report = {"machine": platform.platform(), "python": platform.python_version(), "rounds": args.rounds,
              "threads": args.threads, "data": args.data, "results": results}
    if args.json_out:
        measure.write_json(args.json_out, report)
        print(f"written {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
