#!/usr/bin/env python
"""Unlearning over several seeds: forgetting-set and test MRR, MIA AUC and seconds,
before / after unlearning / retrained, as mean ± std.

For every seed S this runs, as fresh subprocesses,

    python -m lightning_fedkg.cli fit -c CONFIG seed=S ... --out SOURCES/seed_S       (unless it has metrics.json)
    python -m lightning_fedkg.cli unlearn -c CONFIG seed=S ... --from SOURCES/seed_S --out OUT/seed_S

where CONFIG holds the training sections and an ``unlearn`` section
(``configs/fedlu/umls_unlearn.yaml``), and reads each unlearning run's ``metrics.json``.
Finished runs are reused. ``--sources`` may point at the runs of ``scripts/benchmarks/bench_seeds.py``
for the same training config (``<out>/<config stem>``), so nothing is trained twice.

    python scripts/benchmarks/bench_unlearn_seeds.py -c configs/fedlu/umls_unlearn.yaml --seeds 0 1 2 3 4 \\
        --sources runs/seeds/umls_fedlu --out runs/unlearn_seeds --json docs/results/fedlu/unlearn/seeds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)

ROWS = (("forget MRR", ("forget", "mrr")), ("forget H@10", ("forget", "hits@10")), ("test MRR", ("test", "mrr")),
        ("avatar forget MRR", ("forget_global", "mrr")), ("avatar test MRR", ("test_global", "mrr")),
        ("MIA AUC", ("mia_auc",)), ("triples ranked", ("forgotten",)), ("seconds", ("seconds",)),
        ("rounds trained", ("rounds",)))


def run(cmd: list[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        subprocess.run([sys.executable, "-m", "lightning_fedkg.cli", *cmd], check=True, stdout=f, stderr=f, cwd=REPO)


def value(block: dict, path: tuple[str, ...]):
    for key in path:
        if block is None:
            return None
        block = block.get(key)
    return block


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--sources", help="folder of the source runs seed_<S> (default: OUT/sources)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    out = Path(args.out)
    sources = Path(args.sources) if args.sources else out / "sources"
    results = {}
    for seed in args.seeds:
        common = ["-c", args.config, f"seed={seed}", "trainer.progress_bar=false", *args.overrides]
        source = sources / f"seed_{seed}"
        if not (source / "metrics.json").is_file():
            run(["fit", *common, "--out", str(source)], source.with_suffix(".log"))
        target = out / f"seed_{seed}"
        if not (target / "metrics.json").is_file():
            run(["unlearn", *common, "--from", str(source), "--out", str(target)], target.with_suffix(".log"))
        results[seed] = json.loads((target / "metrics.json").read_text())
        # The source's own facts: did it stop by early stopping (converged) or at the cap?
        src = json.loads((source / "metrics.json").read_text())
        results[seed]["before"]["rounds"] = src.get("rounds")
        results[seed]["source"] = {k: src.get(k) for k in ("rounds", "best_round")}
        results[seed]["source"]["distillation_on"] = {
            k: (src.get("distillation") or {}).get(k) for k in ("local_on_round", "global_on_round")}
        print(f"seed {seed}: source {results[seed]['source']}, budget {results[seed].get('budget')}", flush=True)

    summary = {}
    print(f"{'':<22}" + "".join(f"{stage:>22}" for stage in ("before", "after", "retrain")))
    for label, path in ROWS:
        cells, summary[label] = [], {}
        for stage in ("before", "after", "retrain"):
            values = [value(results[s].get(stage), path) for s in args.seeds]
            values = [float(v) for v in values if v is not None]
            if not values:
                cells.append(f"{'-':>22}")
                continue
            mean = statistics.fmean(values)
            std = statistics.stdev(values) if len(values) > 1 else 0.0
            summary[label][stage] = {"mean": mean, "std": std, "per_seed": values}
            cells.append(f"{mean:>14.4f} ± {std:.4f}")
        print(f"{label:<22}" + "".join(cells))
    if args.json:
        measure.write_json(args.json, {
            "config": args.config, "seeds": args.seeds, "overrides": args.overrides, "summary": summary,
            "per_seed": {s: {"source": results[s]["source"], "budget": results[s].get("budget"),
                             "decay_val_mrr": {e["name"]: e.get("decay_val_mrr") for e in results[s]["after"]["clients"]}}
                         for s in args.seeds}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
