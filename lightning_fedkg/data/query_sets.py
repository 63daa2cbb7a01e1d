"""FedCQA's query sets for a federation, built once and cached on disk.

Hu et al., "FedCQA: Answering Complex Queries on Multi-Source Knowledge Graphs via
Federated Learning" (§5.1; REFERENCE §6.2, §7.4): every client gets *in-graph* train,
valid and test queries sampled on its own graphs (local ids), and the federation a
*cross-graph* test set sampled on the union of the clients' graphs (global ids) whose
queries use relations of at least two clients. Counts follow the paper: a per-type count
for the whole graph divided by the number of clients for in-graph sets
(:class:`QuerySettings`).

Each set is cached under ``cache_dir`` in a file named by a SHA-256 of the graph's triples
and every setting it depends on, so a second build with the same data and settings only
loads files, and any change (data, counts, seed, types) builds anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from lightning_fedkg.atomic import write_atomic
from lightning_fedkg.data.queries import (
    STRUCTURES,
    QuerySet,
    build_query_set,
    relation_owners,
    spans_owners,
    split_graphs,
    union_split_graphs,
)
from lightning_fedkg.seeding import derive_seed

__all__ = ["QuerySettings", "federated_query_sets", "SAMPLER_VERSION"]

log = logging.getLogger("lightning_fedkg")

#: Part of every cache key: bump it when sampling or answering changes what a set holds.
SAMPLER_VERSION = 1


@dataclass
class QuerySettings:
    """``types``: evaluated (valid, test, cross-graph); ``train_types``: trained on.
    ``train_per_type`` and ``eval_per_type``: queries per structure for the whole graph
    (in-graph sets get them divided by the number of clients; KGReasoning's FB15k-237
    figures are 149,689 and 5,000); ``cross_per_type``: cross-graph test queries per
    structure (1p has none: one relation cannot span two clients)."""

    types: tuple[str, ...] = ("1p", "2p", "3p", "2i", "3i", "ip", "pi", "2u", "up")
    #: trained on (BetaE's release trains on these five; ip, pi, 2u, up test generalisation)
    train_types: tuple[str, ...] = ("1p", "2p", "3p", "2i", "3i")
    train_per_type: int = 149_689
    eval_per_type: int = 5_000
    cross_per_type: int = 5_000
    seed: int = 0


def _digest(triples: dict[str, Tensor], extra: dict) -> str:
    h = hashlib.sha256()
    for split in ("train", "valid", "test"):
        h.update(triples[split].to(torch.int64).contiguous().numpy().tobytes())
        h.update(b"|")
    h.update(json.dumps(extra, sort_keys=True).encode())
    return h.hexdigest()[:32]


def _save(qs: QuerySet, path: Path) -> None:
    state = {k: v for k, v in vars(qs).items() if isinstance(v, Tensor)}
    write_atomic(path, lambda f: torch.save({"structure": qs.structure, **state}, f))


def _load(path: Path) -> QuerySet:
    state = torch.load(path, weights_only=True)
    return QuerySet(state.pop("structure"), **state)


def _cached(cache_dir: Path | None, key: str, build) -> tuple[QuerySet, bool]:
    path = None if cache_dir is None else Path(cache_dir) / f"{key}.pt"
    if path is not None and path.is_file():
        return _load(path), True
    qs = build()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _save(qs, path)
    return qs, False


def federated_query_sets(fkg, settings: QuerySettings | None = None, cache_dir: str | Path | None = None) -> dict:
    """``{"clients": [{split: {type: QuerySet}}], "cross": {type: QuerySet}}`` for ``fkg``.

    In-graph sets are in each client's local ids, the cross-graph set in global ids.
    Progress (one line per set, with its size and seconds) goes to the ``lightning_fedkg``
    logger.
    """
    settings = settings or QuerySettings()
    unknown = [t for t in (*settings.types, *settings.train_types) if t not in STRUCTURES]
    if unknown:
        raise ValueError(f"unknown query types {unknown}; valid: {', '.join(STRUCTURES)}")
    n = len(fkg.clients)
    counts = {"train": max(1, settings.train_per_type // n), "valid": max(1, settings.eval_per_type // n),
              "test": max(1, settings.eval_per_type // n)}
    out: dict = {"clients": [], "cross": {}}
    for k, kg in enumerate(fkg.clients):
        triples = {s: kg.triples(s) for s in ("train", "valid", "test")}
        graphs = split_graphs(triples, kg.num_entities, kg.num_relations)
        sets: dict = {}
        for split, count in counts.items():
            for name in settings.train_types if split == "train" else settings.types:
                extra = {"v": SAMPLER_VERSION, "type": name, "split": split, "count": count, "seed": settings.seed,
                         "client": k, "entities": kg.num_entities, "relations": kg.num_relations}
                generator = torch.Generator().manual_seed(derive_seed(settings.seed, f"client_{k}", f"queries:{split}:{name}"))
                start = time.perf_counter()
                qs, hit = _cached(cache_dir, _digest(triples, extra),
                                  lambda: build_query_set(name, graphs, split, count, generator))
                log.info("queries: client_%d %s %s: %d%s in %.1f s", k, split, name, len(qs),
                         " (cached)" if hit else "", time.perf_counter() - start)
                sets.setdefault(split, {})[name] = qs
        out["clients"].append(sets)
    owners = relation_owners(fkg)
    union = None
    parts = [{s: torch.stack([ent[t[:, 0]], rel[t[:, 1]], ent[t[:, 2]]], 1)
              for s, t in ((s, kg.triples(s)) for s in ("train", "valid", "test"))}
             for kg, ent, rel in zip(fkg.clients, fkg.entity_index, fkg.relation_index)]
    triples = {s: torch.cat([p[s] for p in parts]) for s in ("train", "valid", "test")}  # global ids
    for name in settings.types:
        if name == "1p":
            continue
        extra = {"v": SAMPLER_VERSION, "type": name, "split": "cross", "count": settings.cross_per_type,
                 "seed": settings.seed, "owners": owners.tolist()}
        generator = torch.Generator().manual_seed(derive_seed(settings.seed, "cross", f"queries:{name}"))

        def build(name=name, generator=generator):
            nonlocal union
            union = union or union_split_graphs(fkg)
            return build_query_set(name, union, "test", settings.cross_per_type, generator,
                                   keep=spans_owners(STRUCTURES[name], owners))

        start = time.perf_counter()
        qs, hit = _cached(cache_dir, _digest(triples, extra), build)
        log.info("queries: cross-graph %s: %d%s in %.1f s", name, len(qs), " (cached)" if hit else "",
                 time.perf_counter() - start)
        out["cross"][name] = qs
    out["settings"] = asdict(settings)
    return out
