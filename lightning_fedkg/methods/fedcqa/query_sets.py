"""FedCQA's query sets for a federation, built once and cached on disk.

Hu et al., "FedCQA: Answering Complex Queries on Multi-Source Knowledge Graphs via
Federated Learning" (§5.1, Tables 1–2): every client gets *in-graph* train,
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
from lightning_fedkg.data.federated import present_ids
from lightning_fedkg.methods.fedcqa.queries import (
    STRUCTURES,
    QuerySet,
    anchors_and_relations,
    build_query_set,
    relation_owners,
    spans_owners,
    split_graphs,
    union_split_graphs,
)
from lightning_fedkg.seeding import derive_seed

__all__ = ["QuerySettings", "graph_query_sets", "cross_query_sets", "federated_query_sets", "query_stats",
           "SAMPLER_VERSION", "CACHE_REVISION", "QUERY_SETS", "BETAE_TYPES", "BETAE_TRAIN_TYPES", "PAPER_TYPES"]

log = logging.getLogger("lightning_fedkg")

#: Part of every set's key, which seeds its sampler and names its cache file: bumping it draws
#: every set anew. Bump it when the sampler's random draws change.
SAMPLER_VERSION = 2
#: Part of a cache file's name only: bump it when some sets change while the draws stay
#: those of SAMPLER_VERSION (3: a set the walks leave short is completed by enumeration).
CACHE_REVISION = 3

#: BetaE's release (KGReasoning): nine types evaluated, five trained on (ip, pi, 2u and up
#: test generalisation to unseen structures).
BETAE_TYPES = ("1p", "2p", "3p", "2i", "3i", "ip", "pi", "2u", "up")
BETAE_TRAIN_TYPES = ("1p", "2p", "3p", "2i", "3i")
#: The FedCQA authors' (their sampler, FedNGDB): eight types, no 3p, all trained on.
PAPER_TYPES = ("1p", "2p", "2i", "3i", "ip", "pi", "2u", "up")
#: ``task.query_set``: ``name -> (types, train_types, require_train_answer)``.
QUERY_SETS = {"betae": (BETAE_TYPES, BETAE_TRAIN_TYPES, False), "paper": (PAPER_TYPES, PAPER_TYPES, True)}


@dataclass
class QuerySettings:
    """``types``: evaluated (valid, test, cross-graph); ``train_types``: trained on.
    ``train_per_type`` and ``eval_per_type``: queries per structure for the whole graph
    (in-graph sets get them divided by the number of clients; KGReasoning's FB15k-237
    figures are 149,689 and 5,000); ``cross_per_type``: cross-graph test queries per
    structure (1p has none: one relation cannot span two clients). ``require_train_answer``:
    valid, test and cross-graph queries must have an answer on the training graph (the
    FedCQA authors' sampler; :func:`~lightning_fedkg.methods.fedcqa.queries.build_query_set`).
    Each set holds its count, or every query the graph has if fewer."""

    types: tuple[str, ...] = BETAE_TYPES
    train_types: tuple[str, ...] = BETAE_TRAIN_TYPES
    train_per_type: int = 149_689
    eval_per_type: int = 5_000
    cross_per_type: int = 5_000
    seed: int = 0
    require_train_answer: bool = False


def _triples_hash(triples: dict[str, Tensor]) -> "hashlib._Hash":
    """A SHA-256 over a graph's three splits (copied per set with :func:`_digest`)."""
    h = hashlib.sha256()
    for split in ("train", "valid", "test"):
        h.update(triples[split].to(torch.int64).contiguous().numpy().tobytes())
        h.update(b"|")
    return h


def _digest(graph_hash, extra: dict) -> str:
    h = graph_hash.copy()
    h.update(json.dumps(extra, sort_keys=True).encode())
    return h.hexdigest()[:32]


def _save(qs: QuerySet, path: Path) -> None:
    state = {k: v for k, v in vars(qs).items() if isinstance(v, Tensor)}
    write_atomic(path, lambda f: torch.save({"structure": qs.structure, **state}, f))


def _load(path: Path) -> QuerySet:
    state = torch.load(path, weights_only=True)
    return QuerySet(state.pop("structure"), **state)


def _cached(cache_dir: Path | None, key: str, build, load: bool = True) -> tuple[QuerySet | None, bool]:
    """The set under ``key`` in ``cache_dir``, else ``build()``'s (saved there), and whether
    it was cached. With ``load=False`` a cached set is not read (``None`` is returned): a
    worker that only fills the cache need not read what is there."""
    path = None if cache_dir is None else Path(cache_dir) / f"{key}.r{CACHE_REVISION}.pt"
    if path is not None and path.is_file():
        return (_load(path) if load else None), True
    qs = build()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _save(qs, path)
    return qs, False


def _relabel_entities(qs: QuerySet, index: Tensor) -> QuerySet:
    """``qs`` with every entity id (anchors, answers) ``i`` replaced by ``index[i]``."""
    anchors, _ = anchors_and_relations(STRUCTURES[qs.structure])
    queries = qs.queries.clone()
    queries[:, anchors] = index[queries[:, anchors]]
    return QuerySet(qs.structure, queries, qs.hard_offsets, index[qs.hard_ids], qs.easy_offsets, index[qs.easy_ids])


def _check_types(settings: QuerySettings) -> None:
    unknown = [t for t in (*settings.types, *settings.train_types) if t not in STRUCTURES]
    if unknown:
        raise ValueError(f"unknown query types {unknown}; valid: {', '.join(STRUCTURES)}")


def graph_query_sets(kg, settings: QuerySettings | None = None, share: int = 1,
                     cache_dir: str | Path | None = None, label: str = "graph", load: bool = True) -> dict:
    """``{split: {type: QuerySet}}`` sampled on ``kg``'s own graphs (its ids): the per-type
    counts divided by ``share`` (the number of clients for an in-graph set, 1 for the
    whole graph). The sampler's seed comes from ``settings.seed`` and the graph's content,
    so a graph gets the same queries whichever party holds it, and a graph whose id space
    holds entities that no triple names (``data.client_entities: all``) gets the queries of
    the graph without them, in its own ids. ``label`` names it in the log;
    ``load=False`` only fills ``cache_dir`` (a set already there is neither read nor returned)."""
    settings = settings or QuerySettings()
    _check_types(settings)
    counts = {"train": max(1, settings.train_per_type // share), "valid": max(1, settings.eval_per_type // share),
              "test": max(1, settings.eval_per_type // share)}
    triples = {s: kg.triples(s) for s in ("train", "valid", "test")}
    num_entities = kg.num_entities
    present = present_ids(torch.cat([t[:, [0, 2]] for t in triples.values()]), num_entities)
    if present.numel() < num_entities:
        # entities in none of the graph's triples (data.client_entities: all): sample on the
        # graph of those that are, so that the draws and cache keys are those of the client's
        # own entities, then map back
        dense = torch.full((num_entities,), -1, dtype=torch.long)
        dense[present] = torch.arange(present.numel())
        triples = {s: torch.stack([dense[t[:, 0]], t[:, 1], dense[t[:, 2]]], 1) for s, t in triples.items()}
        num_entities = present.numel()
    else:
        present = None
    graph_hash = _triples_hash(triples)
    graphs = None
    sets: dict = {}
    for split, count in counts.items():
        for name in settings.train_types if split == "train" else settings.types:
            extra = {"v": SAMPLER_VERSION, "type": name, "split": split, "count": count, "seed": settings.seed,
                     "entities": num_entities, "relations": kg.num_relations}
            require = settings.require_train_answer and split != "train"  # a training answer is all there is
            if require:  # only when set, so that the sets of every other setting keep their keys and seeds
                extra["train_answer"] = True
            key = _digest(graph_hash, extra)

            def build(name=name, split=split, count=count, key=key, require=require):
                nonlocal graphs
                graphs = graphs or split_graphs(triples, num_entities, kg.num_relations)
                generator = torch.Generator().manual_seed(derive_seed(settings.seed, key, "queries"))
                return build_query_set(name, graphs, split, count, generator, require_train_answer=require)

            start = time.perf_counter()
            qs, hit = _cached(cache_dir, key, build, load)
            if qs is None:
                continue
            if present is not None:
                qs = _relabel_entities(qs, present)
            # a load from the cache is not news; sampling (minutes at FB15k-237 scale) is
            (log.debug if hit else log.info)("queries: %s %s %s: %d%s in %.1f s", label, split, name, len(qs),
                                             " (cached)" if hit else "", time.perf_counter() - start)
            sets.setdefault(split, {})[name] = qs
    return sets


def cross_query_sets(fkg, settings: QuerySettings | None = None, cache_dir: str | Path | None = None,
                     load: bool = True) -> dict:
    """``{type: QuerySet}``: cross-graph test queries on the union of ``fkg``'s clients, in
    global ids, each using relations of at least two clients (no 1p). ``load=False`` as in
    :func:`graph_query_sets`."""
    settings = settings or QuerySettings()
    _check_types(settings)
    owners = relation_owners(fkg)
    parts = [{s: torch.stack([ent[t[:, 0]], rel[t[:, 1]], ent[t[:, 2]]], 1)
              for s, t in ((s, kg.triples(s)) for s in ("train", "valid", "test"))}
             for kg, ent, rel in zip(fkg.clients, fkg.entity_index, fkg.relation_index)]
    graph_hash = _triples_hash({s: torch.cat([p[s] for p in parts]) for s in ("train", "valid", "test")})
    union = None
    out = {}
    for name in settings.types:
        if name == "1p" or settings.cross_per_type == 0:
            continue
        extra = {"v": SAMPLER_VERSION, "type": name, "split": "cross", "count": settings.cross_per_type,
                 "seed": settings.seed, "owners": owners.tolist()}
        if settings.require_train_answer:
            extra["train_answer"] = True
        key = _digest(graph_hash, extra)

        def build(name=name, key=key):
            nonlocal union
            union = union or union_split_graphs(fkg)
            generator = torch.Generator().manual_seed(derive_seed(settings.seed, key, "queries"))
            return build_query_set(name, union, "test", settings.cross_per_type, generator,
                                   keep=spans_owners(STRUCTURES[name], owners),
                                   require_train_answer=settings.require_train_answer)

        start = time.perf_counter()
        qs, hit = _cached(cache_dir, key, build, load)
        if qs is None:
            continue
        (log.debug if hit else log.info)("queries: cross-graph %s: %d%s in %.1f s", name, len(qs),
                                         " (cached)" if hit else "", time.perf_counter() - start)
        out[name] = qs
    return out


def federated_query_sets(fkg, settings: QuerySettings | None = None, cache_dir: str | Path | None = None,
                         workers: int = 1) -> dict:
    """``{"clients": [{split: {type: QuerySet}}], "cross": {type: QuerySet}, "settings"}``
    for ``fkg``: in-graph sets in each client's local ids (:func:`graph_query_sets`), the
    cross-graph set in global ids (:func:`cross_query_sets`). Progress (one line per set,
    with its size and seconds) goes to the ``lightning_fedkg`` logger.

    ``workers > 1`` first samples the sets missing from ``cache_dir`` in that many processes
    (a part per process: a client's training set of one type, a client's valid and test
    sets, or the cross-graph set), since sampling is single-threaded and takes minutes per
    client at FB15k-237 scale. The sets are those of one process (each set's sampler is
    seeded by its own key); the processes hand them over through the cache, so it needs a
    ``cache_dir``."""
    settings = settings or QuerySettings()
    n = len(fkg.clients)
    if workers > 1:
        _sample_in_processes(fkg, settings, cache_dir, workers)
    return {
        "clients": [graph_query_sets(kg, settings, n, cache_dir, label=f"client_{k}") for k, kg in enumerate(fkg.clients)],
        "cross": cross_query_sets(fkg, settings, cache_dir),
        "settings": asdict(settings),
    }


def _sample_part(client: int | None, settings: QuerySettings, fkg, cache_dir: str) -> None:
    """One worker's share of :func:`_sample_in_processes`, written to ``cache_dir``: the sets
    of client ``client`` that ``settings`` lists (a set's key, its sampler's seed, does not
    depend on which other types are listed), or with ``client=None`` the cross-graph set.
    Sets already in the cache are left unread: the parent process loads every set after."""
    torch.set_num_threads(1)  # one core per part: the parts share the machine
    if client is None:
        cross_query_sets(fkg, settings, cache_dir, load=False)
    else:
        graph_query_sets(fkg.clients[client], settings, len(fkg.clients), cache_dir, load=False)


def _sample_in_processes(fkg, settings: QuerySettings, cache_dir: str | Path | None, workers: int) -> None:
    if cache_dir is None:
        raise ValueError("sampling query sets in several processes needs a cache_dir: the processes hand "
                         "their sets over through it")
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from dataclasses import replace

    # Parts as small as the keys allow, the training set of each type on its own (each takes
    # up to a minute at FB15k-237 scale), so that the longest part bounds the wall time.
    parts = [(f"client_{k} train {t}", k, replace(settings, train_types=(t,), types=()))
             for k in range(len(fkg.clients)) for t in settings.train_types]
    parts += [(f"client_{k} valid and test", k, replace(settings, train_types=()))
              for k in range(len(fkg.clients))]
    parts.append(("cross-graph set", None, settings))
    n = min(workers, len(parts))
    log.info("queries: sampling what the cache lacks in %d processes (%d parts)", n, len(parts))
    start = time.perf_counter()
    # spawn, not fork: a forked child of a process whose torch has started threads can hang
    with ProcessPoolExecutor(n, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_sample_part, client, part_settings, fkg, str(cache_dir)): label
                   for label, client, part_settings in parts}
        for future in as_completed(futures):
            future.result()
            log.info("queries: %s done (%.1f s since the start)", futures[future], time.perf_counter() - start)


def query_stats(sets: dict) -> list[dict]:
    """Rows like FedCQA's Table 2 from :func:`federated_query_sets`: one per (set, split),
    ``{"set", "split", "<type>": queries, "<type>/hard": mean hard answers per query}``."""
    rows = []
    named = [(f"client_{k}", client) for k, client in enumerate(sets["clients"])] + [("cross-graph", {"test": sets["cross"]})]
    for label, splits in named:
        for split, by_type in splits.items():
            row: dict = {"set": label, "split": split}
            for name, qs in by_type.items():
                row[name] = len(qs)
                hard = (qs.hard_offsets[1:] - qs.hard_offsets[:-1]).double()
                row[f"{name}/hard"] = float(hard.mean()) if len(qs) else 0.0
            rows.append(row)
    return rows
