"""RotatE (Sun et al., ICLR 2019): a relation rotates the head in complex space."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_fedkg.models.kge.families import DistanceModel

__all__ = ["RotatE"]


class _ComplexModulus(torch.autograd.Function):
    """``|re + i im|`` via ``torch.hypot`` with gradient 0 at the origin.

    ``hypot``'s own gradient is NaN at 0 (reached when a rotated head equals the tail);
    a norm over stacked ``(re, im)`` pairs avoids that but is ~2x slower.
    """

    @staticmethod
    def forward(ctx, re: Tensor, im: Tensor) -> Tensor:
        out = torch.hypot(re, im)
        ctx.save_for_backward(re, im, out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor]:
        re, im, out = ctx.saved_tensors
        scale = torch.where(out > 0, grad / out, torch.zeros_like(out))
        return scale * re, scale * im


class RotatE(DistanceModel):
    """RotatE: Sun, Deng, Nie, Tang, "RotatE: Knowledge Graph Embedding by Relational
    Rotation in Complex Space", ICLR 2019.

    Entities are complex vectors stored as ``[re || im]`` (width ``2d``); relations are
    ``d`` raw values turned into phases ``theta = r * pi / rho``.
    ``s(h, r, t) = gamma - sum_k |h_k e^{i theta_k} - t_k|`` (a sum of complex moduli, as
    in the reference code, not an L2 norm over the whole vector).
    """

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 10.0,
                 epsilon: float = 2.0):
        super().__init__(num_entities, num_relations, dim, gamma, epsilon,
                         entity_width=2 * dim, relation_width=dim)

    def _rotate(self, e: Tensor, r: Tensor, inverse: bool = False) -> Tensor:
        """``e * exp(+-i theta_r)`` for ``e`` ``[B, 2d]``; the inverse rotates by ``-theta``."""
        theta = self.lookup(self.relation_emb, r) * (math.pi / self.embedding_range)
        cos, sin = torch.cos(theta), torch.sin(theta)
        if inverse:
            sin = -sin
        re, im = e.chunk(2, dim=-1)
        return torch.cat([re * cos - im * sin, re * sin + im * cos], dim=-1)

    def _distance(self, x: Tensor, y: Tensor) -> Tensor:
        d_re, d_im = (x - y).chunk(2, dim=-1)
        return _ComplexModulus.apply(d_re, d_im).sum(-1)

    def forward(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        h, r, t = head_index, rel_type, tail_index
        return self.gamma - self._distance(self._rotate(self.lookup(self.entity_emb, h), r),
                                           self.lookup(self.entity_emb, t))

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        return self._rotate(self.lookup(self.entity_emb, h), r)

    def _head_query(self, r: Tensor, t: Tensor) -> Tensor:
        # |h e^{i theta} - t| = |h - t e^{-i theta}| since |e^{i theta}| = 1
        return self._rotate(self.lookup(self.entity_emb, t), r, inverse=True)
