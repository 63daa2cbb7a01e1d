"""Query structures, batched answering against a brute-force set oracle, and sampling."""

from __future__ import annotations

import pytest
import torch

from lightning_fedkg.data import load_kg
from lightning_fedkg.methods.fedcqa.queries import (
    STRUCTURES,
    QueryGraph,
    anchors_and_relations,
    answer,
    num_slots,
    sample_queries,
)


@pytest.fixture(scope="module")
def nations():
    kg = load_kg("nations")
    triples = kg.triples("train")
    return kg, triples, QueryGraph.from_triples(triples, kg.num_entities, kg.num_relations)


def edges_with_inverses(triples) -> set:
    out = set()
    for h, r, t in triples.tolist():
        out.add((h, 2 * r, t))
        out.add((t, 2 * r + 1, h))
    return out


def brute_force(node, row: list[int], edges: set, pos: int = 0) -> tuple[set, int]:
    """Set semantics, one query at a time, written independently of the batched code."""
    if node == "e":
        return {row[pos]}, pos + 1
    if isinstance(node, tuple) and len(node) == 2 and isinstance(node[1], tuple) and node[1] \
            and all(x == "r" for x in node[1]):
        current, pos = brute_force(node[0], row, edges, pos)
        for _ in node[1]:
            r = row[pos]
            current = {t for (h, rr, t) in edges if rr == r and h in current}
            pos += 1
        return current, pos
    union = node[-1] == ("u",)
    parts = node[:-1] if union else node
    result = None
    for part in parts:
        sets, pos = brute_force(part, row, edges, pos)
        result = sets if result is None else (result | sets if union else result & sets)
    return result, pos + (1 if union else 0)


def test_slots_by_hand():
    assert {n: num_slots(s) for n, s in STRUCTURES.items()} == {
        "1p": 2, "2p": 3, "3p": 4, "2i": 4, "3i": 6, "ip": 5, "pi": 5, "2u": 5, "up": 6}
    assert anchors_and_relations(STRUCTURES["pi"]) == ([0, 3], [1, 2, 4])
    assert anchors_and_relations(STRUCTURES["up"]) == ([0, 2], [1, 3, 5])


def test_inverse_relations_walk_edges_backwards():
    triples = torch.tensor([[0, 0, 1], [2, 0, 1], [1, 1, 3]])
    graph = QueryGraph.from_triples(triples, 4, 2)
    forward = answer(STRUCTURES["1p"], torch.tensor([[0, 0]]), graph)
    inverse = answer(STRUCTURES["1p"], torch.tensor([[1, 1]]), graph)  # (1, r0⁻¹, ?) -> {0, 2}
    assert forward.nonzero()[:, 1].tolist() == [1]
    assert inverse.nonzero()[:, 1].tolist() == [0, 2]
    two_hop = answer(STRUCTURES["2p"], torch.tensor([[0, 0, 2]]), graph)  # 0 -r0-> 1 -r1-> 3
    assert two_hop.nonzero()[:, 1].tolist() == [3]


@pytest.mark.parametrize("name", sorted(STRUCTURES))
def test_batched_answers_match_the_brute_force(nations, name):
    kg, triples, graph = nations
    structure = STRUCTURES[name]
    generator = torch.Generator().manual_seed(1)
    sampled = sample_queries(structure, graph, 40, generator, batch=256)
    # and random instances, most with empty answers, to test the set logic beyond the sampler
    anchors, relations = anchors_and_relations(structure)
    rand = torch.full((40, num_slots(structure)), -1, dtype=torch.long)
    rand[:, anchors] = torch.randint(kg.num_entities, (40, len(anchors)), generator=generator)
    rand[:, relations] = torch.randint(graph.num_relations, (40, len(relations)), generator=generator)
    queries = torch.cat([sampled, rand])
    got = answer(structure, queries, graph)
    edges = edges_with_inverses(triples)
    for row, sets in zip(queries.tolist(), got):
        expected, _ = brute_force(structure, row, edges)
        assert set(sets.nonzero().squeeze(1).tolist()) == expected, (name, row)


@pytest.mark.parametrize("name", sorted(STRUCTURES))
def test_sampled_queries_are_distinct_answerable_and_seeded(nations, name):
    kg, _, graph = nations
    structure = STRUCTURES[name]
    a = sample_queries(structure, graph, 50, torch.Generator().manual_seed(3), batch=128)
    b = sample_queries(structure, graph, 50, torch.Generator().manual_seed(3), batch=128)
    assert torch.equal(a, b) and a.shape == (50, num_slots(structure))
    assert torch.unique(a, dim=0).shape[0] == 50
    assert bool(answer(structure, a, graph).any(1).all())  # the walk's start answers each one
    anchors, relations = anchors_and_relations(structure)
    assert int(a[:, anchors].max()) < kg.num_entities and int(a[:, relations].max()) < graph.num_relations
    if name in ("2i", "3i", "2u"):  # branches of one shape never coincide
        width = 2
        branches = a[:, : width * len(anchors)].view(50, len(anchors), width)
        for i in range(len(anchors)):
            for j in range(i + 1, len(anchors)):
                assert bool((branches[:, i] != branches[:, j]).any(1).all())


