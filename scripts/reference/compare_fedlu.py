#!/usr/bin/env python
"""Side-by-side of lightning_fedkg's FedLU and the official FedLU code from their benchmark JSONs.

Reads the JSON files that ``scripts/benchmarks/bench_fedlu.py --json-out`` (ours; its ``fedlu`` entry)
and ``scripts/reference/bench_official_fedlu.py --out`` (the official code) wrote for runs on the same
split with the same hyperparameters and rounds, and prints, as mean ± sample standard
deviation over the runs of each side:

* training seconds per round (wall and CPU seconds; the official code's round is each
  client's ``train``, ours is ``train_round``: download, local epochs, upload, aggregation);
* seconds of one validation (both sides: local and avatar) and of the final test
  (ours: local and avatar; the official code: local only, after reloading its checkpoints);
* peak resident memory of the process (the official code: ``VmHWM`` of ``fedlu.py``);
* the final test of the local embeddings (MRR, Hits@1, Hits@10), the avatar's MRR where
  the side reports it, and the validation MRR curve of the local side per number of
  trained rounds (the official code validates after iteration ``k``, i.e. after ``k + 1``
  rounds).

    python scripts/reference/compare_fedlu.py --ours runs/ours_s*.json --official runs/official_h*.json \\
        --json-out cmp.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from lightning_fedkg.measure import write_json


def mean_std(values: list[float]) -> dict:
    values = [float(v) for v in values if v is not None]
    if not values:
        return {"mean": None, "std": None, "n": 0}
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": statistics.fmean(values), "std": std, "n": len(values)}


def ours_row(path: Path) -> dict:
    record = json.loads(path.read_text())
    run = next(r for r in record["results"] if r["strategy"] == "fedlu")
    val = [e for e in run["evaluations"] if e["split"] == "val"]
    test = [e for e in run["evaluations"] if e["split"] == "test"]
    return {
        "file": str(path),
        "train_s": run["seconds_per_round"],
        "train_cpu_s": run.get("cpu_seconds_per_round"),
        "valid_s": statistics.fmean(e["seconds"] for e in val) if val else None,
        "test_s": test[-1]["seconds"] if test else None,
        "peak_mib": run["peak_rss_mib"],
        "mrr": run["test"]["mrr"], "hits@1": run["test"]["hits@1"], "hits@10": run["test"]["hits@10"],
        "avatar_mrr": (run.get("test_global") or {}).get("mrr"),
        "valid_curve": {int(e["round"]): e["mrr"] for e in val},
        "rounds": len(run["rounds"]),
    }


def official_row(path: Path) -> dict:
    record = json.loads(path.read_text())
    if record.get("final_test_weighted") is None:
        raise SystemExit(f"{path}: the official run has no final test (stopped early?)")
    rounds = [r for r in record["rounds"] if r["complete"]]
    valid = [r for r in rounds if r.get("valid_s") is not None]
    final = record["final_test_weighted"]
    return {
        "file": str(path),
        "train_s": statistics.fmean(r["train_s"] for r in rounds),
        "train_cpu_s": statistics.fmean(r["train_cpu_s"] for r in rounds),
        "valid_s": statistics.fmean(r["valid_s"] for r in valid) if valid else None,
        "test_s": (record.get("final_test") or {}).get("total_with_reload_s"),
        "peak_mib": record["memory"]["child_peak_rss_mib_vmhwm"],
        "mrr": final["MRR"], "hits@1": final["HITS@1"], "hits@10": final["HITS@10"],
        "avatar_mrr": None,  # the official code tests the local embeddings only
        "valid_curve": {int(v["iter"]) + 1: v["local"] for v in record["valid_weighted_mrr"]},
        "rounds": len(rounds),
    }


FIELDS = [("train_s", "training, s / round (wall)", 1), ("train_cpu_s", "training, CPU s / round", 1),
          ("valid_s", "one validation, s", 2), ("test_s", "final test, s", 2), ("peak_mib", "peak memory, MiB", 0),
          ("mrr", "test MRR (local)", 4), ("hits@1", "test Hits@1", 4), ("hits@10", "test Hits@10", 4),
          ("avatar_mrr", "test MRR (avatar)", 4)]


def fmt(stat: dict, digits: int) -> str:
    if stat["mean"] is None:
        return "–"
    return f"{stat['mean']:.{digits}f} ± {stat['std']:.{digits}f}"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ours", nargs="+", type=Path, required=True)
    ap.add_argument("--official", nargs="+", type=Path, required=True)
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args(argv)
    sides = {"official": [official_row(p) for p in args.official], "ours": [ours_row(p) for p in args.ours]}
    summary = {side: {key: mean_std([r[key] for r in rows]) for key, _, _ in FIELDS} for side, rows in sides.items()}
    for side, rows in sides.items():
        points = sorted({k for r in rows for k in r["valid_curve"]})
        summary[side]["valid_curve"] = {k: mean_std([r["valid_curve"].get(k) for r in rows]) for k in points}
        summary[side]["runs"] = len(rows)
        summary[side]["rounds"] = sorted({r["rounds"] for r in rows})
    print(f"| | official FedLU ({len(sides['official'])} runs) | lightning_fedkg `fedlu` ({len(sides['ours'])} runs) |")
    print("| --- | --- | --- |")
    for key, label, digits in FIELDS:
        print(f"| {label} | {fmt(summary['official'][key], digits)} | {fmt(summary['ours'][key], digits)} |")
    for side in sides:
        curve = ", ".join(f"{k}: {fmt(v, 3)}" for k, v in summary[side]["valid_curve"].items())
        print(f"validation MRR (local) by rounds trained, {side}: {curve}")
    out = {"summary": summary, "runs": sides}
    if args.json_out:
        write_json(args.json_out, out, indent=2)
        print(f"written {args.json_out}")
    return out


if __name__ == "__main__":
    main()
