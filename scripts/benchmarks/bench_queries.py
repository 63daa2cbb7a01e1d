#!/usr/bin/env python
"""Build FedCQA's query sets for a federation and time them (FedCQA §5.1): FB15k-237 in 3
clients is ~750k train and ~70k evaluation queries, which should take at most 5 minutes on a
2-core CPU.

    python scripts/benchmarks/bench_queries.py --data ../shared/data/FB15k-237 --clients 3 --threads 2
    python scripts/benchmarks/bench_queries.py --data umls --clients 3 --train 9000 --eval 900 --cross 300

Prints one line per set (client, split, type: size and seconds), then the totals; a second
run with the same ``--cache`` only loads files. ``--json-out`` writes the counts and times.
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from lightning_fedkg.data import load_federated
from lightning_fedkg.measure import write_json
from lightning_fedkg.methods.fedcqa.query_sets import QuerySettings, federated_query_sets


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="../shared/data/FB15k-237")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--partition-seed", type=int, default=12345)
    p.add_argument("--train", type=int, default=149_689, help="train queries per type, whole graph")
    p.add_argument("--eval", type=int, default=5_000, help="valid and test queries per type, whole graph")
    p.add_argument("--cross", type=int, default=5_000, help="cross-graph test queries per type")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--cache", default=None, help="cache folder (default: none, always build)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("lightning_fedkg").setLevel(logging.INFO)
    fkg = load_federated(args.data, num_clients=args.clients, seed=args.partition_seed, partition="relation")
    settings = QuerySettings(train_per_type=args.train, eval_per_type=args.eval, cross_per_type=args.cross,
                             seed=args.seed)
    start = time.perf_counter()
    sets = federated_query_sets(fkg, settings, args.cache)
    seconds = time.perf_counter() - start
    sizes = {split: sum(len(qs) for c in sets["clients"] for qs in c[split].values())
             for split in ("train", "valid", "test")}
    sizes["cross"] = sum(len(qs) for qs in sets["cross"].values())
    print(f"\n{args.data}, {args.clients} clients: {sizes} queries in {seconds:.1f} s "
          f"({torch.get_num_threads()} threads)")
    result = {"data": args.data, "clients": args.clients, "settings": vars(args), "sizes": sizes, "seconds": seconds}
    if args.json_out:
        write_json(args.json_out, result)
    return result


if __name__ == "__main__":
    main()
