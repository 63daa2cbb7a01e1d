"""Federated knowledge graphs: one :class:`KnowledgeGraph` per client plus a global id table.

Each client uses local ids (its ``train`` entities in increasing global id), so
``entity_index[c]`` is FedE's sorted index array ``idx_c``. Sources:
:func:`partition_by_relation`, :func:`partition_randomly`, :func:`partition_by_clusters`
(FedLU's C-k), :func:`load_federated_folder`, :func:`load_fedlu_folder`; and
:func:`write_fedlu_folder`. The layouts are described in docs/datasets.md.
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError, too_many_clients

from .kg import (
    SPLITS,
    _to_ids,
    KGFormatError,
    KnowledgeGraph,
    clean_splits,
    training_triples,
    load_kg,
    read_named_triples,
    unique_triples,
)

logger = logging.getLogger("lightning_fedkg")


def present_ids(ids: Tensor, size: int) -> Tensor:
    """Sorted distinct values of ``ids`` (all in ``[0, size)``), via a mask instead of a sort."""
    mask = torch.zeros(size, dtype=torch.bool)
    mask[ids.reshape(-1)] = True
    return mask.nonzero().flatten()


def _select(names: list[str] | None, index: Tensor) -> list[str] | None:
    if names is None:
        return None
    return np.asarray(names, dtype=object)[index.numpy()].tolist()


def _existence(index: list[Tensor], size: int) -> Tensor:
    """``BoolTensor[len(index), size]``: row c is True at ``index[c]``."""
    out = torch.zeros(len(index), size, dtype=torch.bool)
    for c, idx in enumerate(index):
        out[c, idx] = True
    return out


class FederatedKG:
    """Clients' KGs in local ids, tied together by local -> global index tensors.

    Args:
        clients: one :class:`KnowledgeGraph` per client, in local ids.
        entity_index: per client, ``LongTensor[n_c]`` local entity id -> global id.
        relation_index: per client, ``LongTensor[m_c]`` local relation id -> global id.
        num_entities, num_relations: sizes of the global tables.
        entity_names, relation_names: optional global id -> name lists.
        name: label for logs and stats.

    Use :meth:`from_global_splits` to build one from triples in global ids.
    """

    def __init__(
        self,
        clients: list[KnowledgeGraph],
        entity_index: list[Tensor],
        relation_index: list[Tensor],
        num_entities: int,
        num_relations: int,
        entity_names: list[str] | None = None,
        relation_names: list[str] | None = None,
        name: str = "fedkg",
    ) -> None:
        if not (len(clients) == len(entity_index) == len(relation_index)):
            raise ValueError("clients, entity_index and relation_index must have equal length")
        for c, (kg, ei, ri) in enumerate(zip(clients, entity_index, relation_index)):
            for label, idx, size, total in (("entity", ei, kg.num_entities, num_entities),
                                            ("relation", ri, kg.num_relations, num_relations)):
                if idx.numel() != size:
                    raise ValueError(f"client {c}: {label}_index has {idx.numel()} ids for {size} local ids")
                if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= total):
                    raise ValueError(f"client {c}: {label}_index outside [0, {total})")
                if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
                    raise ValueError(f"client {c}: {label}_index must be strictly increasing")
        self.clients = list(clients)
        self.entity_index = [torch.as_tensor(i).long() for i in entity_index]
        self.relation_index = [torch.as_tensor(i).long() for i in relation_index]
        self.num_entities = int(num_entities)
        self.num_relations = int(num_relations)
        self.entity_names = list(entity_names) if entity_names is not None else None
        self.relation_names = list(relation_names) if relation_names is not None else None
        self.name = name

    @classmethod
    def from_global_splits(
        cls,
        client_splits: list[dict[str, Tensor]],
        num_entities: int,
        num_relations: int,
        entity_names: list[str] | None = None,
        relation_names: list[str] | None = None,
        name: str = "fedkg",
        clean: bool = True,
    ) -> "FederatedKG":
        """Build from per-client splits in GLOBAL ids.

        With ``clean=True`` the input policy (:func:`~lightning_fedkg.data.kg.clean_splits`)
        is applied per client: duplicates removed, evaluation triples whose entity or
        relation is absent from that client's training triples (``train``, and ``unlearn``
        when present: :data:`~lightning_fedkg.data.kg.TRAINING_SPLITS`) dropped. Local ids
        are then the client's entities / relations of those triples in increasing global id.
        """
        clients, ent_idx, rel_idx = [], [], []
        for c, splits in enumerate(client_splits):
            label = f"{name}/client_{c}"
            removed = {}
            if clean:
                splits, removed = clean_splits(splits, num_entities, num_relations, source=label)
            if splits["train"].shape[0] == 0:
                raise KGFormatError(f"{label}: empty train split")
            trained = training_triples(splits)
            ents = present_ids(trained[:, [0, 2]], num_entities)
            rels = present_ids(trained[:, 1], num_relations)
            e_map = torch.full((num_entities,), -1, dtype=torch.long)
            e_map[ents] = torch.arange(ents.numel())
            r_map = torch.full((num_relations,), -1, dtype=torch.long)
            r_map[rels] = torch.arange(rels.numel())
            local = {}
            for s, t in splits.items():
                loc = torch.stack([e_map[t[:, 0]], r_map[t[:, 1]], e_map[t[:, 2]]], 1)
                if (loc < 0).any():
                    raise ValueError(f"{label}: split '{s}' uses ids absent from train "
                                     "(pass clean=True)")
                local[s] = loc
            kg = KnowledgeGraph(local, ents.numel(), rels.numel(), _select(entity_names, ents),
                                _select(relation_names, rels), name=label)
            kg.removed = removed
            clients.append(kg)
            ent_idx.append(ents)
            rel_idx.append(rels)
        return cls(clients, ent_idx, rel_idx, num_entities, num_relations,
                   entity_names, relation_names, name)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def global_triples(self, client: int, split: str = "train") -> Tensor:
        """A client's split mapped to global ids."""
        t = self.clients[client].triples(split)
        return torch.stack([self.entity_index[client][t[:, 0]],
                            self.relation_index[client][t[:, 1]],
                            self.entity_index[client][t[:, 2]]], 1)

    def with_all_entities(self) -> "FederatedKG":
        """The same clients, each holding every entity of the federation (``data.client_entities:
        all``): a client's triples in global entity ids, its tables sized to all entities.

        The FedCQA code sets its clients up this way: every client's softmax and in-graph ranking
        run over all entities, and an entity outside a client's triples is trained there only as
        a candidate. A holder-mean then averages every row over every client. Relations stay the
        client's own."""
        n = self.num_entities
        clients = []
        for kg, ent in zip(self.clients, self.entity_index):
            splits = {s: torch.stack([ent[t[:, 0]], t[:, 1], ent[t[:, 2]]], 1)
                      for s, t in ((s, kg.triples(s)) for s in kg.split_names)}
            wide = KnowledgeGraph(splits, n, kg.num_relations, self.entity_names, kg.relation_names, name=kg.name)
            wide.removed = getattr(kg, "removed", {})
            clients.append(wide)
        return FederatedKG(clients, [torch.arange(n) for _ in clients], self.relation_index, n, self.num_relations,
                           self.entity_names, self.relation_names, self.name)

    def entity_existence(self) -> Tensor:
        """``BoolTensor[C, num_entities]``: ``v^c``, True where client c holds the entity."""
        return _existence(self.entity_index, self.num_entities)

    def relation_existence(self) -> Tensor:
        """``BoolTensor[C, num_relations]``, True where client c holds the relation."""
        return _existence(self.relation_index, self.num_relations)

    def union(self) -> KnowledgeGraph:
        """All clients' data in global ids (the centralised 'entire' setting).

        Each split is the concatenation of the clients' splits (client 0 first) with
        duplicates removed; splits present only in some clients are included too.
        """
        names: list[str] = []
        for kg in self.clients:
            names += [s for s in kg.split_names if s not in names]
        splits = {}
        for s in names:
            parts = [self.global_triples(c, s) for c, kg in enumerate(self.clients)
                     if s in kg.split_names]
            splits[s] = unique_triples(torch.cat(parts), self.num_entities, self.num_relations)
        return KnowledgeGraph(splits, self.num_entities, self.num_relations,
                              self.entity_names, self.relation_names, name=self.name)

    def stats(self) -> list[dict]:
        """Per client: ``{"client", "name", "entities", "relations", "train", "valid", "test", ...}``."""
        return [{"client": c, **kg.stats()} for c, kg in enumerate(self.clients)]

    def __repr__(self) -> str:
        return (f"FederatedKG(name={self.name!r}, clients={self.num_clients}, "
                f"entities={self.num_entities}, relations={self.num_relations})")


