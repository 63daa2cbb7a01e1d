"""Filtered ranking and the rank metric, checked against brute-force loops and hand values."""

import math

import pytest
import torch

from lightning_fedkg.evaluation.ranking import TIE_MODES, RankingMetric, filtered_ranks, metrics_to_floats


def brute_force_rank(scores, target, filtered, ties, allowed=None):
    """Rank of one query by listing its competitors explicitly.

    NaN policy: a NaN target ranks behind every competitor; a NaN competitor scores -inf."""
    competitors = [
        e for e in range(len(scores))
        if e != target and e not in filtered and (allowed is None or allowed[e])
    ]
    if math.isnan(scores[target]):
        return 1 + len(competitors)
    scores = [float("-inf") if math.isnan(x) else x for x in scores]
    s = scores[target]
    better = sum(1 for e in competitors if scores[e] > s)
    equal = [e for e in competitors if scores[e] == s]
    if ties == "optimistic":
        return 1 + better
    if ties == "pessimistic":
        return 1 + better + len(equal)
    if ties == "mean":
        return 1 + better + len(equal) / 2
    return 1 + better + sum(1 for e in equal if e < target)


def random_kg_queries(seed, num_entities=23, num_relations=3, num_triples=60):
    """Tail queries of a random KG, with integer scores (many ties) and the true-tail filter."""
    g = torch.Generator().manual_seed(seed)
    triples = torch.stack([
        torch.randint(num_entities, (num_triples,), generator=g),
        torch.randint(num_relations, (num_triples,), generator=g),
        torch.randint(num_entities, (num_triples,), generator=g),
    ], dim=1).unique(dim=0)
    queries = triples[torch.randperm(len(triples), generator=g)[:25]]
    true_tails = {}
    for h, r, t in triples.tolist():
        true_tails.setdefault((h, r), set()).add(t)
    rows, cols = [], []
    for i, (h, r, t) in enumerate(queries.tolist()):
        for other in sorted(true_tails[(h, r)] - {t}):
            rows.append(i)
            cols.append(other)
    scores = torch.randint(0, 5, (len(queries), num_entities), generator=g).float()
    return queries, scores, torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)


