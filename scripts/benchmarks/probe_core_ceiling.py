#!/usr/bin/env python
"""How much two single-thread clients gain from running at once on this machine's cores.

Runs ``scripts/benchmarks/bench_step.py`` (one client's training batches, one thread) three ways, in
this order, ``--repeats`` times:

* ``alone``: one copy pinned to the first core;
* ``beside``: two copies at once, pinned to the first and the second core;
* ``shared``: two copies at once, both pinned to the first core (the control: one core
  time-sliced, which should take twice as long per batch).

It prints the milliseconds per batch of each copy (``bench_step``'s ``lightning`` figure:
``Party.fit``, as in a federated round) and the ceiling that ``beside`` puts on running
clients side by side: ``2 x alone / beside``. A ceiling below 2 means a worker slows down
when another works on the other core (shared caches, memory bandwidth, a hypervisor that
places both virtual cores on one physical core), whatever the scheduling of the clients.

    python scripts/benchmarks/probe_core_ceiling.py -c configs/fede/fb15k237_fed10_fede.yaml --client 1 \\
        data.name=../shared/data/FB15k-237-Fed10 model.dim=32
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)
BENCH_STEP = Path(__file__).with_name("bench_step.py")


def copies(cores: list[int], args, work: Path, tag: str) -> list[float]:
    """Start one bench_step.py per entry of ``cores`` (pinned there) at once; their ms per batch."""
    procs, outs = [], []
    for i, core in enumerate(cores):
        out = work / f"{tag}_{i}.json"
        cmd = [sys.executable, str(BENCH_STEP), "-c", args.config, "--client",
               str(args.client), "--batches", str(args.batches), "--threads", "1", "--json-out", str(out),
               *args.overrides]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                      preexec_fn=lambda c=core: os.sched_setaffinity(0, [c])))
        outs.append(out)
    for p in procs:
        _, err = p.communicate()
        if p.returncode:
            raise SystemExit(f"bench_step.py failed:\n{err[-2000:]}")
    return [json.loads(o.read_text())["ms_per_batch"]["lightning"] for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-c", "--config", default=str(REPO / "configs" / "fede" / "fb15k237_fed10_fede.yaml"))
    parser.add_argument("--client", type=int, default=1)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("overrides", nargs="*", help="config overrides (key=value), passed to bench_step.py")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("needs two cores")
    a, b = cores[:2]
    got: dict[str, list[float]] = {"alone": [], "beside": [], "shared": []}
    with tempfile.TemporaryDirectory() as work:
        for r in range(args.repeats):
            for tag, pins in (("alone", [a]), ("beside", [a, b]), ("shared", [a, a])):
                ms = copies(pins, args, Path(work), f"{tag}{r}")
                got[tag].extend(ms)
                print(f"repeat {r} {tag:6s}: " + " / ".join(f"{m:.3f}" for m in ms) + " ms per batch", flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"median ms per batch: alone {med['alone']:.3f}, beside {med['beside']:.3f} "
          f"({med['beside'] / med['alone']:.2f}x alone), shared one core {med['shared']:.3f} "
          f"({med['shared'] / med['alone']:.2f}x alone); two clients side by side can be at most "
          f"{2 * med['alone'] / med['beside']:.2f}x faster than one after the other on this machine; "
          f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