# --------------------------------------------------------------------------------------
# FedE relation partition
# --------------------------------------------------------------------------------------


#: Smallest block of :func:`resample_split`'s walk (below it, numpy's per-call cost dominates).
_MIN_BLOCK = 32


def resample_split(
    rows: Tensor, perm: Tensor, num_valid: int, num_test: int, chunk: int = 4096
) -> tuple[Tensor, Tensor, Tensor, int]:
    """FedE/FedLU-style eval selection with the ``resample`` constraint.

    Walk ``rows[perm]`` in order; a triple is taken for evaluation iff, after removing it
    (and every triple taken before it), its head, tail and relation still occur in the
    remaining triples. The first ``num_valid`` taken triples are valid, the next
    ``num_test`` test; the walk stops once both are filled. Train = all other triples in
    permutation order. Returns train, valid, test and the number of skipped triples.

    The sequential rule is evaluated block-wise: assuming every earlier triple of the
    block is taken, each triple's eligibility follows from running occurrence counts;
    up to the first ineligible triple that assumption holds, so that prefix is committed
    exactly and the walk resumes after it. Blocks adapt to the gaps between ineligible
    triples (at most ``chunk``, twice the last committed run after a skip, doubling after a
    block without one), so the work past each skip is about the run before it: O(n log chunk)
    and a few numpy calls per skipped triple. A fixed ``chunk`` cost O(skipped * chunk),
    superlinear where skips are dense (low-degree entities of a power-law graph: a 3M-triple
    synthetic KG, 29k skips, spent 53 s here); any block size gives the same split.
    """
    # numpy: this loop runs one small step per skipped triple, and tiny multi-threaded
    # torch ops stall badly when the CPU is oversubscribed.
    rows_np = rows.numpy()
    n = rows_np.shape[0]
    need = num_valid + num_test
    num_ent = int(rows_np[:, [0, 2]].max()) + 1 if n else 0
    ecount = np.bincount(rows_np[:, [0, 2]].reshape(-1), minlength=num_ent)
    rcount = np.bincount(rows_np[:, 1])
    walk = rows_np[perm.numpy()]
    taken = np.zeros(n, dtype=bool)  # over walk positions
    skipped, num_taken, pos = 0, 0, 0
    size = chunk

    def ranks(x: np.ndarray) -> np.ndarray:
        # occurrences of the same value earlier in x
        order = np.argsort(x, kind="stable")
        sorted_x = x[order]
        out = np.empty_like(x)
        out[order] = np.arange(x.size) - np.searchsorted(sorted_x, sorted_x, side="left")
        return out

    while num_taken < need and pos < n:
        block = walk[pos:pos + size]
        m = block.shape[0]
        ents = block[:, [0, 2]].reshape(-1)  # h0, t0, h1, t1, ...: walk order
        # eligible iff every count stays >= 1 after removing this and all earlier triples
        ok = (ecount[ents] - ranks(ents) >= 2).reshape(m, 2).all(1)
        ok &= rcount[block[:, 1]] - ranks(block[:, 1]) >= 2
        bad = np.flatnonzero(~ok)
        stop = int(bad[0]) if bad.size else m  # first ineligible position in the block
        take = min(stop, need - num_taken)
        if take:
            commit = block[:take]
            np.subtract.at(ecount, commit[:, [0, 2]].reshape(-1), 1)
            np.subtract.at(rcount, commit[:, 1], 1)
            taken[pos:pos + take] = True
            num_taken += take
        if num_taken == need:
            break
        if stop == m:  # the whole block was eligible
            pos += m
            size = min(chunk, 2 * size)
            continue
        skipped += 1  # position pos+stop is ineligible; it stays in train
        pos += stop + 1
        size = min(chunk, max(_MIN_BLOCK, 2 * (stop + 1)))
    if num_taken < need:
        raise ValueError(f"resample: only {num_taken} of {need} eligible valid/test triples")
    train = torch.from_numpy(walk[~taken])
    eval_rows = torch.from_numpy(walk[taken])
    return train, eval_rows[:num_valid], eval_rows[num_valid:], skipped


