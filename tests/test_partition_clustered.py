"""data.partition=clustered: FedLU's C-k split (spectral clusters of co-occurring relations)."""

import importlib.util
import sys
from collections import Counter

import pytest
import torch

from lightning_fedkg.data import KnowledgeGraph, load_kg, partition_by_clusters, relation_cooccurrence

SPLITS = ("train", "valid", "test")
# scikit-learn comes with the `clustered` and `test` extras
needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                   reason="scikit-learn not installed")


def community_kg(communities=((0, 1), (2, 3)), entities_per=10, extra=()):
    """Relations of one community share entities; no entity touches two communities
    (unless ``extra`` triples bridge them)."""
    rows = []
    for c, rels in enumerate(communities):
        base = c * entities_per
        for r in rels:
            for i in range(entities_per):
                for step in (1, 3):
                    rows.append((base + i, r, base + (i + step + r) % entities_per))
    triples = torch.tensor(rows + list(extra))
    num_rel = sum(len(r) for r in communities)
    return KnowledgeGraph({"train": triples, "valid": torch.zeros(0, 3, dtype=torch.long),
                           "test": torch.zeros(0, 3, dtype=torch.long)},
                          entities_per * len(communities), num_rel, name="communities")


def client_relations(fkg):
    return [set(fkg.relation_index[c].tolist()) for c in range(fkg.num_clients)]


@needs_sklearn
@pytest.mark.parametrize("bridge", [(), ((9, 2, 10),)], ids=["disjoint", "one-bridge"])
def test_two_obvious_communities_go_to_different_clients(bridge):
    # with a bridge, entity 9 touches relations 0, 1, 2: one component, spectral clustering cuts it
    fkg = partition_by_clusters(community_kg(extra=bridge), 2, seed=0)
    assert client_relations(fkg) == [{0, 1}, {2, 3}]  # clients ordered by smallest relation id
    assert fkg.name == "communities-C2"


def test_cooccurrence_equals_brute_force_double_loop():
    g = torch.Generator().manual_seed(0)
    n, num_ent, num_rel = 60, 25, 7
    triples = torch.stack([torch.randint(0, num_ent, (n,), generator=g),
                           torch.randint(0, num_rel, (n,), generator=g),
                           torch.randint(0, num_ent, (n,), generator=g)], 1)
    incident = {r: set() for r in range(num_rel)}
    for h, r, t in triples.tolist():
        incident[r] |= {h, t}
    expect = [[len(incident[r] & incident[q]) for q in range(num_rel)] for r in range(num_rel)]
    got = relation_cooccurrence(triples, num_ent, num_rel)
    assert got.dtype == torch.long and got.tolist() == expect


@needs_sklearn
def test_umls_three_clusters_disjoint_complete_and_deterministic():
    kg = load_kg("umls")
    fkg = partition_by_clusters(kg, 3, seed=12345)
    assert fkg.num_clients == 3
    # relations disjoint across clients and all covered
    assert fkg.relation_existence().sum(0).tolist() == [1] * kg.num_relations
    # every triple assigned exactly once: the counts add up to the source's
    pool = torch.cat([kg.triples(s) for s in SPLITS])
    dealt = torch.cat([fkg.global_triples(c, s) for c in range(3) for s in SPLITS])
    assert dealt.shape[0] == pool.shape[0]
    assert Counter(map(tuple, dealt.tolist())) == Counter(map(tuple, pool.tolist()))
    for c, client in enumerate(fkg.clients):
        n = sum(client.triples(s).shape[0] for s in SPLITS)
        assert client.triples("valid").shape[0] == round(0.1 * n) == client.triples("test").shape[0]
    again = partition_by_clusters(kg, 3, seed=12345)
    for a, b in zip(fkg.clients, again.clients):
        assert all(torch.equal(a.triples(s), b.triples(s)) for s in SPLITS)
    assert [r.tolist() for r in fkg.relation_index] == [r.tolist() for r in again.relation_index]


@needs_sklearn
def test_clear_errors_on_edge_cases(monkeypatch):
    with pytest.raises(ValueError, match=r"data\.num_clients=5: .* has 4 relations .* at most 4 clients"):
        partition_by_clusters(community_kg(), 5)
    # three separate communities cannot go to two clients by co-occurrence
    with pytest.raises(ValueError, match="3 connected components"):
        partition_by_clusters(community_kg(((0, 1), (2, 3), (4, 5))), 2)
    # a relation whose entities no other relation touches is named
    kg = community_kg(((0, 1), (2,)))
    kg.relation_names = ["a", "b", "lonely"]
    with pytest.raises(ValueError, match="share no entity.*lonely"):
        partition_by_clusters(kg, 2)
    # a cluster left empty is named
    import sklearn.cluster

    class OneCluster:
        def __init__(self, **kwargs):
            pass

        def fit_predict(self, affinity):
            return [0] * len(affinity)

    monkeypatch.setattr(sklearn.cluster, "SpectralClustering", OneCluster)
    with pytest.raises(ValueError, match=r"cluster\(s\) \[1\]"):
        partition_by_clusters(community_kg(), 2)


def test_missing_scikit_learn_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.cluster", None)
    with pytest.raises(ImportError, match=r"pip install lightning-fedkg\[clustered\]"):
        partition_by_clusters(community_kg(), 2)
    # one client needs no clustering
    assert partition_by_clusters(community_kg(), 1).num_clients == 1


@needs_sklearn
def test_config_accepts_clustered_and_a_federated_run_loads_it():
    from lightning_fedkg.config import ConfigError, load_config
    from lightning_fedkg.federated.party import load_federated_kg

    cfg = load_config(None, ["data.name=umls", "data.partition=clustered", "data.num_clients=3"])
    assert cfg.data.partition == "clustered"
    fkg = load_federated_kg(cfg)
    assert fkg.name == "umls-C3" and fkg.relation_existence().sum(0).max() == 1
    with pytest.raises(ConfigError):
        load_config(None, ["data.partition=clusters"])
