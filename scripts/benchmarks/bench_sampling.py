#!/usr/bin/env python
"""Milliseconds per training batch of one client's data pipeline (negative sampling).

Loads a config's federated data (default: ``configs/fedlu/fb15k237_r10_fedlu.yaml``, shared
negatives filtered against the train triples), builds client ``--client``'s DataModule and
times one full epoch of its train loader (``--batches`` at most) once per way of finding
the train triples among the negatives (``train.filter_method``-like constructor argument
``filter_method``): ``index`` (the batch's few known answers from the train CSR index,
the CPU default, CPU only) and ``search`` (every candidate looked up in the sorted train keys with
fixed shapes, what an accelerator runs: no host synchronisation), under ``--threads``
torch threads and on ``--device``. The runs are interleaved ``--repeats`` times, so a busy
moment of the machine does not land on one method only. Nothing is trained.

    python scripts/benchmarks/bench_sampling.py --threads 1
    python scripts/benchmarks/bench_sampling.py --threads 1 -c configs/fede/fb15k237_fed3_fede.yaml --client 0
    python scripts/benchmarks/bench_sampling.py --threads 1 train.negative_mode=per_triple
    python scripts/benchmarks/bench_sampling.py --device cuda
    python scripts/benchmarks/bench_sampling.py --threads 1 --batches 120 --repeats 3
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from itertools import islice

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", default=str(REPO / "configs" / "fedlu" / "fb15k237_r10_fedlu.yaml"))
    parser.add_argument("--client", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    from lightning_fedkg.builders import build_datamodule
    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.party import load_federated_kg

    cfg = load_config(args.config, args.overrides)
    kg = load_federated_kg(cfg).clients[args.client]
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    for _ in range(args.repeats):
        for method in ("index", "search") if args.device == "cpu" else ("search",):  # index: CPU only
            dm = build_datamodule(kg, cfg, seed=0)
            dm.sampler.filter_method = method
            dm.to_device(args.device)
            list(islice(dm.train_dataloader(), 2))  # builds the indexes and the device copies
            sync()
            start = time.perf_counter()
            batches = sum(1 for _ in islice(dm.train_dataloader(), args.batches))
            sync()
            ms = (time.perf_counter() - start) / batches * 1000
            print(f"client {args.client} ({kg.num_entities} entities), {args.threads} thread(s), {args.device}, "
                  f"{cfg.train.negative_mode}, {method}: {ms:.3f} ms per batch "
                  f"({batches} batches of {cfg.train.batch_size} x {cfg.train.num_negatives})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
