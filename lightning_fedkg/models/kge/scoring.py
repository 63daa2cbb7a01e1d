"""1-vs-many scoring of a KGE model against candidate sets, in chunks.

:class:`CandidateScoring` is the part of :class:`~lightning_fedkg.models.kge.base.KGEModel`
that turns a model's ``_compare`` (queries against candidate vectors) into scores against
every entity, a shared candidate set or one set per row, bounded in memory by
``max_chunk_elements``, and grouped by relation where a model projects its candidates.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["CandidateScoring"]


class CandidateScoring:
    """Chunked scoring over :meth:`_compare` and :meth:`_candidates` (a model's hooks)."""

    def _compare_shared(self, query: Tensor, cand: Tensor) -> Tensor:
        """Scores against one shared candidate matrix ``[n, w]``; chunked broadcast by default."""
        step = self._chunk_len(query.shape[0])
        return torch.cat(
            [self._compare(query, cand[s : s + step]) for s in range(0, cand.shape[0], step)], dim=1
        )

    def _chunk_len(self, batch: int) -> int:
        width = max(self.entity_width, self.relation_width)
        return max(1, self.max_chunk_elements // max(1, batch * width))

    def _score_candidates(self, query: Tensor, r: Tensor, candidates: Tensor | None) -> Tensor:
        batch = query.shape[0]
        if candidates is None:
            candidates = torch.arange(self.num_entities, device=query.device)
        if candidates.dtype != torch.long or candidates.dim() not in (1, 2):
            raise ValueError(
                f"candidates must be a LongTensor [n] or [B, n], got {candidates.dtype} "
                f"{tuple(candidates.shape)}"
            )
        if candidates.dim() == 2 and candidates.shape[0] != batch:
            raise ValueError(
                f"per-row candidates need {batch} rows, got {tuple(candidates.shape)}"
            )
        n = candidates.shape[-1]
        if n == 0:
            return query.new_zeros(batch, 0)
        if candidates.dim() == 1:
            if not self.relation_dependent_candidates:
                return self._compare_shared(query, self._candidates(candidates, r))
            rels, group = torch.unique(r, return_inverse=True)
            # Measured on CPU: grouping wins ~5x with few distinct relations and breaks even
            # near one relation per two rows; beyond that, broadcast.
            if 2 * rels.numel() <= batch:
                return self._score_shared_by_relation(query, rels, group, candidates)
        step = self._chunk_len(batch)
        chunks = [
            self._compare(query, self._candidates(candidates[..., s : s + step], r))
            for s in range(0, n, step)
        ]
        return torch.cat(chunks, dim=1)

    def _score_shared_by_relation(self, query: Tensor, rels: Tensor, group: Tensor,
                                  ids: Tensor) -> Tensor:
        """Shared candidates of a relation-dependent model, batch rows grouped by relation.

        ``rels`` are the distinct relations, ``group[i]`` the index into ``rels`` of row ``i``.
        The candidates are projected once per group and compared with
        :meth:`_compare_shared` (``cdist`` for the Trans* models, ~20x faster than
        broadcasting ``B x n x w``). The loop runs over at most ``B / 2`` groups, each over
        candidate chunks of ``max_chunk_elements``.
        """
        order = torch.argsort(group, stable=True)
        sizes = torch.bincount(group, minlength=rels.numel()).tolist()
        step = max(1, self.max_chunk_elements // max(self.entity_width, self.relation_width))
        blocks = []
        for rel, rows in zip(rels, order.split(sizes)):
            q = query[rows]
            blocks.append(torch.cat([
                self._compare_shared(q, self._candidates(ids[s : s + step], rel.view(1))[0])
                for s in range(0, ids.numel(), step)
            ], dim=1))
        # blocks hold the rows in `order`; undo that permutation
        return torch.cat(blocks)[torch.argsort(order)]