@pytest.mark.parametrize("name", ["2p", "ip", "up"])
def test_valid_and_test_sets_split_answers_into_easy_and_hard(name):
    kg = load_kg("nations")
    graphs = tuple(QueryGraph.from_triples(t, kg.num_entities, kg.num_relations) for t in (
        kg.triples("train"), torch.cat([kg.triples("train"), kg.triples("valid")]),
        torch.cat([kg.triples("train"), kg.triples("valid"), kg.triples("test")])))
    edges = [edges_with_inverses(g) for g in (kg.triples("train"), torch.cat([kg.triples("train"), kg.triples("valid")]),
                                                torch.cat([kg.triples("train"), kg.triples("valid"), kg.triples("test")]))]
    from lightning_fedkg.methods.fedcqa.queries import build_query_set

    for split, (on, easy_on) in (("train", (0, None)), ("valid", (1, 0)), ("test", (2, 1))):
        qs = build_query_set(name, graphs, split, 30, torch.Generator().manual_seed(0))
        assert len(qs) == 30 and torch.unique(qs.queries, dim=0).shape[0] == 30
        for i, row in enumerate(qs.queries.tolist()):
            full, _ = brute_force(STRUCTURES[name], row, edges[on])
            easy = set() if easy_on is None else brute_force(STRUCTURES[name], row, edges[easy_on])[0]
            assert set(qs.hard(i).tolist()) == full - easy and qs.hard(i).numel() > 0
            assert set(qs.easy(i).tolist()) == easy


@pytest.mark.parametrize("name", ["2p", "pi", "up"])
def test_cross_graph_queries_span_two_clients_and_are_answered_on_the_union(name):
    from lightning_fedkg.data import load_federated
    from lightning_fedkg.methods.fedcqa.queries import build_query_set, relation_owners, spans_owners, union_split_graphs

    fkg = load_federated("umls", num_clients=3, seed=12345, partition="relation")
    owners = relation_owners(fkg)
    graphs = union_split_graphs(fkg)
    structure = STRUCTURES[name]
    qs = build_query_set(name, graphs, "test", 25, torch.Generator().manual_seed(0),
                         keep=spans_owners(structure, owners))
    assert len(qs) == 25
    _, slots = anchors_and_relations(structure)
    union = {s: [] for s in ("train", "valid", "test")}
    for kg, ent, rel in zip(fkg.clients, fkg.entity_index, fkg.relation_index):
        for s in union:
            t = kg.triples(s)
            union[s].append(torch.stack([ent[t[:, 0]], rel[t[:, 1]], ent[t[:, 2]]], 1))
    valid = edges_with_inverses(torch.cat(union["train"] + union["valid"]))
    test = edges_with_inverses(torch.cat(union["train"] + union["valid"] + union["test"]))
    for i, row in enumerate(qs.queries.tolist()):
        assert len({int(owners[row[s] // 2]) for s in slots}) >= 2  # never one client's query
        full, easy = brute_force(structure, row, test)[0], brute_force(structure, row, valid)[0]
        assert set(qs.hard(i).tolist()) == full - easy and set(qs.easy(i).tolist()) == easy
    # a 1p query has one relation: it can never span two clients
    one = sample_queries(STRUCTURES["1p"], graphs[2], 50, torch.Generator().manual_seed(0))
    assert not bool(spans_owners(STRUCTURES["1p"], owners)(one).any())


def test_federated_query_sets_are_cached_by_content(tmp_path, monkeypatch):
    from lightning_fedkg.data import load_federated
    from lightning_fedkg.methods.fedcqa import query_sets
    from lightning_fedkg.methods.fedcqa.query_sets import QuerySettings, federated_query_sets

    fkg = load_federated("umls", num_clients=3, seed=12345, partition="relation")
    settings = QuerySettings(types=("1p", "2p", "ip"), train_types=("1p", "2p"), train_per_type=90, eval_per_type=30,
                             cross_per_type=10)
    first = federated_query_sets(fkg, settings, tmp_path / "cache")
    assert [len(first["clients"][k]["train"]["2p"]) for k in range(3)] == [30, 30, 30]  # 90 / 3 clients
    assert [len(first["clients"][k]["valid"]["ip"]) for k in range(3)] == [10, 10, 10]
    assert set(first["cross"]) == {"2p", "ip"} and len(first["cross"]["2p"]) == 10  # no cross-graph 1p
    assert set(first["clients"][0]["train"]) == {"1p", "2p"} and set(first["clients"][0]["test"]) == {"1p", "2p", "ip"}
    for k, kg in enumerate(fkg.clients):  # in-graph sets are in the client's local ids
        q = first["clients"][k]["train"]["2p"].queries
        assert int(q[:, 0].max()) < kg.num_entities and int(q[:, 1:].max()) < 2 * kg.num_relations

    def no_sampling(*args, **kwargs):
        raise AssertionError("a cached set was sampled again")

    monkeypatch.setattr(query_sets, "build_query_set", no_sampling)
    second = federated_query_sets(fkg, settings, tmp_path / "cache")
    for k in range(3):
        for split in ("train", "valid", "test"):
            for name in first["clients"][k][split]:
                a, b = first["clients"][k][split][name], second["clients"][k][split][name]
                assert torch.equal(a.queries, b.queries) and torch.equal(a.hard_ids, b.hard_ids)
    with pytest.raises(AssertionError, match="sampled again"):  # another seed is another set
        federated_query_sets(fkg, QuerySettings(types=("2p",), train_types=("2p",), train_per_type=90,
                                                eval_per_type=30, cross_per_type=10, seed=1), tmp_path / "cache")


def test_1p_sets_enumerate_every_anchor_relation_pair(nations):
    from lightning_fedkg.methods.fedcqa.queries import build_query_set

    kg, triples, graph = nations
    graphs = (graph, graph, graph)
    qs = build_query_set("1p", graphs, "train", 10**6, torch.Generator().manual_seed(0))
    expected = {(h, r) for (h, r, _) in edges_with_inverses(triples)}
    assert {tuple(x) for x in qs.queries.tolist()} == expected and len(qs) == len(expected)
