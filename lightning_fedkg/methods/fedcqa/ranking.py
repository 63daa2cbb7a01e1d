"""Filtered ranks of complex queries' hard answers (BetaE's protocol, Ren & Leskovec,
NeurIPS 2020, as FedCQA §5.1 uses it), a batch at a time.

For a query with answers ``A = easy ∪ hard`` and a hard answer ``v``, the filtered rank is
``1 + #{e ∉ A : s(e) > s(v)}``, plus half of ``#{e ∉ A : s(e) = s(v)}`` (ties are shared
evenly, a deterministic stand-in for the official code's random tie-breaking). One score
matrix ``[B, N]`` per batch; every answer of the batch is ranked by two batched binary
searches in the rows sorted with their answers masked out.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["filtered_ranks", "per_query_metrics", "HITS"]

HITS = (1, 3, 10)


def filtered_ranks(scores: Tensor, hard_rows: Tensor, hard_cols: Tensor, easy_rows: Tensor, easy_cols: Tensor) -> Tensor:
    """``[H]`` float ranks of the hard answers ``(hard_rows[i], hard_cols[i])`` of a batch
    whose rows score ``scores [B, N]``; ``easy_*`` are the other answers to filter."""
    b, n = scores.shape
    answers = torch.zeros(b, n, dtype=torch.bool, device=scores.device)
    answers[hard_rows, hard_cols] = True
    answers[easy_rows, easy_cols] = True
    target = scores[hard_rows, hard_cols].float()
    ordered = scores.float().masked_fill(answers, -torch.inf).sort(1).values  # ascending, answers first
    counts = torch.bincount(hard_rows, minlength=b)
    position = torch.arange(hard_rows.numel(), device=scores.device) - (torch.cumsum(counts, 0) - counts)[hard_rows]
    values = torch.full((b, max(int(counts.max()) if counts.numel() else 0, 1)), torch.inf, device=scores.device)
    values[hard_rows, position] = target
    at_most = torch.searchsorted(ordered, values, right=True)
    below = torch.searchsorted(ordered, values, right=False)
    greater = (n - at_most)[hard_rows, position]
    equal = (at_most - below)[hard_rows, position]
    return 1.0 + greater.float() + equal.float() / 2.0


def per_query_metrics(ranks: Tensor, hard_rows: Tensor, num_queries: int) -> dict[str, Tensor]:
    """``{"mrr": [B], "hits@k": [B]}``: each query's mean over its hard answers."""
    counts = torch.bincount(hard_rows, minlength=num_queries).clamp(min=1).float()

    def mean(values: Tensor) -> Tensor:
        return torch.zeros(num_queries, device=ranks.device).index_add_(0, hard_rows, values) / counts

    out = {"mrr": mean(1.0 / ranks)}
    for k in HITS:
        out[f"hits@{k}"] = mean((ranks <= k).float())
    return out
