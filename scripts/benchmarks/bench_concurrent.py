#!/usr/bin/env python
"""Run N copies of one ``fedkg fit`` at the same time and report each one's speed.

Measures what CPU oversubscription costs: every copy is a separate ``fedkg fit`` process
(its own run directory under ``--work``), all started together. Per copy it prints

* ``wall s``: the whole command, imports, data loading and the final test included;
* ``rounds/s``: the round loop alone, from the wall-clock stamps of the per-round scalars
  in the run's TensorBoard ``tb/server`` events (first to last logged round); ``-`` if the
  events are missing (e.g. a single-KG config);

then the wall time until the last copy finished and the machine's load average before
and after (other jobs on the machine inflate every figure).

    python scripts/benchmarks/bench_concurrent.py --copies 1 -- federated.rounds=10 federated.eval_every=10
    python scripts/benchmarks/bench_concurrent.py --copies 2 -- federated.rounds=10 federated.eval_every=10
    python scripts/benchmarks/bench_concurrent.py --copies 2 --threads 1 -- federated.rounds=10 federated.eval_every=10
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)
DEFAULT_CONFIG = REPO / "configs" / "fede" / "umls_fede.yaml"


def round_rate(run_dir: Path) -> float | None:
    """Rounds per second of the round loop, from ``tb/server``'s per-round scalar stamps."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    server = run_dir / "tb" / "server"
    if not server.is_dir():
        return None
    events = EventAccumulator(str(server))
    events.Reload()
    if "comm/bytes" not in events.Tags().get("scalars", []):
        return None
    stamps = sorted((e.step, e.wall_time) for e in events.Scalars("comm/bytes"))
    if len(stamps) < 2 or stamps[-1][1] <= stamps[0][1]:
        return None
    return (stamps[-1][0] - stamps[0][0]) / (stamps[-1][1] - stamps[0][1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=2, help="processes started together")
    parser.add_argument("-c", "--config", default=str(DEFAULT_CONFIG), help="fedkg config")
    parser.add_argument("--threads", type=int, help="trainer.threads for every copy (default: torch's)")
    parser.add_argument("--work", help="parent of the run directories (default: a temporary folder)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides for every copy (after --)")
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_concurrent_"))
    work.mkdir(parents=True, exist_ok=True)
    taken = [str(work / f"copy{i}") for i in range(args.copies) if (work / f"copy{i}").exists()]
    if taken:
        # fedkg fit would resume (or refuse) these runs instead of training from scratch.
        parser.error(f"run directories exist already: {', '.join(taken)}; choose another --work")
    overrides = list(args.overrides) + ([f"trainer.threads={args.threads}"] if args.threads else [])
    print(f"{args.copies} x fedkg fit -c {args.config} {' '.join(overrides)}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    start = time.perf_counter()
    procs = []
    for i in range(args.copies):
        run_dir = work / f"copy{i}"
        log = open(work / f"copy{i}.log", "w")
        cmd = [sys.executable, "-m", "lightning_fedkg.cli", "fit", "-c", args.config, *overrides,
               "--out", str(run_dir)]
        procs.append((run_dir, log, subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
    # Poll all of them: waiting on one at a time would stamp an early finisher late.
    walls: dict[int, float] = {}
    while len(walls) < len(procs):
        for i, (_, log, proc) in enumerate(procs):
            if i not in walls and proc.poll() is not None:
                walls[i] = time.perf_counter() - start
                log.close()
        time.sleep(0.05)
    total = time.perf_counter() - start
    for run_dir, _, proc in procs:
        if proc.returncode != 0:
            print(f"{run_dir} failed (exit {proc.returncode}); see {run_dir}.log", file=sys.stderr)
            return 1

    print(f"{'copy':<6}{'wall s':>9}{'rounds/s':>10}")
    for i, (run_dir, _, _) in enumerate(procs):
        rate = round_rate(run_dir)
        print(f"{i:<6}{walls[i]:>9.1f}{(f'{rate:.2f}' if rate else '-'):>10}")
    print(f"all done after {total:.1f} s")
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
