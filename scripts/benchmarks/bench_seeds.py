#!/usr/bin/env python
"""Run configs over several seeds and summarise the test MRR (mean, std, min, max).

For every config and seed this runs, as a fresh subprocess,

    python -m lightning_fedkg.cli fit -c CONFIG seed=S trainer.progress_bar=false [OVERRIDES] \\
        --out DIR/<config stem>/seed_S

and reads ``"test"`` -> ``"mrr"``/``"hits@10"`` from the run's ``metrics.json`` (for a
federated run that is the triple-weighted mean over clients). A run directory that already
holds a ``metrics.json`` is reused, not re-run (its overrides are not checked: use a new
``--out`` when changing them). The run's stdout/stderr go to
``bench.log`` and its wall-clock seconds to ``bench_run.json`` in the run directory.

The table gives per config: mean MRR, sample std, min, max, mean Hits@10, mean wall
seconds per run (over the runs timed, i.e. not reused ones without ``bench_run.json``)
and the per-seed MRRs. This script does not import torch.

    python scripts/benchmarks/bench_seeds.py -c configs/fede/umls_fede.yaml -c configs/single/umls_single.yaml
    python scripts/benchmarks/bench_seeds.py -c configs/fede/umls_fede.yaml --seeds 0 1 2 \\
        --json docs/results/fede/seeds.json
    python scripts/benchmarks/bench_seeds.py -c configs/fede/umls_fede.yaml --out runs/dim32 model.dim=32

Put overrides before ``--seeds`` (or after ``--``): ``--seeds`` takes every number that follows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", action="append", required=True, help="experiment YAML (repeatable)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="seeds (default: 0 1 2 3 4)")
    p.add_argument("--out", default="runs/bench_seeds", help="root of the run directories (default: %(default)s)")
    p.add_argument("--json", dest="json_path", help="write the per-run results and the summary here")
    p.add_argument("overrides", nargs="*", help="key=value overrides passed to every run")
    return p.parse_args(argv)


def run_one(config: str, seed: int, run_dir: Path, overrides: list[str]) -> dict:
    """Run (or reuse) one config/seed; ``{"seed", "mrr", "hits@10", "wall_s", "reused"}``."""
    metrics_path = run_dir / "metrics.json"
    timing_path = run_dir / "bench_run.json"
    reused = metrics_path.exists()
    if reused:
        print(f"  seed {seed}: reusing {metrics_path}", flush=True)
        wall = json.loads(timing_path.read_text())["wall_s"] if timing_path.exists() else None
    else:
        if run_dir.exists():
            print(f"  seed {seed}: {run_dir} exists without metrics.json; fedkg fit resumes it", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "lightning_fedkg.cli", "fit", "-c", str(Path(config).resolve()), f"seed={seed}",
               "trainer.progress_bar=false", *overrides, "--out", str(run_dir.resolve())]
        print(f"  seed {seed}: {' '.join(cmd[1:])}", flush=True)
        start = time.perf_counter()
        with open(run_dir / "bench.log", "w") as log:
            rc = subprocess.run(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
        wall = time.perf_counter() - start
        if rc != 0 or not metrics_path.exists():
            raise RuntimeError(f"run failed (exit {rc}); see {run_dir / 'bench.log'}")
        measure.write_json(timing_path, {"wall_s": wall, "command": cmd[1:]}, indent=2)
    metrics = json.loads(metrics_path.read_text())
    test = metrics["test"]
    result = {"seed": seed, "mrr": float(test["mrr"]), "hits@10": float(test["hits@10"]),
              "wall_s": wall, "reused": reused, "rounds": metrics.get("rounds"), "best_round": metrics.get("best_round")}
    if "distillation" in metrics:  # FedLU: did distillation run, from which round, and the avatar's test
        d = metrics["distillation"]
        result["distillation"] = {k: d.get(k) for k in ("schedule", "local_on_round", "global_on_round")}
        result["test_global_mrr"] = (metrics.get("test_global") or {}).get("mrr")
    wall_txt = f"{wall:.1f} s" if wall is not None else "? s"
    print(f"  seed {seed}: MRR {result['mrr']:.4f}  Hits@10 {result['hits@10']:.4f}  ({wall_txt})", flush=True)
    return result


def summarise(runs: list[dict]) -> dict:
    mrrs = [r["mrr"] for r in runs]
    walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
    return {
        "mrr_mean": statistics.mean(mrrs),
        "mrr_std": statistics.stdev(mrrs) if len(mrrs) > 1 else 0.0,
        "mrr_min": min(mrrs),
        "mrr_max": max(mrrs),
        "hits@10_mean": statistics.mean(r["hits@10"] for r in runs),
        "wall_s_mean": statistics.mean(walls) if walls else None,
        "n": len(runs),
    }


def format_table(results: dict) -> str:
    width = max([len("config")] + [len(name) for name in results])
    header = (f"{'config':<{width}}  {'MRR':>7} {'std':>7} {'min':>7} {'max':>7} {'H@10':>7} {'wall_s':>7}"
              "  per-seed MRR")
    lines = [header, "-" * len(header)]
    for name, res in results.items():
        s = res["summary"]
        wall = f"{s['wall_s_mean']:>7.1f}" if s["wall_s_mean"] is not None else f"{'?':>7}"
        per_seed = " ".join(f"{r['mrr']:.4f}" for r in res["runs"])
        lines.append(f"{name:<{width}}  {s['mrr_mean']:>7.4f} {s['mrr_std']:>7.4f} {s['mrr_min']:>7.4f} "
                     f"{s['mrr_max']:>7.4f} {s['hits@10_mean']:>7.4f} {wall}  {per_seed}")
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    results = {}
    for config in args.config:
        stem = Path(config).stem
        print(f"{stem} ({config})", flush=True)
        runs = [run_one(config, seed, out / stem / f"seed_{seed}", args.overrides) for seed in args.seeds]
        results[stem] = {"config": config, "runs": runs, "summary": summarise(runs)}
    print()
    print(format_table(results))
    if args.json_path:
        payload = {"code": measure.code_version(REPO), "seeds": args.seeds, "overrides": args.overrides,
                   "results": results}
        measure.write_json(args.json_path, payload, indent=2)
        print(f"results written to {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
