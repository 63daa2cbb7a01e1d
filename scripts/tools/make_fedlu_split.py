#!/usr/bin/env python
"""Write a federated split of one KG in FedLU's folder layout (the official FedLU code's input).

FedLU (Zhu et al., WWW 2023) reads ``<out>/<k>/{entities,relations}.dict`` and
``{train,valid,test,unlearn}.txt`` per client. This script builds such a folder from any KG
``load_kg`` reads, with this library's partitioners (``--partition relation`` is the R-k
split: relations dealt out at random, each client's triples split 80:10:10 with every
valid/test entity and relation kept in its train split; ``random``; ``clustered`` = C-k)
and an ``unlearn.txt`` of ``--unlearn-fraction`` of each client's train triples, drawn with
FedLU's rule (a triple is taken only if its entities and relation keep a retained triple;
:func:`lightning_fedkg.methods.fedlu.phase.sample_forget_set`). Both sides of the
side-by-side in docs/results/fedlu.md then read the same files: ``fedkg`` through
``data.name=<out>``, the official code through ``scripts/reference/bench_official_fedlu.py --data <out>``.

Deterministic: a function of the input KG and the arguments. Example::

    python scripts/tools/make_fedlu_split.py --kg umls --clients 3 --seed 12345 --out data/umls-R3
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

import torch

from lightning_fedkg.data import load_federated, write_fedlu_folder
from lightning_fedkg.measure import write_json
from lightning_fedkg.methods.fedlu.phase import sample_forget_set


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kg", required=True, help="bundled name (umls, nations, kinship) or a KG folder")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--partition", default="relation", choices=["relation", "random", "clustered"])
    ap.add_argument("--seed", type=int, default=12345)
    ap.add_argument("--unlearn-fraction", type=float, default=0.01, help="FedLU's is 1%%; 0 writes no unlearn.txt")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--stats", type=Path, default=None,
                    help="also write the per-client sizes here (not inside --out: the official "
                         "code takes every entry of that folder for a client)")
    args = ap.parse_args(argv)
    fed = load_federated(args.kg, num_clients=args.clients, seed=args.seed, partition=args.partition)
    extra = {}
    if args.unlearn_fraction > 0:
        gen = torch.Generator().manual_seed(args.seed + 1)
        extra["unlearn"] = [sample_forget_set(kg.triples("train"), args.unlearn_fraction, gen,
                                              kg.num_entities, kg.num_relations) for kg in fed.clients]
    write_fedlu_folder(fed, args.out, extra)
    arguments = sys.argv[1:] if argv is None else argv
    stats = {"command": "python scripts/tools/make_fedlu_split.py " + shlex.join(arguments),
             "clients": [{**row, **{s: len(t[c]) for s, t in extra.items()}} for c, row in enumerate(fed.stats())]}
    if args.stats:
        write_json(args.stats, stats, indent=2)
    for row in stats["clients"]:
        print(row)
    return stats


if __name__ == "__main__":
    main()
