#!/usr/bin/env python
"""Compare two trees of run directories value by value: is a refactor bit-identical?

For every ``metrics.json`` under OLD, the file at the same relative path under NEW must hold
the same keys and exactly equal values (floats compared with ``==``), except wall-clock
fields (``seconds*``, ``*_seconds``, ``*_s``, ``*_at``, ``wall_s``), which differ between any
two runs. Exits 1 if any run differs or is missing. Typical use, with ``bench_seeds.py``
run on the old and the new checkout into two folders:

    python scripts/benchmarks/bench_seeds.py -c configs/fede/umls_fede.yaml --out runs/old trainer.threads=1
    (new checkout) python scripts/benchmarks/bench_seeds.py -c configs/fede/umls_fede.yaml \\
        --out runs/new trainer.threads=1
    python scripts/tools/compare_runs.py runs/old runs/new

FKGE draws its secret noise from the OS by default; compare it with
``federated.fkge.reproducible_noise=true`` on both sides.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def is_wall_clock(key: str) -> bool:
    return key == "wall_s" or key.startswith("seconds") or key.endswith(("_seconds", "_s", "_at"))


def flatten(value, prefix: str = "") -> dict:
    """``{"a.b.0": leaf}`` for every leaf of nested dicts and lists, wall-clock keys left out."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not is_wall_clock(k):
                out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix[:-1]: value}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    args = p.parse_args(argv)
    runs = sorted(args.old.rglob("metrics.json"))
    differ = 0
    for old in runs:
        rel = old.relative_to(args.old)
        new = args.new / rel
        if not new.is_file():
            print(f"missing  {rel}")
            differ += 1
            continue
        a, b = flatten(json.loads(old.read_text())), flatten(json.loads(new.read_text()))
        keys = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
        if keys:
            differ += 1
            print(f"differs  {rel}: {len(keys)} values, e.g. {', '.join(keys[:5])}")
        else:
            print(f"same     {rel} ({len(a)} values)")
    print(f"{len(runs)} runs compared, {differ} differ")
    return 1 if differ or not runs else 0


if __name__ == "__main__":
    sys.exit(main())