@pytest.mark.parametrize("ties", TIE_MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_filtered_ranks_match_brute_force(ties, seed):
    queries, scores, rows, cols = random_kg_queries(seed)
    assert len(rows) > 0  # the random KG must actually exercise the filter
    targets = queries[:, 2]
    got = filtered_ranks(scores, targets, rows, cols, ties=ties)
    expected = []
    for i in range(len(queries)):
        filtered = set(cols[rows == i].tolist())
        expected.append(brute_force_rank(scores[i].tolist(), int(targets[i]), filtered, ties))
    assert got.tolist() == expected


@pytest.mark.parametrize("ties", TIE_MODES)
def test_filtered_ranks_with_candidate_mask_match_brute_force(ties):
    queries, scores, rows, cols = random_kg_queries(5)
    targets = queries[:, 2]
    g = torch.Generator().manual_seed(7)
    allowed = torch.rand(scores.shape[1], generator=g) < 0.6
    got = filtered_ranks(scores, targets, rows, cols, ties=ties, candidate_mask=allowed)
    expected = [
        brute_force_rank(scores[i].tolist(), int(targets[i]), set(cols[rows == i].tolist()), ties, allowed.tolist())
        for i in range(len(queries))
    ]
    assert got.tolist() == expected
    # per-query masks broadcast the same way
    per_row = allowed.expand(len(queries), -1)
    assert filtered_ranks(scores, targets, rows, cols, ties=ties, candidate_mask=per_row).tolist() == expected


@pytest.mark.parametrize("k", [0, 1, 4])
def test_target_tied_with_k_others(k):
    """A target tied with k others -> optimistic 1, pessimistic k+1."""
    scores = torch.full((1, 10), -3.0)
    scores[0, 2 : 2 + k + 1] = 5.0  # target = entity 2, tied with entities 3..2+k
    target = torch.tensor([2])
    assert filtered_ranks(scores, target, ties="optimistic").item() == 1
    assert filtered_ranks(scores, target, ties="pessimistic").item() == k + 1
    assert filtered_ranks(scores, target, ties="mean").item() == 1 + k / 2
    # ties broken by id: entities 3.. come after the target
    assert filtered_ranks(scores, target, ties="arbitrary").item() == 1
    target_last = torch.tensor([2 + k])
    assert filtered_ranks(scores, target_last, ties="arbitrary").item() == k + 1


def test_arbitrary_equals_stable_sort_position():
    """'arbitrary' is the 1-based position of the target in a stable descending sort."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 4, (50, 17), generator=g).float()
    targets = torch.randint(17, (50,), generator=g)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    position = (order == targets.unsqueeze(1)).float().argmax(dim=1) + 1
    assert torch.equal(filtered_ranks(scores, targets, ties="arbitrary"), position.float())


def test_filter_never_removes_target_and_handles_neg_inf():
    scores = torch.tensor([[float("-inf"), 2.0, float("-inf"), 7.0]])
    target = torch.tensor([0])
    # the filter names the target and entity 3; the target stays, entity 3 leaves
    ranks = filtered_ranks(scores, target, torch.tensor([0, 0]), torch.tensor([0, 3]), ties="pessimistic")
    assert ranks.item() == 3  # entity 1 is better, entity 2 ties at -inf
    ranks = filtered_ranks(scores, target, torch.tensor([0, 0]), torch.tensor([0, 3]), ties="optimistic")
    assert ranks.item() == 2


@pytest.mark.parametrize("ties", TIE_MODES)
def test_nan_target_ranks_last_and_nan_competitors_never_win(ties):
    nan, inf = float("nan"), float("inf")
    scores = torch.tensor([
        [nan, 1.0, 2.0, nan, 0.5],  # target 0 is NaN: behind all 4 others
        [nan, 1.0, 2.0, nan, 0.5],  # target 0, entity 4 filtered, entity 2 masked out: 2 left
        [1.0, nan, nan, nan, 0.5],  # target 0: the NaN entities are no threat -> rank 1
        [-inf, nan, 3.0, nan, -inf],  # target 0 at -inf ties with entity 4 and both NaNs
    ])
    targets = torch.tensor([0, 0, 0, 0])
    mask = torch.tensor([[True] * 5, [True, True, False, True, True], [True] * 5, [True] * 5])
    rows, cols = torch.tensor([1]), torch.tensor([4])
    got = filtered_ranks(scores, targets, rows, cols, ties=ties, candidate_mask=mask)
    tie_rank = {"optimistic": 2, "pessimistic": 5, "mean": 3.5, "arbitrary": 2}[ties]
    assert got.tolist() == [5, 3, 1, tie_rank]


@pytest.mark.parametrize("ties", TIE_MODES)
def test_filtered_ranks_with_nan_scores_match_brute_force(ties):
    queries, scores, rows, cols = random_kg_queries(4)
    targets = queries[:, 2]
    g = torch.Generator().manual_seed(11)
    scores[torch.rand(scores.shape, generator=g) < 0.2] = float("nan")
    scores[3, targets[3]] = float("nan")  # at least one NaN target
    allowed = torch.rand(scores.shape[1], generator=g) < 0.7
    got = filtered_ranks(scores, targets, rows, cols, ties=ties, candidate_mask=allowed)
    expected = [
        brute_force_rank(scores[i].tolist(), int(targets[i]), set(cols[rows == i].tolist()), ties, allowed.tolist())
        for i in range(len(queries))
    ]
    assert got.tolist() == expected


def test_invalid_ties_raises():
    with pytest.raises(ValueError):
        filtered_ranks(torch.zeros(1, 3), torch.tensor([0]), ties="random")


def test_metric_on_hand_computed_ranks():
    m = RankingMetric()
    m.update(torch.tensor([1.0, 2.0]))
    m.update(torch.tensor([4.0, 10.0, 2.5]))
    out = metrics_to_floats(m.compute())
    ranks = [1, 2, 4, 10, 2.5]
    assert out["count"] == 5
    assert out["mrr"] == pytest.approx(sum(1 / r for r in ranks) / 5, abs=1e-7)
    assert out["mr"] == pytest.approx(19.5 / 5, abs=1e-7)
    assert out["hits@1"] == pytest.approx(1 / 5)
    assert out["hits@3"] == pytest.approx(3 / 5)
    assert out["hits@5"] == pytest.approx(4 / 5)
    assert out["hits@10"] == pytest.approx(1.0)
    m.reset()
    with pytest.warns(UserWarning):  # torchmetrics warns on compute() before update()
        empty = m.compute()
    assert int(empty["count"]) == 0 and math.isnan(float(empty["mrr"]))


def test_metric_merge_state_sums():
    a, b, both = RankingMetric(), RankingMetric(), RankingMetric()
    ra, rb = torch.tensor([1.0, 3.0, 7.5]), torch.tensor([2.0, 12.0])
    a.update(ra)
    b.update(rb)
    both.update(torch.cat([ra, rb]))
    a.merge_state(b)
    got, want = metrics_to_floats(a.compute()), metrics_to_floats(both.compute())
    assert got == want
