"""Filtered link-prediction ranks and a summing rank metric.

The four evaluation protocols in the FedKG literature (FedE, FedLU/RotatE, OpenKE, KGReasoning)
differ in how ties between the target and other candidates are resolved; see the ``ties``
argument of :func:`filtered_ranks`. Filtered candidates are removed by boolean masks rather
than by overwriting scores, so a model that legitimately produces ``-inf`` scores still ranks
correctly. :func:`sampled_ranks` ranks against a sample of ``K`` candidates instead of all
(``train.eval_candidates``, for graphs too large to rank against every entity).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric

TIE_MODES = ("optimistic", "pessimistic", "mean", "arbitrary")
HITS_AT = (1, 3, 5, 10)
#: The link-prediction metrics a split reports (``RankingMetric.compute()`` less ``count``).
METRIC_KEYS = ("mrr", "mr", *(f"hits@{k}" for k in HITS_AT))


def filtered_ranks(
    scores: Tensor,
    targets: Tensor,
    filter_row: Tensor | None = None,
    filter_col: Tensor | None = None,
    ties: str = "mean",
    candidate_mask: Tensor | None = None,
) -> Tensor:
    """Rank of each query's target among its candidates (1 = best), filtered setting.

    Args:
        scores: ``[B, N]`` scores of every entity for each query; higher is better.
        targets: ``LongTensor[B]``, the entity id whose rank is wanted.
        filter_row, filter_col: ``LongTensor[K]`` pairs (query row, entity id) of other true
            answers that must not compete with the target. A pair that names the target
            itself is ignored: the target is never filtered.
        ties: how candidates scoring exactly the target's score count:

            * ``"optimistic"``: rank = 1 + #strictly better (OpenKE).
            * ``"pessimistic"``: rank = 1 + #better-or-equal other candidates.
            * ``"mean"``: the average of the two (the "realistic" rank).
            * ``"arbitrary"``: ties broken by entity id, lower id first: the position a
              stable descending sort gives, a deterministic stand-in for the reference
              FedE/FedLU code's sort position.
        candidate_mask: optional ``BoolTensor[N]`` (shared) or ``[B, N]`` (per query); only
            entities marked True compete (e.g. FedE ranks among the client's training
            entities). The target always takes part.

    Returns:
        ``FloatTensor[B]`` of ranks (integers, or halves for ``"mean"``).

    NaN scores (a diverged model) never help: a competitor scoring NaN counts as ``-inf``,
    and a target scoring NaN ranks last, ``1 + #competitors``, in every tie mode.
    """
    if ties not in TIE_MODES:
        raise ValueError(f"ties must be one of {TIE_MODES}, got {ties!r}")
    if scores.dim() != 2:
        raise ValueError(f"scores must be [B, N], got shape {tuple(scores.shape)}")
    num_queries, num_candidates = scores.shape
    targets = targets.to(device=scores.device, dtype=torch.long)
    rows = torch.arange(num_queries, device=scores.device)

    competes = torch.ones_like(scores, dtype=torch.bool)
    if candidate_mask is not None:
        competes &= candidate_mask.to(device=scores.device, dtype=torch.bool).expand_as(scores)
    if filter_row is not None and filter_col is not None and filter_row.numel() > 0:
        competes[filter_row.to(scores.device), filter_col.to(scores.device)] = False
    # The target is not its own competitor; excluding it here also undoes any filter entry
    # or candidate-mask entry that names it.
    competes[rows, targets] = False

    target_scores = scores[rows, targets]
    candidate_ids = torch.arange(num_candidates, device=scores.device)
    return _count_ranks(scores, target_scores, competes, candidate_ids, targets, ties)


def _count_ranks(scores: Tensor, target_scores: Tensor, competes: Tensor, candidate_ids: Tensor, targets: Tensor,
                 ties: str) -> Tensor:
    """``[B]`` ranks of ``target_scores`` among the ``scores`` ``[B, c]`` of the competitors
    (``competes``), candidate ``j`` being entity ``candidate_ids[j]`` (for ``"arbitrary"``)."""
    target_nan = target_scores.isnan()
    # Comparisons with NaN are all False, which would rank a NaN target first (MRR 1.0 for
    # a diverged model). Competitors scoring NaN become -inf; a NaN target is overridden
    # below, after the comparisons.
    scores = scores.masked_fill(scores.isnan(), float("-inf"))
    target_scores = target_scores.unsqueeze(1)
    better = ((scores > target_scores) & competes).sum(dim=1)
    if ties == "optimistic":
        ranks = (1 + better).float()
    else:
        equal = (scores == target_scores) & competes
        if ties == "arbitrary":
            lower_id = candidate_ids.unsqueeze(0) < targets.unsqueeze(1)
            ranks = (1 + better + (equal & lower_id).sum(dim=1)).float()
        elif ties == "pessimistic":
            ranks = (1 + better + equal.sum(dim=1)).float()
        else:
            ranks = 1.0 + better.float() + 0.5 * equal.sum(dim=1).float()
    worst = (1 + competes.sum(dim=1)).float()
    return torch.where(target_nan, worst, ranks)


def draw_candidates(pool_size: int, k: int, generator: torch.Generator) -> Tensor:
    """``k`` distinct positions in ``[0, pool_size)``, a uniformly random ``k``-subset in random
    order (``k < pool_size``), drawn on ``generator``'s device.

    For ``k`` up to a quarter of the pool: the first ``k`` distinct values of ``2k`` uniform
    draws (each new value of an i.i.d. uniform sequence is uniform over the values not seen
    yet), O(k log k); otherwise, or if those draws hold fewer than ``k`` values, the first
    ``k`` of a random permutation, O(pool_size).
    """
    device = generator.device
    if 4 * k <= pool_size:
        draws = torch.randint(0, pool_size, (2 * k,), generator=generator, device=device)
        values, inverse = torch.unique(draws, return_inverse=True)
        if values.numel() >= k:
            first = torch.full_like(values, draws.numel()).scatter_reduce_(
                0, inverse, torch.arange(draws.numel(), device=device), "amin")
            return draws[first.sort().values[:k]]
    return torch.randperm(pool_size, generator=generator, device=device)[:k]


def sampled_ranks(
    candidate_scores: Tensor,
    target_scores: Tensor,
    candidate_ids: Tensor,
    targets: Tensor,
    filter_row: Tensor | None = None,
    filter_col: Tensor | None = None,
    ties: str = "mean",
) -> Tensor:
    """Filtered ranks of each query's target among a sample of candidates shared by the batch.

    Args:
        candidate_scores: ``[B, K]`` scores of the sampled entities ``candidate_ids`` (``[K]``,
            distinct) for each query.
        target_scores: ``[B]`` score of each query's target.
        targets: ``[B]`` target entity ids.
        filter_row, filter_col: the other true answers, as in :func:`filtered_ranks`; a
            sampled candidate that is one of them does not compete.
        ties: as in :func:`filtered_ranks` (``"arbitrary"`` orders tied entities by id).

    Returns:
        ``[B]`` ranks among the target and the sampled candidates that compete (neither the
        target itself nor a filtered answer), in ``1 .. 1 + K``.

    The estimator: when ``candidate_ids`` is a uniformly random ``K``-subset of a pool of
    ``M`` entities, each competitor of the full ranking is in the sample with probability
    ``K / M``, so ``E[rank - 1] = (full rank - 1) · K / M`` in every tie mode (each counts
    competitors linearly), i.e. ``(rank - 1) · M / K`` estimates the full filtered rank
    minus one without bias. MRR and Hits@k of sampled ranks are not estimates of the full
    ones (both are non-linear in the rank and higher than the full-ranking values); they are
    comparable between runs at the same ``K`` (OGB's ``ogbl-wikikg2`` reports such an MRR
    with 500 negatives per side).
    """
    if ties not in TIE_MODES:
        raise ValueError(f"ties must be one of {TIE_MODES}, got {ties!r}")
    targets = targets.to(device=candidate_scores.device, dtype=torch.long)
    competes = candidate_ids.unsqueeze(0) != targets.unsqueeze(1)
    if filter_row is not None and filter_col is not None and filter_row.numel() > 0:
        # Filtered answers among the candidates: a binary search in the sorted sample, O(F log K).
        ordered, order = candidate_ids.sort()
        col = filter_col.to(candidate_scores.device)
        pos = torch.searchsorted(ordered, col).clamp_(max=ordered.numel() - 1)
        hit = ordered[pos] == col
        competes[filter_row.to(candidate_scores.device)[hit], order[pos[hit]]] = False
    return _count_ranks(candidate_scores, target_scores, competes, candidate_ids, targets, ties)


class RankingMetric(Metric):
    """MRR, MR and Hits@{1,3,5,10} accumulated from ranks with summing states.

    Only sums are stored (``dist_reduce_fx="sum"``), so the metric costs O(1) memory and is
    exact under distributed reduction, unlike ``torchmetrics.retrieval`` which keeps every
    prediction. Ranks are multiples of 0.5 for every tie mode, so the rank sum is stored
    exactly as an integer count of half-ranks; hits and the query count are integers too.

    ``compute()`` returns a dict of 0-dim tensors: ``mrr``, ``mr``, ``hits@1``, ``hits@3``,
    ``hits@5``, ``hits@10`` (float) and ``count`` (long). With no updates the float entries
    are NaN.
    """

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def __init__(self, hits_at: tuple[int, ...] = HITS_AT, **kwargs) -> None:
        super().__init__(**kwargs)
        self.hits_at = tuple(int(k) for k in hits_at)
        self.add_state("rr_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("half_rank_sum", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("hits", default=torch.zeros(len(self.hits_at), dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.register_buffer("_hits_at", torch.tensor(self.hits_at, dtype=torch.float64), persistent=False)

    def update(self, ranks: Tensor) -> None:  # type: ignore[override]
        """Add a batch of ranks (any shape; values ≥ 1)."""
        ranks = ranks.detach().reshape(-1).to(device=self.rr_sum.device, dtype=torch.float64)
        self.rr_sum += ranks.reciprocal().sum()
        self.half_rank_sum += torch.round(2.0 * ranks).long().sum()
        self.hits += (ranks.unsqueeze(1) <= self._hits_at.to(ranks.device)).sum(dim=0)
        self.count += ranks.numel()

    def compute(self) -> dict[str, Tensor]:  # type: ignore[override]
        n = self.count.to(torch.float64)
        if self.count.item() == 0:
            n = torch.tensor(math.nan, dtype=torch.float64, device=self.count.device)
        out = {
            "mrr": (self.rr_sum / n).float(),
            "mr": (self.half_rank_sum.to(torch.float64) / (2.0 * n)).float(),
        }
        for k, h in zip(self.hits_at, self.hits):
            out[f"hits@{k}"] = (h.to(torch.float64) / n).float()
        out["count"] = self.count.clone()
        return out


def empty_metrics(hits_at: tuple[int, ...] = HITS_AT) -> dict[str, float | int]:
    """The metrics of zero ranked queries as plain numbers: NaN values and ``count`` 0.

    The same dict :func:`metrics_to_floats` makes of an un-updated :class:`RankingMetric`,
    without the warning torchmetrics gives for computing one. A weighted average over
    clients that weights by ``count`` (or by evaluation triples) skips it.
    """
    out: dict[str, float | int] = {"mrr": math.nan, "mr": math.nan}
    out.update({f"hits@{k}": math.nan for k in hits_at})
    out["count"] = 0
    return out


def metrics_to_floats(metrics: dict[str, Tensor]) -> dict[str, float | int]:
    """Turn :meth:`RankingMetric.compute` output into plain Python numbers (``count`` → int)."""
    return {k: (int(v) if k == "count" else float(v)) for k, v in metrics.items()}