def partition_by_relation(
    kg: KnowledgeGraph,
    num_clients: int,
    seed: int = 12345,
    valid_frac: float = 0.1,
    test_frac: float = 0.1,
) -> FederatedKG:
    """FedE's federated benchmark construction (Chen et al. 2021, Sec. 3.1).

    1. pool ``kg``'s train + valid + test triples (duplicates across splits removed);
    2. shuffle the relations that occur and cut them into ``num_clients`` contiguous
       groups of near-equal size (sizes differ by at most one, larger groups first);
    3. give each client all triples of its relations (in pool order);
    4. per client, permute its ``n`` triples and choose ``round(valid_frac * n)`` valid and
       ``round(test_frac * n)`` test triples with :func:`resample_split` (every
       valid/test entity and relation stays in the client's train split), rest = train.

    All randomness comes from one ``torch.Generator`` seeded with ``seed``, drawn in a
    fixed order (relation permutation, then one triple permutation per client, client 0
    first), so the result is a function of (kg, num_clients, seed, fractions). It follows
    the procedure of ``shared/tools/make_fed_splits.py`` but uses torch's RNG, so it is not
    bit-identical to that script's numpy output. Global ids are ``kg``'s ids.
    """
    pool = _pooled_triples(kg, num_clients)
    relations = torch.unique(pool[:, 1])
    if relations.numel() < num_clients:
        raise too_many_clients(kg.name, relations.numel(), num_clients, "relation")
    gen = torch.Generator().manual_seed(seed)
    rel_perm = relations[torch.randperm(relations.numel(), generator=gen)]
    groups = _relation_groups(pool, torch.tensor_split(rel_perm, num_clients), kg.num_relations)
    return _federate(kg, groups, gen, valid_frac, test_frac, f"{kg.name}-Fed{num_clients}")


