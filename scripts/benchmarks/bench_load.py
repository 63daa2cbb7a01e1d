#!/usr/bin/env python
"""Seconds to load a KG folder and split it among clients by relation (FedE's procedure).

Times ``load_kg(FOLDER)`` and ``partition_by_relation(kg, CLIENTS)`` ``--repeat`` times in
fresh processes (so no cache or warm allocator helps a later repeat) and prints each run,
the medians and the peak resident memory of a run; ``--json-out`` writes them. The digest of
the clients' triples and entity indexes shows that two versions split alike. To time an older
version of the package, put its checkout first on ``PYTHONPATH`` (the script imports
whatever ``lightning_fedkg`` it finds there first)::

    python -m lightning_fedkg.cli data synth --entities 300000 --relations 200 --triples 3260000 --out /tmp/synth-300k
    python scripts/benchmarks/bench_load.py /tmp/synth-300k --repeat 3
    git archive <commit> | tar -x -C /tmp/old && PYTHONPATH=/tmp/old python scripts/benchmarks/bench_load.py /tmp/synth-300k
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ONE_RUN = r"""
import hashlib, json, logging, resource, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]))
logging.disable(logging.WARNING)
from lightning_fedkg.data import load_kg
from lightning_fedkg.data.partition import partition_by_relation
start = time.perf_counter()
kg = load_kg(sys.argv[1])
loaded = time.perf_counter()
fed = partition_by_relation(kg, int(sys.argv[2]), seed=12345)
split = time.perf_counter()
digest = hashlib.sha256()
for c, client in enumerate(fed.clients):
    for name in ("train", "valid", "test"):
        digest.update(client.triples(name).numpy().tobytes())
    digest.update(fed.entity_index[c].numpy().tobytes())
print(json.dumps({"load_s": loaded - start, "split_s": split - loaded, "total_s": split - start,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "triples": sum(kg.stats()[s] for s in ("train", "valid", "test")),
                  "client_entities": [c.num_entities for c in fed.clients], "digest": digest.hexdigest()[:16],
                  "package": __import__("lightning_fedkg").__file__}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="a KG folder (e.g. written by fedkg data synth)")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="runs, each in a fresh process (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json-out")
    args = parser.parse_args()
    runs = []
    for _ in range(args.repeat):
        # Run outside the repository: "python -c" puts the working directory first on sys.path,
        # which would shadow an older checkout named on PYTHONPATH.
        command = [sys.executable, "-c", ONE_RUN, str(Path(args.folder).resolve()), str(args.clients),
                   str(args.threads)]
        done = subprocess.run(command, check=True, capture_output=True, text=True, cwd=tempfile.gettempdir())
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        run = runs[-1]
        print(f"load {run['load_s']:7.2f} s  split {run['split_s']:7.2f} s  total {run['total_s']:7.2f} s  "
              f"peak RSS {run['peak_rss_mib']:,.0f} MiB  digest {run['digest']}", flush=True)
    summary = {key: statistics.median(r[key] for r in runs) for key in ("load_s", "split_s", "total_s")}
    print(f"median of {len(runs)}: " + "  ".join(f"{k} {v:.2f}" for k, v in summary.items())
          + f"  ({runs[0]['triples']:,} triples, clients of {runs[0]['client_entities']} entities; "
            f"package {Path(runs[0]['package']).parent})")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"folder": args.folder, "clients": args.clients,
                                                   "threads": args.threads, "median": summary, "runs": runs},
                                                  indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
