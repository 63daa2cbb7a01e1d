#!/usr/bin/env python
"""Build a folder of multi-source KGs with overlapping entities (FKGE's setting) from one KG.

FKGE (Peng et al., CIKM 2021) federates independently owned KGs that share some entities;
its 11 linked-open-data KGs are not available offline, so this script makes stand-ins by
cutting one KG into ``--sources`` KGs by relation
(:func:`lightning_fedkg.methods.fkge.multisource.split_into_sources`: relations shuffled and
cut into groups, each source gets all triples of its group, split 90:5:5 train/valid/test
per source as OpenKE/FKGE do, every valid/test entity and relation kept in that source's train by the
FedE/FedLU rejection rule; nothing is dropped). Sources share entities (same name = same
entity, the alignment key), not relations unless ``--shared-relations`` > 0.

Output (read back by ``lightning_fedkg.methods.fkge.multisource.load_multisource_folder``)::

    <out>/<kg name>-src<k>/{train,valid,test}.txt   head<TAB>relation<TAB>tail (original names)
    <out>/stats.json                                 per-source sizes, pairwise shared counts
    <out>/README.md                                  the command and the tables

Deterministic: the output is a function of the input files and the arguments (one seeded
``torch.Generator``). Examples (the data folders are not in the repository; regenerate)::

    python scripts/tools/make_multisource.py --kg ../shared/data/FB15k-237 --sources 3 --seed 12345 \\
        --out data/FB15k-237-MS3
    python scripts/tools/make_multisource.py --kg ../shared/data/NELL-995 --sources 3 --seed 12345 \\
        --out data/NELL-995-MS3
    python scripts/tools/make_multisource.py --kg umls --sources 3 --seed 12345 --out data/umls-MS3

``--kg`` is a bundled name (umls, nations, kinship) or a folder ``load_kg`` reads (named
triples, also in ``raw/``, or OpenKE ``entity2id.txt`` ...; ``--format`` forces one).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from lightning_fedkg.data import load_kg
from lightning_fedkg.measure import write_json
from lightning_fedkg.methods.fkge.multisource import multisource_stats, split_into_sources, write_multisource_folder


def format_tables(stats: dict) -> str:
    """Markdown tables: per-source sizes, then pairwise shared entities (and relations if any)."""
    rows = stats["sources"]
    out = ["| source | entities | relations | train | valid | test |",
           "|---|---|---|---|---|---|"]
    out += [f"| {r['name']} | {r['entities']} | {r['relations']} | {r['train']} | {r['valid']} | {r['test']} |"
            for r in rows]
    kinds = [("shared_entities", "shared entities")]
    n = len(rows)
    if any(stats["shared_relations"][i][j] for i in range(n) for j in range(n) if i != j):
        kinds.append(("shared_relations", "shared relations"))
    for key, label in kinds:
        out += ["", f"| {label} | " + " | ".join(f"src{j}" for j in range(n)) + " |",
                "|---" * (n + 1) + "|"]
        out += [f"| src{i} | " + " | ".join(str(v) for v in stats[key][i]) + " |" for i in range(n)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kg", required=True, help="bundled name or folder of the KG to split")
    p.add_argument("--out", required=True, type=Path, help="output folder (created)")
    p.add_argument("--sources", type=int, default=3, help="number of sources K (default 3)")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--format", default="auto", help="load_kg fmt: auto, named, openke, ...")
    p.add_argument("--valid-frac", type=float, default=0.05)
    p.add_argument("--test-frac", type=float, default=0.05)
    p.add_argument("--shared-relations", type=float, default=0.0,
                   help="fraction of relations whose triples are dealt to all sources (default 0)")
    args = p.parse_args(argv)

    kg = load_kg(args.kg, fmt=args.format)
    sources = split_into_sources(kg, args.sources, seed=args.seed, valid_frac=args.valid_frac,
                                 test_frac=args.test_frac, shared_relations=args.shared_relations)
    write_multisource_folder(sources, args.out)
    stats = multisource_stats(sources)
    stats["input"] = {**kg.stats(), "removed_by_loader": kg.removed}
    stats["arguments"] = {"kg": str(args.kg), "sources": args.sources, "seed": args.seed,
                          "valid_frac": args.valid_frac, "test_frac": args.test_frac,
                          "shared_relations": args.shared_relations}
    write_json(args.out / "stats.json", stats)
    tables = format_tables(stats)
    dropped = {s: sum(v.values()) for s, v in kg.removed.items() if sum(v.values())}
    inp = stats["input"]
    header = (f"input {kg.name}: {inp['entities']} entities, {inp['relations']} relations, "
              f"{inp['train']}/{inp['valid']}/{inp['test']} train/valid/test"
              + (f" (loader's input policy dropped {dropped})" if dropped else ""))
    command = "python scripts/tools/make_multisource.py " + " ".join(
        shlex.quote(a) for a in (sys.argv[1:] if argv is None else argv))
    (args.out / "README.md").write_text(
        f"# {args.out.name}\n\nMulti-source KGs made by\n\n    {command}\n\n{header}\n\n{tables}\n")
    print(header)
    print(tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