def partition_randomly(
    kg: KnowledgeGraph,
    num_clients: int,
    seed: int = 12345,
    valid_frac: float = 0.1,
    test_frac: float = 0.1,
) -> FederatedKG:
    """Split ``kg``'s triples among clients at random, so relations (and entities) overlap.

    As :func:`partition_by_relation`, except step 2-3: the pooled triples are permuted and
    cut into ``num_clients`` contiguous groups of near-equal size. Every client then sees
    most relations, which is the setting where relation aggregation (FedR) differs from
    isolated training (FedLU's random split, Zhu et al., WWW 2023, §5.1).
    """
    pool = _pooled_triples(kg, num_clients)
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(pool.shape[0], generator=gen)
    groups = list(torch.tensor_split(pool[perm], num_clients))
    return _federate(kg, groups, gen, valid_frac, test_frac, f"{kg.name}-Random{num_clients}")


def relation_cooccurrence(triples: Tensor, num_entities: int, num_relations: int) -> Tensor:
    """``LongTensor[R, R]``: ``A[r, r']`` = number of entities incident to both ``r`` and ``r'``.

    The affinity of FedLU's C-k split (Zhu et al., "Heterogeneous Federated Knowledge Graph
    Embedding Learning and Unlearning", WWW 2023, §5.1; their ``partition_data_C.py``): an
    entity is incident to a relation when it is the head or tail of one of its triples. With
    the binary entity × relation incidence matrix ``M`` (sparse), ``A = MᵀM``; the diagonal
    ``A[r, r]`` is the number of entities incident to ``r``.
    """
    triples = torch.as_tensor(triples).long()
    ent = triples[:, [0, 2]].reshape(-1)
    rel = triples[:, 1].repeat_interleave(2)
    keys = torch.unique(ent * num_relations + rel)  # (entity, relation) incidences, each once
    incidence = torch.sparse_coo_tensor(
        torch.stack([keys // num_relations, keys % num_relations]),
        torch.ones(keys.numel(), dtype=torch.float64), (num_entities, num_relations),
        check_invariants=True, is_coalesced=True)
    with warnings.catch_warnings():  # torch routes sparse @ sparse through (beta) CSR
        warnings.filterwarnings("ignore", message=".*Sparse CSR tensor support is in beta.*")
        co = torch.sparse.mm(incidence.t().coalesce(), incidence).to_dense()
    return co.round().long()  # integer counts, exact in float64


def partition_by_clusters(
    kg: KnowledgeGraph,
    num_clients: int,
    seed: int = 12345,
    valid_frac: float = 0.1,
    test_frac: float = 0.1,
) -> FederatedKG:
    """FedLU's C-k split (Zhu et al., WWW 2023, §5.1; their ``partition_data_C.py``).

    As :func:`partition_by_relation`, except steps 2-3: the relations that occur are grouped
    by spectral clustering of their co-occurrence matrix (:func:`relation_cooccurrence`,
    ``A = MᵀM`` over the pooled triples) into ``num_clients`` clusters, and each client gets
    all triples of one cluster's relations. Relations that share many entities thus land on
    the same client, so clients are more heterogeneous than under a random relation split.
    Clients are ordered by the smallest relation id of their cluster.

    Clustering is scikit-learn's ``SpectralClustering(affinity="precomputed",
    random_state=seed)`` on ``A`` with its diagonal zeroed (self-affinity does not enter a
    graph Laplacian) — a maintained implementation, installed with the optional extra
    ``lightning-fedkg[clustered]``. The per-client triple permutations then come from
    ``torch.Generator().manual_seed(seed)``, so the split is a function of
    (kg, num_clients, seed, fractions).

    Raises:
        ImportError: scikit-learn is not installed.
        ConfigError: fewer relations than clients (data.num_clients); a relation that
            shares no entity with any other relation (nothing to cluster it by); a
            co-occurrence graph with more connected components than clients; a cluster that
            ends up empty; a client too small to hold out its valid and test triples.
    """
    pool = _pooled_triples(kg, num_clients)
    relations = torch.unique(pool[:, 1])
    if relations.numel() < num_clients:
        raise too_many_clients(kg.name, relations.numel(), num_clients, "clustered")
    if num_clients == 1:
        labels = np.zeros(relations.numel(), dtype=np.int64)
    else:
        labels = _spectral_relation_clusters(kg, pool, relations, num_clients, seed)
    clusters = [relations[torch.from_numpy(labels == k)] for k in range(num_clients)]
    empty = [k for k, c in enumerate(clusters) if c.numel() == 0]
    if empty:
        raise ConfigError(f"{kg.name}: spectral clustering left cluster(s) {empty} of {num_clients} "
                          "without relations; use fewer clients or data.partition=relation")
    clusters.sort(key=lambda c: int(c[0]))
    groups = _relation_groups(pool, clusters, kg.num_relations)
    gen = torch.Generator().manual_seed(seed)
    return _federate(kg, groups, gen, valid_frac, test_frac, f"{kg.name}-C{num_clients}")


def _spectral_relation_clusters(kg: KnowledgeGraph, pool: Tensor, relations: Tensor,
                                num_clients: int, seed: int) -> np.ndarray:
    """Cluster label (``0..num_clients-1``) of each of ``relations``, by spectral clustering."""
    try:
        from scipy.sparse.csgraph import connected_components
        from sklearn.cluster import SpectralClustering
    except ImportError as err:
        raise ImportError("data.partition=clustered needs scikit-learn: "
                          "pip install lightning-fedkg[clustered]") from err
    affinity = relation_cooccurrence(pool, kg.num_entities, kg.num_relations)
    affinity = affinity[relations][:, relations].to(torch.float64).numpy()
    np.fill_diagonal(affinity, 0.0)

    def label(ids) -> str:
        ids = [int(relations[i]) for i in ids]
        names = [kg.relation_names[i] for i in ids] if kg.relation_names else ids
        return ", ".join(map(str, names[:10])) + (f" (+{len(names) - 10} more)" if len(names) > 10 else "")

    isolated = np.flatnonzero(affinity.sum(1) == 0)
    if isolated.size:
        raise ConfigError(f"{kg.name}: {isolated.size} relation(s) share no entity with any other "
                          f"relation, so co-occurrence cannot cluster them: {label(isolated)}; "
                          "use data.partition=relation")
    num_components, component = connected_components(affinity, directed=False)
    if num_components > num_clients:
        sizes = np.bincount(component).tolist()
        raise ConfigError(f"{kg.name}: the relation co-occurrence graph has {num_components} connected "
                          f"components (sizes {sizes}), more than {num_clients} clients; spectral "
                          "clustering cannot split it meaningfully; use more clients or "
                          "data.partition=relation")
    clustering = SpectralClustering(n_clusters=num_clients, affinity="precomputed", random_state=seed)
    with warnings.catch_warnings():
        # at most num_clients components: a disconnected graph is expected here (clusters
        # follow components), so sklearn's "not fully connected" warning is noise
        warnings.filterwarnings("ignore", message=".*not fully connected.*")
        return np.asarray(clustering.fit_predict(affinity), dtype=np.int64)


def _relation_groups(pool: Tensor, relation_sets: list[Tensor], num_relations: int) -> list[Tensor]:
    """Per set of relations, the rows of ``pool`` with one of them (in pool order): one
    table lookup per triple (``isin`` per group costs triples x group size)."""
    owner = torch.full((num_relations,), -1, dtype=torch.long)
    for k, relations in enumerate(relation_sets):
        owner[relations] = k
    group = owner[pool[:, 1]]
    return [pool[group == k] for k in range(len(relation_sets))]


def _pooled_triples(kg: KnowledgeGraph, num_clients: int) -> Tensor:
    """``kg``'s train + valid + test triples, each once (step 1 of every partitioner)."""
    if num_clients < 1:
        raise ValueError("num_clients must be >= 1")
    pool = torch.cat([kg.triples(s) for s in SPLITS])
    unique = unique_triples(pool, kg.num_entities, kg.num_relations)
    if unique.shape[0] < pool.shape[0]:
        logger.warning("%s: %d triples occur in more than one split; each is used once",
                       kg.name, pool.shape[0] - unique.shape[0])
    return unique


def _federate(kg: KnowledgeGraph, groups: list[Tensor], gen: torch.Generator, valid_frac: float,
              test_frac: float, name: str) -> FederatedKG:
    """Per group, a train/valid/test split by :func:`resample_split` (step 4), then the federation."""
    client_splits = []
    for k, rows in enumerate(groups):
        n = rows.shape[0]
        perm = torch.randperm(n, generator=gen)
        n_valid, n_test = int(round(valid_frac * n)), int(round(test_frac * n))
        try:
            train, valid, test, _ = resample_split(rows, perm, n_valid, n_test)
        except ValueError as err:
            # A client too small to hold out its evaluation triples: too many clients for
            # this KG (the usual cause), said in the key a user sets.
            raise ConfigError(f"data.num_clients={len(groups)}: client {k} of {kg.name} gets {n} triples, too "
                              f"few to hold out {n_valid} valid and {n_test} test triples whose entities and "
                              f"relations stay in its train split ({err}); use fewer clients") from None
        client_splits.append({"train": train, "valid": valid, "test": test})
    return FederatedKG.from_global_splits(
        client_splits, kg.num_entities, kg.num_relations, kg.entity_names, kg.relation_names,
        name=name, clean=False)


# --------------------------------------------------------------------------------------
# Folder loaders
# --------------------------------------------------------------------------------------


def _load_named_clients(
    files: list[dict[str, Path]], name: str
) -> FederatedKG:
    """Clients given as named-triple files; global ids = names sorted (entities, relations)."""
    named = []
    for client_files in files:
        parsed = {}
        for s, path in client_files.items():
            h, r, t, _ = read_named_triples(path)
            if not h:
                raise KGFormatError(f"{path}: split '{s}' has no triples")
            parsed[s] = (h, r, t)
        named.append(parsed)
    # provisional ids (first appearance) so the policy can run on tensors
    ent: dict[str, None] = {}
    rel: dict[str, None] = {}
    for parsed in named:
        for h, r, t in parsed.values():
            ent.update(dict.fromkeys(h))
            ent.update(dict.fromkeys(t))
            rel.update(dict.fromkeys(r))
    e2p = {n: i for i, n in enumerate(ent)}
    r2p = {n: i for i, n in enumerate(rel)}
    ent_names, rel_names = list(ent), list(rel)
    cleaned = []
    for c, parsed in enumerate(named):
        prov = {s: _to_ids(h, r, t, e2p, r2p) for s, (h, r, t) in parsed.items()}
        splits, _ = clean_splits(prov, len(e2p), len(r2p), source=f"{name}/client_{c}")
        cleaned.append(splits)
    # global vocabulary: every entity / relation of some client's training triples, sorted by name
    trained = [training_triples(s) for s in cleaned]
    used_e = present_ids(torch.cat([t[:, [0, 2]].reshape(-1) for t in trained]), len(e2p))
    used_r = present_ids(torch.cat([t[:, 1] for t in trained]), len(r2p))
    e_sorted = sorted(_select(ent_names, used_e))
    r_sorted = sorted(_select(rel_names, used_r))
    e_map = torch.full((len(e2p),), -1, dtype=torch.long)
    e_map[torch.tensor([e2p[n] for n in e_sorted], dtype=torch.long)] = torch.arange(len(e_sorted))
    r_map = torch.full((len(r2p),), -1, dtype=torch.long)
    r_map[torch.tensor([r2p[n] for n in r_sorted], dtype=torch.long)] = torch.arange(len(r_sorted))
    client_splits = [{s: torch.stack([e_map[t[:, 0]], r_map[t[:, 1]], e_map[t[:, 2]]], 1)
                      for s, t in splits.items()} for splits in cleaned]
    return FederatedKG.from_global_splits(client_splits, len(e_sorted), len(r_sorted),
                                          e_sorted, r_sorted, name=name, clean=False)


def _numbered_dirs(folder: Path, pattern: str) -> list[Path]:
    found = []
    for d in folder.iterdir():
        m = re.fullmatch(pattern, d.name)
        if d.is_dir() and m:
            found.append((int(m.group(1)), d))
    found.sort()
    if not found:
        raise FileNotFoundError(f"no client folders matching {pattern!r} in {folder}")
    ids = [k for k, _ in found]
    if ids != list(range(len(ids))):
        raise KGFormatError(f"{folder}: client folders must be numbered 0..C-1, found {ids}")
    return [d for _, d in found]


def _find(folder: Path, stem: str, exts: tuple[str, ...]) -> Path:
    for ext in exts:
        if (folder / f"{stem}{ext}").is_file():
            return folder / f"{stem}{ext}"
    raise FileNotFoundError(f"no {stem}{'|'.join(exts)} in {folder}")


def load_federated_folder(path: str | Path) -> FederatedKG:
    """Load FedE-style client splits ``client_<k>/{train,valid,test}.tsv`` (``.txt`` accepted).

    Global entity / relation ids are the names of all clients' train entities / relations
    in sorted order; the input policy is applied per client.
    """
    folder = Path(path)
    dirs = _numbered_dirs(folder, r"client_(\d+)")
    files = [{s: _find(d, s, (".tsv", ".txt")) for s in SPLITS} for d in dirs]
    return _load_named_clients(files, folder.resolve().name)


def load_fedlu_folder(path: str | Path) -> FederatedKG:
    """Load FedLU client splits ``<k>/{train,valid,test,unlearn}.txt``.

    ``unlearn`` (the client's forgetting set, a subset of its train triples) is kept as an
    extra split of each client when present. Ids as in :func:`load_federated_folder`, with
    ``unlearn`` counted among the training triples: a retrain folder (``train`` without the
    forgotten triples, ``unlearn`` = them) loads with the source's vocabulary, ids and
    evaluation splits, so the forgotten triples are all ranked by the retrained model too.
    """
    folder = Path(path)
    dirs = _numbered_dirs(folder, r"(\d+)")
    files = []
    for d in dirs:
        f = {s: _find(d, s, (".txt", ".tsv")) for s in SPLITS}
        try:
            f["unlearn"] = _find(d, "unlearn", (".txt", ".tsv"))
        except FileNotFoundError:
            pass
        files.append(f)
    return _load_named_clients(files, folder.resolve().name)


def write_fedlu_folder(fed: FederatedKG, path: str | Path,
                       extra: dict[str, list[Tensor]] | None = None) -> Path:
    """Write ``fed`` in FedLU's layout, the one the official FedLU code reads.

    Per client ``k``: ``<path>/<k>/entities.dict`` and ``relations.dict`` (``local id<TAB>name``,
    local ids in increasing global id) and ``<split>.txt`` (``head<TAB>relation<TAB>tail``
    names) for every split the client has, plus one file per entry of ``extra`` (split name
    -> one local-id triple tensor per client, e.g. ``{"unlearn": forget_sets}``).
    :func:`load_fedlu_folder` reads it back. Existing files are overwritten.

    Raises:
        ValueError: ``fed`` has no names, a name contains whitespace (FedLU's reader splits
            lines on any whitespace), or ``extra`` has the wrong number of clients.
    """
    if fed.entity_names is None or fed.relation_names is None:
        raise ValueError("cannot write a federation without entity and relation names")
    for kind, names in (("entity", fed.entity_names), ("relation", fed.relation_names)):
        bad = next((n for n in names if not n or len(n.split()) != 1), None)
        if bad is not None:
            raise ValueError(f"{kind} name {bad!r} is empty or has whitespace; FedLU's files cannot hold it")
    extra = extra or {}
    for split, per_client in extra.items():
        if len(per_client) != fed.num_clients:
            raise ValueError(f"extra split {split!r} has {len(per_client)} clients, the federation {fed.num_clients}")
    root = Path(path)
    ent_all = np.asarray(fed.entity_names, dtype=object)
    rel_all = np.asarray(fed.relation_names, dtype=object)
    for c, kg in enumerate(fed.clients):
        out = root / str(c)
        out.mkdir(parents=True, exist_ok=True)
        splits = {s: kg.triples(s) for s in kg.split_names}
        splits.update({s: per_client[c] for s, per_client in extra.items()})
        write_named_client(out, ent_all[fed.entity_index[c].numpy()], rel_all[fed.relation_index[c].numpy()], splits)
    return root


def write_named_client(folder: str | Path, entity_names, relation_names, splits: dict[str, Tensor]) -> None:
    """One client's ``entities.dict`` and ``relations.dict`` (``local id<TAB>name``) and its
    named splits (:func:`write_named_splits`)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in (("entities.dict", entity_names), ("relations.dict", relation_names)):
        (folder / name).write_text("".join(f"{i}\t{n}\n" for i, n in enumerate(table)), encoding="utf-8")
    write_named_splits(folder, entity_names, relation_names, splits)


def write_named_splits(folder: str | Path, entity_names, relation_names, splits: dict[str, Tensor]) -> None:
    """``<folder>/<split>.txt`` of ``head<TAB>relation<TAB>tail`` names for each id-triple
    tensor of ``splits``; ``entity_names[i]`` / ``relation_names[i]`` name local id ``i``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ent = np.asarray(entity_names, dtype=object)
    rel = np.asarray(relation_names, dtype=object)
    for s, t in splits.items():
        t = torch.as_tensor(t).reshape(-1, 3).numpy()
        lines = [f"{h}\t{r}\t{o}\n" for h, r, o in zip(ent[t[:, 0]], rel[t[:, 1]], ent[t[:, 2]])]
        (folder / f"{s}.txt").write_text("".join(lines), encoding="utf-8")


#: ``data.partition`` → how one KG is split among clients.
PARTITIONERS = {"relation": partition_by_relation, "random": partition_randomly,
                "clustered": partition_by_clusters}


def load_federated(name_or_path: str | Path, num_clients: int = 3, seed: int = 12345,
                   partition: str = "relation", **kwargs) -> FederatedKG:
    """Dispatch: a folder with ``client_0/`` -> :func:`load_federated_folder`; with ``0/``
    -> :func:`load_fedlu_folder`; otherwise one KG split by ``partition`` (``"relation"``:
    :func:`partition_by_relation`, ``"random"``: :func:`partition_randomly`, ``"clustered"``:
    :func:`partition_by_clusters`; ``kwargs`` go to the partitioner)."""
    folder = Path(name_or_path)
    if folder.is_dir() and (folder / "client_0").is_dir():
        return load_federated_folder(folder)
    if folder.is_dir() and (folder / "0").is_dir():
        return load_fedlu_folder(folder)
    if partition not in PARTITIONERS:
        raise ValueError(f"unknown partition {partition!r}; valid: {', '.join(PARTITIONERS)}")
    return PARTITIONERS[partition](load_kg(name_or_path), num_clients, seed=seed, **kwargs)
