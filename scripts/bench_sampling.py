#!/usr/bin/env python
"""Milliseconds per training batch of one client's data pipeline (negative sampling).

Loads a config's federated data (default: ``configs/fedlu/fb15k237_r10_fedlu.yaml``, shared
negatives filtered against the train triples), builds client ``--client``'s DataModule and
times one full epoch of its train loader, once per mask implementation of filtered shared
negatives: ``sorted`` (binary search in sorted (row, entity) keys) and ``dense`` (a
``[batch, entities]`` table of known answers and one gather; the default below
``DENSE_MASK_ELEMENTS``), under ``--threads`` torch threads. Nothing is trained.

    python scripts/bench_sampling.py --threads 1
    python scripts/bench_sampling.py --threads 2 --client 4 data.name=/path/to/FB15k-237-R10
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # runnable without installing the package
    sys.path.insert(0, str(REPO))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-c", "--config", default=str(REPO / "configs" / "fedlu" / "fb15k237_r10_fedlu.yaml"))
    parser.add_argument("--client", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    logging.disable(logging.WARNING)
    import lightning_fedkg.data.datamodule as datamodule
    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.builders import build_datamodule

    cfg = load_config(args.config, args.overrides)
    kg = load_federated_kg(cfg).clients[args.client]
    for label, limit in (("sorted", 0), ("dense", 2**26)):
        datamodule.DENSE_MASK_ELEMENTS = limit
        dm = build_datamodule(kg, cfg, seed=0)
        list(dm.train_dataloader())  # builds the indexes
        start = time.perf_counter()
        batches = sum(1 for _ in dm.train_dataloader())
        ms = (time.perf_counter() - start) / batches * 1000
        print(f"client {args.client} ({kg.num_entities} entities), {args.threads} thread(s), {label:>6}: "
              f"{ms:.2f} ms per batch ({batches} batches of {cfg.train.batch_size} x {cfg.train.num_negatives})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
