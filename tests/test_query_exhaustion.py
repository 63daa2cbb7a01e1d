"""Query sets run until their count or the graph's exhaustion (checked against a plain-Python
enumeration of the walks), the FedCQA authors' training-answer rule, and ``task.query_set``."""

from __future__ import annotations

from collections import defaultdict
from itertools import product
from pathlib import Path

import pytest
import torch

from lightning_fedkg.config import ConfigError, load_config
from lightning_fedkg.methods.fedcqa import queries
from lightning_fedkg.methods.fedcqa.config import query_settings
from lightning_fedkg.methods.fedcqa.queries import (
    STRUCTURES,
    QueryGraph,
    build_query_set,
    enumerate_queries,
    is_branch,
    is_union,
    sample_queries,
    split_graphs,
)
from test_queries import brute_force, edges_with_inverses

CONFIGS = Path(__file__).resolve().parent.parent / "configs" / "fedcqa"


def walk_oracle(structure, edges: set) -> set:
    """Every instance a walk back from an answer can draw, written with Python sets and
    recursion, apart from the batched code: back along any incoming edge, never straight
    back along the inverse of the relation just taken unless the node has one incoming
    relation; all branches of an intersection or a union start from the same answer; two
    branches of one shape differ; a union's slot is -1."""
    into = defaultdict(list)
    for h, r, t in edges:
        into[t].append((r, h))
    relations_into = {t: {r for r, _ in pairs} for t, pairs in into.items()}

    def walks(node, target) -> list[tuple]:
        if is_branch(node):
            paths = [((), target)]  # (relations from the answer backwards, node reached)
            for _ in node[1]:
                paths = [((*rels, r), h) for rels, at in paths for r, h in into[at]
                         if not rels or r != rels[-1] ^ 1 or len(relations_into[at]) == 1]
            if node[0] == "e":
                return [(start, *reversed(rels)) for rels, start in paths]
            return [(*sub, *reversed(rels)) for rels, start in paths for sub in walks(node[0], start)]
        union = is_union(node)
        parts = node[:-1] if union else node
        out = []
        for combo in product(*(walks(part, target) for part in parts)):
            if any(parts[i] == parts[j] and combo[i] == combo[j]
                   for i in range(len(parts)) for j in range(i + 1, len(parts))):
                continue
            out.append(sum(combo, ()) + ((-1,) if union else ()))
        return out

    return {q for t in into for q in walks(structure, t)}


@pytest.fixture(scope="module")
def tiny():
    """Five entities, three relations, ten triples split 6/1/3: every structure has a
    few hundred instances at most, so any request of 10**6 queries exhausts it."""
    triples = {"train": torch.tensor([[0, 0, 1], [1, 1, 2], [2, 0, 3], [3, 2, 4], [0, 1, 4], [4, 0, 2]]),
               "valid": torch.tensor([[1, 2, 3]]), "test": torch.tensor([[2, 1, 0], [4, 2, 1], [3, 0, 2]])}
    graphs = split_graphs(triples, 5, 3)
    cumulative = [torch.cat([triples[s] for s in ("train", "valid", "test")[:k]]) for k in (1, 2, 3)]
    return graphs, [edges_with_inverses(t) for t in cumulative]


@pytest.mark.parametrize("name", sorted(STRUCTURES))
def test_enumeration_is_every_instance_the_walks_can_draw(tiny, name):
    graphs, edges = tiny
    expected = walk_oracle(STRUCTURES[name], edges[0])
    assert {tuple(q) for q in enumerate_queries(STRUCTURES[name], graphs[0]).tolist()} == expected


@pytest.mark.parametrize("name", sorted(STRUCTURES))
@pytest.mark.parametrize("split", ["train", "test"])
def test_a_set_asked_for_more_than_the_graph_has_holds_all_of_it(tiny, name, split):
    graphs, edges = tiny
    on, easy_on = queries.SPLITS[split]
    structure = STRUCTURES[name]
    qs = build_query_set(name, graphs, split, 10**6, torch.Generator().manual_seed(0))
    got = [tuple(q) for q in qs.queries.tolist()]
    expected = set()
    for q in walk_oracle(structure, edges[on]):  # the candidates, then KGReasoning's hard-answer rule
        full = brute_force(structure, list(q), edges[on])[0]
        easy = set() if easy_on is None else brute_force(structure, list(q), edges[easy_on])[0]
        if full - easy:
            expected.add(q)
    assert len(got) == len(set(got)) and set(got) == expected and expected


def test_the_walks_alone_stall_short_of_a_umls_client_and_the_set_is_completed():
    """The review's case: 2p on a UMLS client's training graph, 2,000 asked."""
    from lightning_fedkg.data import load_federated

    kg = load_federated("umls", num_clients=3, seed=12345, partition="relation").clients[0]
    graphs = split_graphs({s: kg.triples(s) for s in ("train", "valid", "test")}, kg.num_entities, kg.num_relations)
    expected = walk_oracle(STRUCTURES["2p"], edges_with_inverses(kg.triples("train")))
    walked = sample_queries(STRUCTURES["2p"], graphs[0], 2000, torch.Generator().manual_seed(0))
    assert 1000 < walked.shape[0] < len(expected) < 2000  # the walks alone leave some out
    qs = build_query_set("2p", graphs, "train", 2000, torch.Generator().manual_seed(0))
    assert {tuple(q) for q in qs.queries.tolist()} == expected and len(qs) == len(expected)


