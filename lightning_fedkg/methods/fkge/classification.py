"""Triple classification with per-relation thresholds (FKGE evaluation protocol).

Protocol (Socher et al., 2013, "Reasoning With Neural Tensor Networks for Knowledge Base
Completion"; used by OpenKE and FKGE, Peng et al. 2021): every valid and test triple gets one
negative by corrupting its head or tail with an entity such that the corrupted triple is not a
known true triple. A triple is classified as true when its score reaches the threshold of its
relation; thresholds are chosen on valid to maximise accuracy and applied to test. Relations
that do not occur in valid fall back to one global threshold chosen the same way over all valid
pairs.

Everything works on scores (higher = more plausible) through a ``score_fn(h, r, t) -> [B]``
callable, so any model can be evaluated.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from lightning_fedkg.keys import pack_keys

ScoreFn = Callable[[Tensor, Tensor, Tensor], Tensor]


def _triple_keys(triples: Tensor, num_entities: int, num_relations: int) -> Tensor:
    """Unique int64 key per (h, r, t) for set membership via ``torch.isin``."""
    h, r, t = triples[:, 0], triples[:, 1], triples[:, 2]
    return pack_keys((h, r, t), (num_entities, num_relations, num_entities), "triples")


def _relation_pools(known: Tensor, column: int, num_relations: int) -> tuple[Tensor, Tensor, Tensor]:
    """CSR of the distinct entities seen in ``column`` (0 head, 2 tail) of each relation."""
    pairs = torch.unique(known[:, [1, column]], dim=0)  # sorted by relation, then entity
    counts = torch.bincount(pairs[:, 0], minlength=num_relations)
    starts = torch.cumsum(counts, 0) - counts
    return pairs[:, 1], starts, counts


def corrupt_triples(
    triples: Tensor,
    num_entities: int,
    known_triples: Tensor,
    generator: torch.Generator,
    corruption: str = "both",
    type_constraint: bool = False,
    max_rounds: int = 200,
) -> Tensor:
    """One negative per triple: replace the head or tail so the result is not a known triple.

    Args:
        triples: ``LongTensor[E, 3]`` positives.
        num_entities: entity ids are drawn from ``0..num_entities-1``.
        known_triples: ``LongTensor[K, 3]`` true triples to avoid (the positives themselves are
            always avoided too).
        generator: CPU ``torch.Generator``; the only source of randomness.
        corruption: ``"both"`` (head or tail with probability ½ each) or ``"tail"``.
        type_constraint: draw replacement tails (heads) among the entities seen as tails
            (heads) of the same relation in ``known_triples`` (the OpenKE/FKGE variant).
            Triples still unresolved after half of ``max_rounds`` fall back to uniform entities,
            since a relation with a single tail cannot be corrupted inside its type.
        max_rounds: rejection rounds; all still-unresolved triples are redrawn each round.

    Returns:
        ``LongTensor[E, 3]`` on the CPU.

    Raises:
        RuntimeError: if some triple cannot be corrupted within ``max_rounds``.
    """
    if corruption not in ("both", "tail"):
        raise ValueError(f"corruption must be 'both' or 'tail', got {corruption!r}")
    triples = triples.detach().cpu().long()
    known = torch.cat([known_triples.detach().cpu().long(), triples])
    num_relations = int(known[:, 1].max()) + 1 if len(known) else 1
    known_keys = torch.unique(_triple_keys(known, num_entities, num_relations))
    if type_constraint:
        tail_pool = _relation_pools(known, 2, num_relations)
        head_pool = _relation_pools(known, 0, num_relations)

    negatives = triples.clone()
    pending = torch.arange(len(triples))
    for round_ in range(max_rounds):
        if len(pending) == 0:
            break
        rows = triples[pending].clone()
        n = len(rows)
        if corruption == "both":
            head_side = torch.rand(n, generator=generator) < 0.5
        else:
            head_side = torch.zeros(n, dtype=torch.bool)
        entities = torch.randint(num_entities, (n,), generator=generator)
        if type_constraint and round_ < max_rounds // 2:
            u = torch.rand(n, generator=generator)
            for side_mask, (pool, starts, counts) in ((~head_side, tail_pool), (head_side, head_pool)):
                rel = rows[side_mask, 1]
                offset = (u[side_mask] * counts[rel]).long().clamp_max(counts[rel] - 1)
                entities[side_mask] = pool[starts[rel] + offset]
        rows[:, 0] = torch.where(head_side, entities, rows[:, 0])
        rows[:, 2] = torch.where(head_side, rows[:, 2], entities)
        negatives[pending] = rows
        still_true = torch.isin(_triple_keys(rows, num_entities, num_relations), known_keys)
        pending = pending[still_true]
    if len(pending):
        raise RuntimeError(
            f"could not corrupt {len(pending)} triple(s) into unknown triples in {max_rounds} rounds"
        )
    return negatives


def _sweep(scores: Tensor, labels: Tensor, groups: Tensor, num_groups: int) -> tuple[Tensor, Tensor]:
    """Accuracy-maximising threshold per group, and the number of pairs each group gets right.

    A pair is predicted true iff ``score >= threshold``. Candidate cuts per group, in order of
    preference on equal accuracy: "nothing is true" (threshold +inf), then a cut below each
    distinct score from the highest down, placed midway to the next lower score, or at the
    lowest score itself for the last cut. Groups without pairs get threshold NaN.
    """
    scores = scores.double()
    labels = labels.bool()
    if scores.numel() == 0:
        return torch.full((num_groups,), float("nan"), dtype=torch.float64), torch.zeros(num_groups, dtype=torch.long)
    # stable two-pass sort: by group ascending, and within a group by score descending
    order = torch.sort(scores, descending=True, stable=True).indices
    order = order[torch.sort(groups[order], stable=True).indices]
    s, y, g = scores[order], labels[order].long(), groups[order]

    sizes = torch.bincount(g, minlength=num_groups)
    n_pos = torch.bincount(g, weights=y.double(), minlength=num_groups).long()
    n_neg = sizes - n_pos
    seg_start = torch.cumsum(sizes, 0) - sizes
    position = torch.arange(len(s))
    in_group_index = position - seg_start[g]
    cum_pos = torch.cumsum(y, 0)
    cum_pos = cum_pos - (cum_pos[seg_start[g]] - y[seg_start[g]])  # restart at each group
    cum_neg = in_group_index + 1 - cum_pos
    correct = cum_pos + (n_neg[g] - cum_neg)  # top-(i+1) predicted true

    last_in_group = in_group_index == sizes[g] - 1
    next_s = torch.cat([s[1:], s.new_full((1,), float("-inf"))])
    valid_cut = last_in_group | (s != next_s)
    cut_threshold = torch.where(last_in_group, s, (s + next_s) / 2)

    correct = torch.where(valid_cut, correct, torch.full_like(correct, -1))
    best = n_neg.clone()  # the "nothing is true" cut
    best = best.scatter_reduce(0, g, correct, reduce="amax")
    # first (highest-threshold) cut that reaches the best count
    hits_best = valid_cut & (correct == best[g])
    sentinel = len(s)
    first = torch.full((num_groups,), sentinel, dtype=torch.long)
    first = first.scatter_reduce(0, g, torch.where(hits_best, position, torch.full_like(position, sentinel)), reduce="amin")

    thresholds = torch.full((num_groups,), float("nan"), dtype=torch.float64)
    has_data = sizes > 0
    none_true_wins = has_data & (n_neg == best)
    thresholds[none_true_wins] = float("inf")
    use_cut = has_data & ~none_true_wins
    thresholds[use_cut] = cut_threshold[first[use_cut]]
    return thresholds, torch.where(has_data, best, torch.zeros_like(best))


def best_thresholds(scores: Tensor, labels: Tensor, relations: Tensor, num_relations: int) -> Tensor:
    """Per-relation thresholds maximising classification accuracy (vectorized sweep).

    Args:
        scores: ``[M]`` scores (higher = more plausible).
        labels: ``BoolTensor[M]``, True for true triples.
        relations: ``LongTensor[M]`` relation id of each pair.
        num_relations: size of the returned table.

    Returns:
        ``FloatTensor[num_relations]`` (float64); predict true iff ``score >= threshold``.
        Relations without data get the global threshold (one sweep over all pairs). On equal
        accuracy the highest threshold wins; thresholds sit midway between adjacent distinct
        scores, ``+inf`` means "classify everything as false".
    """
    scores, labels, relations = scores.detach().cpu(), labels.detach().cpu(), relations.detach().cpu().long()
    per_relation, _ = _sweep(scores, labels, relations, num_relations)
    global_threshold, _ = _sweep(scores, labels, torch.zeros_like(relations), 1)
    return torch.where(torch.isnan(per_relation), global_threshold.expand_as(per_relation), per_relation)


def classification_accuracy(scores: Tensor, labels: Tensor, relations: Tensor, thresholds: Tensor) -> float:
    """Fraction of pairs where ``score >= thresholds[relation]`` agrees with the label."""
    scores, labels = scores.detach().cpu().double(), labels.detach().cpu().bool()
    predicted = scores >= thresholds.cpu()[relations.detach().cpu().long()]
    return (predicted == labels).double().mean().item()


@torch.no_grad()
def _score_all(score_fn: ScoreFn, triples: Tensor, device: torch.device, batch_size: int) -> Tensor:
    out = []
    with torch.autocast(device_type=device.type, enabled=False):
        for chunk in torch.split(triples.to(device), batch_size):
            out.append(score_fn(chunk[:, 0], chunk[:, 1], chunk[:, 2]).float().cpu())
    return torch.cat(out) if out else torch.zeros(0)


def triple_classification(
    score_fn: ScoreFn,
    valid_triples: Tensor,
    test_triples: Tensor,
    num_entities: int,
    known_triples: Tensor,
    generator: torch.Generator,
    num_relations: int | None = None,
    corruption: str = "both",
    type_constraint: bool = False,
    batch_size: int = 4096,
    device: torch.device | str | None = None,
) -> dict:
    """Triple-classification accuracy on test with per-relation thresholds tuned on valid.

    Args:
        score_fn: ``score_fn(h, r, t) -> Tensor[B]``, e.g. a ``KGEModel``'s ``forward``.
            Called under ``torch.no_grad()`` with autocast disabled, in chunks of ``batch_size``.
        valid_triples, test_triples: ``LongTensor[E, 3]`` positives.
        num_entities: entity id range for corruption.
        known_triples: true triples negatives must avoid (usually train ∪ valid ∪ test).
        generator: CPU generator for the corruption; the same seed gives the same negatives.
        num_relations: size of the threshold table (default: 1 + the largest relation id seen).
        corruption, type_constraint: see :func:`corrupt_triples`.
        device: where triples are sent for scoring (default: ``valid_triples.device``).

    Returns:
        ``{"accuracy": float, "valid_accuracy": float, "thresholds": Tensor[R] (float64)}``.
    """
    device = torch.device(device) if device is not None else valid_triples.device
    if num_relations is None:
        num_relations = int(torch.cat([valid_triples[:, 1], test_triples[:, 1], known_triples[:, 1]]).max()) + 1

    def pairs(triples: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        negatives = corrupt_triples(triples, num_entities, known_triples, generator, corruption, type_constraint)
        both = torch.cat([triples.cpu().long(), negatives])
        labels = torch.cat([torch.ones(len(triples), dtype=torch.bool), torch.zeros(len(negatives), dtype=torch.bool)])
        return _score_all(score_fn, both, device, batch_size), labels, both[:, 1]

    valid_scores, valid_labels, valid_rel = pairs(valid_triples)
    test_scores, test_labels, test_rel = pairs(test_triples)
    thresholds = best_thresholds(valid_scores, valid_labels, valid_rel, num_relations)
    return {
        "accuracy": classification_accuracy(test_scores, test_labels, test_rel, thresholds),
        "valid_accuracy": classification_accuracy(valid_scores, valid_labels, valid_rel, thresholds),
        "thresholds": thresholds,
    }
