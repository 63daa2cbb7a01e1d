"""Triple classification: threshold sweep vs brute force, corruption, separable oracle."""

import math

import pytest
import torch

from lightning_fedkg.methods.fkge.classification import (
    best_thresholds,
    classification_accuracy,
    corrupt_triples,
    triple_classification,
)


def brute_force_threshold(scores, labels):
    """Try every candidate cut explicitly; first best wins (highest threshold)."""
    values = sorted(set(scores), reverse=True)
    candidates = [math.inf] + [(a + b) / 2 for a, b in zip(values, values[1:])] + [values[-1]]
    best_acc, best_thr = -1.0, None
    for thr in candidates:
        acc = sum((s >= thr) == y for s, y in zip(scores, labels)) / len(scores)
        if acc > best_acc:
            best_acc, best_thr = acc, thr
    return best_thr, best_acc


@pytest.mark.parametrize("seed", range(5))
def test_best_thresholds_match_brute_force(seed):
    g = torch.Generator().manual_seed(seed)
    num_relations, m = 6, 120
    relations = torch.randint(num_relations - 1, (m,), generator=g)  # relation 5 never occurs
    scores = torch.randint(0, 8, (m,), generator=g).float()  # many ties
    labels = torch.rand(m, generator=g) < torch.sigmoid(scores - 3.5)
    thresholds = best_thresholds(scores, labels, relations, num_relations)
    assert thresholds.shape == (num_relations,)

    global_thr, _ = brute_force_threshold(scores.tolist(), labels.tolist())
    for r in range(num_relations):
        sel = relations == r
        if sel.any():
            thr, acc = brute_force_threshold(scores[sel].tolist(), labels[sel].tolist())
            assert thresholds[r].item() == thr
            # no threshold whatsoever does better: check a dense grid too
            grid = [x / 4 for x in range(-4, 40)]
            grid_best = max(((scores[sel] >= t) == labels[sel]).double().mean().item() for t in grid)
            assert acc >= grid_best - 1e-12
        else:
            assert thresholds[r].item() == global_thr

    per_rel_acc = classification_accuracy(scores, labels, relations, thresholds)
    brute = sum(brute_force_threshold(scores[relations == r].tolist(), labels[relations == r].tolist())[1]
                * (relations == r).sum().item() for r in range(num_relations) if (relations == r).any()) / m
    assert per_rel_acc == pytest.approx(brute, abs=1e-12)


def test_best_thresholds_hand_case():
    # relation 0, descending: 5(+) 4.5(-) 4(+) 3(-). Cuts and correct counts:
    # inf 2/4, 4.75 3/4, 4.25 2/4, 3.5 3/4, 3 2/4 -> the first (highest) best cut is 4.75
    scores = torch.tensor([5.0, 4.0, 3.0, 4.5, 1.0, 2.0])
    labels = torch.tensor([True, True, False, False, False, True])
    relations = torch.tensor([0, 0, 0, 0, 1, 1])
    thr = best_thresholds(scores, labels, relations, 2)
    assert thr[0].item() == 4.75
    assert thr[1].item() == 1.5  # 2 positive, 1 negative: separable with the midpoint
    # all-negative relation: +inf is the best (and highest) threshold
    thr = best_thresholds(torch.tensor([1.0, 2.0]), torch.tensor([False, False]), torch.tensor([0, 0]), 1)
    assert thr[0].item() == math.inf


def test_corrupt_triples_avoids_known_and_changes_one_side():
    g = torch.Generator().manual_seed(0)
    n, r = 12, 2
    known = torch.stack([torch.randint(n, (80,), generator=g), torch.randint(r, (80,), generator=g),
                         torch.randint(n, (80,), generator=g)], 1).unique(dim=0)
    positives = known[:30]
    neg = corrupt_triples(positives, n, known, torch.Generator().manual_seed(1))
    known_set = set(map(tuple, known.tolist()))
    assert not any(tuple(t) in known_set for t in neg.tolist())
    assert torch.equal(neg[:, 1], positives[:, 1])
    changed = (neg[:, [0, 2]] != positives[:, [0, 2]]).sum(1)
    assert torch.all(changed == 1)
    assert (neg[:, 0] != positives[:, 0]).any() and (neg[:, 2] != positives[:, 2]).any()  # both sides used
    again = corrupt_triples(positives, n, known, torch.Generator().manual_seed(1))
    assert torch.equal(neg, again)
    tail_only = corrupt_triples(positives, n, known, torch.Generator().manual_seed(1), corruption="tail")
    assert torch.equal(tail_only[:, :2], positives[:, :2])


def test_corrupt_triples_type_constraint_uses_relation_tails():
    # relation 0 has tails {1, 2, 3}; relation 1 has tails {7, 8}
    known = torch.tensor([[0, 0, 1], [4, 0, 2], [5, 0, 3], [0, 1, 7], [6, 1, 8]])
    positives = torch.tensor([[0, 0, 1], [0, 1, 7]])
    neg = corrupt_triples(positives, 10, known, torch.Generator().manual_seed(0), corruption="tail",
                          type_constraint=True)
    assert neg[0, 2].item() in (2, 3)
    assert neg[1, 2].item() == 8


def test_corrupt_triples_impossible_raises():
    known = torch.tensor([[0, 0, 0], [0, 0, 1]])
    with pytest.raises(RuntimeError):
        corrupt_triples(torch.tensor([[0, 0, 0]]), 2, known, torch.Generator().manual_seed(0),
                        corruption="tail", max_rounds=5)


def test_perfectly_separable_scores_give_accuracy_one():
    g = torch.Generator().manual_seed(3)
    n, r = 40, 4
    known = torch.stack([torch.randint(n, (300,), generator=g), torch.randint(r, (300,), generator=g),
                         torch.randint(n, (300,), generator=g)], 1).unique(dim=0)
    valid, test = known[:60], known[60:120]
    keys = (known[:, 0] * r + known[:, 1]) * n + known[:, 2]

    def oracle(h, rel, t):
        return torch.isin((h * r + rel) * n + t, keys).float() * 3.0 - 1.0

    out = triple_classification(oracle, valid, test, n, known, torch.Generator().manual_seed(0), num_relations=r)
    assert out["accuracy"] == 1.0 and out["valid_accuracy"] == 1.0
    assert out["thresholds"].shape == (r,)
    assert torch.all((out["thresholds"] > -1.0) & (out["thresholds"] <= 2.0))

    # an uninformative (constant) score cannot beat chance on the balanced test set
    const = triple_classification(lambda h, rel, t: torch.zeros(len(h)), valid, test, n, known,
                                  torch.Generator().manual_seed(0), num_relations=r)
    assert const["accuracy"] == 0.5