def test_sets_the_walks_fill_are_never_enumerated(monkeypatch, tiny):
    """Enumeration only completes a short set, so a set the walks fill is drawn as before."""
    kg_graphs, _ = tiny

    def refuse(*args, **kwargs):
        raise AssertionError("enumerated")

    from lightning_fedkg.data import load_kg

    kg = load_kg("nations")
    graphs = split_graphs({s: kg.triples(s) for s in ("train", "valid", "test")}, kg.num_entities, kg.num_relations)
    before = build_query_set("ip", graphs, "test", 40, torch.Generator().manual_seed(5))
    monkeypatch.setattr(queries, "enumerate_queries", refuse)
    again = build_query_set("ip", graphs, "test", 40, torch.Generator().manual_seed(5))
    assert len(again) == 40 and torch.equal(before.queries, again.queries)
    with pytest.raises(AssertionError, match="enumerated"):
        build_query_set("2p", kg_graphs, "train", 10**6, torch.Generator().manual_seed(0))


def test_enumeration_gives_up_past_its_budget(tiny):
    graphs, edges = tiny
    assert enumerate_queries(STRUCTURES["3i"], graphs[2], max_rows=10) is None
    assert enumerate_queries(STRUCTURES["3i"], graphs[2], max_rows=10**6).shape[0] == len(
        walk_oracle(STRUCTURES["3i"], edges[2]))


@pytest.mark.parametrize("split", ["valid", "test"])
def test_require_train_answer_keeps_only_queries_answered_on_the_training_graph(split):
    from lightning_fedkg.data import load_kg

    kg = load_kg("umls")
    triples = {s: kg.triples(s) for s in ("train", "valid", "test")}
    graphs = split_graphs(triples, kg.num_entities, kg.num_relations)
    train_edges = edges_with_inverses(triples["train"])
    plain = build_query_set("2p", graphs, split, 300, torch.Generator().manual_seed(0))
    strict = build_query_set("2p", graphs, split, 300, torch.Generator().manual_seed(0), require_train_answer=True)
    # KGReasoning's rule alone lets in queries with no training answer; the authors' rule does not
    answered = [bool(brute_force(STRUCTURES["2p"], q, train_edges)[0]) for q in plain.queries.tolist()]
    assert not all(answered)
    assert len(strict) == 300
    for i, q in enumerate(strict.queries.tolist()):
        assert brute_force(STRUCTURES["2p"], q, train_edges)[0] and strict.hard(i).numel() > 0
        assert strict.easy(i).numel() > 0  # an answer on the training graph is an easy answer


def test_require_train_answer_has_no_effect_on_training_sets():
    graph = QueryGraph.from_triples(torch.tensor([[0, 0, 1], [1, 1, 2], [2, 0, 0]]), 3, 2)
    graphs = (graph, graph, graph)
    a = build_query_set("2p", graphs, "train", 5, torch.Generator().manual_seed(0))
    b = build_query_set("2p", graphs, "train", 5, torch.Generator().manual_seed(0), require_train_answer=True)
    assert torch.equal(a.queries, b.queries)


# ---------------------------------------------------------------- task.query_set
def settings_of(*overrides):
    return query_settings(load_config(CONFIGS / "umls_fedcqa_gqe.yaml", overrides).task)


def test_the_default_query_set_is_betaes_unchanged():
    s = settings_of()
    assert s.types == ("1p", "2p", "3p", "2i", "3i", "ip", "pi", "2u", "up")
    assert s.train_types == ("1p", "2p", "3p", "2i", "3i") and s.require_train_answer is False
    custom = settings_of("task.types=[1p,2p]", "task.train_types=[1p]", "task.require_train_answer=true")
    assert (custom.types, custom.train_types, custom.require_train_answer) == (("1p", "2p"), ("1p",), True)


def test_the_paper_query_set_is_the_authors_eight_types_all_trained():
    s = settings_of("task.query_set=paper")
    paper = ("1p", "2p", "2i", "3i", "ip", "pi", "2u", "up")
    assert s.types == paper and s.train_types == paper and s.require_train_answer is True
    assert settings_of("task.query_set=paper", "task.require_train_answer=false").require_train_answer is False
    with pytest.raises(ConfigError, match=r"task.query_set: paper sets task.types to \['1p', '2p', '2i'"):
        settings_of("task.query_set=paper", "task.types=[1p,2p]")
    with pytest.raises(ConfigError, match="task.query_set"):
        settings_of("task.query_set=betea")


@pytest.mark.slow
def test_paper_query_sets_have_their_own_cache_keys(tmp_path):
    from lightning_fedkg.data import load_federated
    from lightning_fedkg.methods.fedcqa.query_sets import federated_query_sets

    fkg = load_federated("umls", num_clients=3, seed=12345, partition="relation")
    s = settings_of("task.query_set=paper", "task.train_per_type=30", "task.eval_per_type=30",
                    "task.cross_per_type=10")
    sets = federated_query_sets(fkg, s, tmp_path)
    assert set(sets["clients"][0]["train"]) == set(sets["clients"][0]["test"]) == set(s.types)
    assert set(sets["cross"]) == set(s.types) - {"1p"}
    assert all(sets["clients"][k]["test"][t].easy_offsets.diff().min() > 0 for k in range(3) for t in s.types)
    assert sets["settings"]["require_train_answer"] is True
    files = {p.name for p in tmp_path.iterdir()}
    loose = federated_query_sets(fkg, settings_of("task.query_set=paper", "task.require_train_answer=false",
                                                  "task.train_per_type=30", "task.eval_per_type=30",
                                                  "task.cross_per_type=10"), tmp_path)
    added = {p.name for p in tmp_path.iterdir()} - files
    # the training sets are shared (the rule does not touch them); every evaluation set is new
    assert len(added) == 3 * 8 * 2 + 7
    assert torch.equal(loose["clients"][1]["train"]["up"].queries, sets["clients"][1]["train"]["up"].queries)
