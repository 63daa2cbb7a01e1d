#!/usr/bin/env python
"""Dense Adam beside the row-sparse optimizer (``train.optimizer``) over seeds: test MRR,
Hits@1 and Hits@10 of one config per variant.

Each variant is ``NAME=OVERRIDES`` (space-separated ``key=value``; none for the config as
shipped); every variant runs ``fedkg fit -c CONFIG seed=S OVERRIDES`` for every seed in a
fresh process (bench_seeds.py's :func:`run_one`, which reuses a run folder that already holds
a ``metrics.json``), and the JSON holds per seed the test metrics (for a federated run, the
triple-weighted mean over the clients) and per variant their means and sample std.

    python scripts/benchmarks/bench_optimizers.py -c configs/fede/umls_fede.yaml --seeds 0 1 2 3 4 \\
        --variant adam= --variant sparse_adam=train.optimizer=sparse_adam \\
        --out runs/bench_optimizers --json-out docs/results/scale/umls_optimizers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from lightning_fedkg import measure

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_seeds import run_one  # noqa: E402  (a sibling script)

REPO = measure.repo_root(__file__)
METRICS = ("mrr", "hits@1", "hits@10")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--config", default="configs/fede/umls_fede.yaml")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--variant", action="append", metavar="NAME=OVERRIDES",
                   help="repeatable; default: adam= and sparse_adam=train.optimizer=sparse_adam")
    p.add_argument("--out", default="runs/bench_optimizers", help="root of the run folders")
    p.add_argument("--json-out")
    return p.parse_args(argv)


def variants(specs: list[str] | None) -> dict[str, list[str]]:
    specs = specs or ["adam=", "sparse_adam=train.optimizer=sparse_adam"]
    out = {}
    for spec in specs:
        name, _, overrides = spec.partition("=")
        out[name] = overrides.split()
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    results = {}
    for name, overrides in variants(args.variant).items():
        print(f"{name}: {' '.join(overrides) or '(the config as shipped)'}", flush=True)
        runs = []
        for seed in args.seeds:
            folder = Path(args.out) / Path(args.config).stem / name / f"seed_{seed}"
            run = run_one(args.config, seed, folder, overrides)
            test = json.loads((folder / "metrics.json").read_text())["test"]
            runs.append({"seed": seed, **{m: float(test[m]) for m in METRICS}, "wall_s": run["wall_s"],
                         "rounds": run["rounds"]})
        summary = {f"{m}_mean": statistics.mean(r[m] for r in runs) for m in METRICS}
        summary["mrr_std"] = statistics.stdev(r["mrr"] for r in runs) if len(runs) > 1 else 0.0
        walls = [r["wall_s"] for r in runs if r["wall_s"] is not None]
        summary["wall_s_mean"] = statistics.mean(walls) if walls else None
        results[name] = {"overrides": overrides, "runs": runs, "summary": summary}
        print(f"  {name}: MRR {summary['mrr_mean']:.4f} ± {summary['mrr_std']:.4f}  "
              f"H@1 {summary['hits@1_mean']:.4f}  H@10 {summary['hits@10_mean']:.4f}", flush=True)
    if args.json_out:
        payload = {"command": "python scripts/benchmarks/bench_optimizers.py " + " ".join(sys.argv[1:]),
                   "config": args.config, "seeds": args.seeds, "code": measure.code_version(REPO),
                   "machine": measure.machine(), "results": results}
        measure.write_json(args.json_out, payload, indent=2)
        print(f"wrote {args.json_out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
