"""Partitioners: one KG split among clients, FedE's way and its variants.

:func:`partition_by_relation` (FedE), :func:`partition_randomly`,
:func:`partition_by_clusters` (FedLU's C-k); each client's train/valid/test by
:func:`resample_split`. :data:`PARTITIONERS` maps ``data.partition`` to them.
"""

from __future__ import annotations

import logging
import warnings

import numpy as np
import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError, too_many_clients

from .federated import FederatedKG
from .kg import SPLITS, KnowledgeGraph, unique_triples

logger = logging.getLogger("lightning_fedkg")


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


#: ``data.partition`` → how one KG is split among clients.
PARTITIONERS = {"relation": partition_by_relation, "random": partition_randomly,
                "clustered": partition_by_clusters}
