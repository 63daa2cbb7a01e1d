"""The two score families the models share: distance models (``gamma - distance``, the
Trans* family a special case) and bilinear models (``<query, candidate>``)."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.models.kge.base import KGEModel

__all__ = ["DistanceModel", "TranslationalModel", "BilinearModel", "fused_l1_distances", "relation_space_width",
           "soft_unit_norm"]

log = logging.getLogger("lightning_fedkg")


def relation_space_width(dim: int, relation_dim: int | None) -> int:
    """Relation-space width of TransR/TransD: ``relation_dim`` or, by default, ``dim``."""
    rdim = dim if relation_dim is None else int(relation_dim)
    if rdim < 1:
        raise ValueError(f"relation_dim must be positive, got {relation_dim}")
    return rdim


def soft_unit_norm(x: Tensor) -> Tensor:
    """``sum_i max(0, ||x_i||_2^2 - 1)``: the soft form of the constraint ``||x_i|| <= 1``."""
    return F.relu(x.pow(2).sum(-1) - 1.0).sum()


class DistanceModel(KGEModel):
    """Models scored as ``gamma - distance(query, candidate)``."""

    def _distance(self, x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError

    def _compare(self, query: Tensor, cand: Tensor) -> Tensor:
        if cand.dim() == 2:
            cand = cand.unsqueeze(0)
        return self.gamma - self._distance(query.unsqueeze(1), cand)


class TranslationalModel(DistanceModel):
    """Trans* family: ``gamma - ||proj_r(h) + r - proj_r(t)||_p``."""

    def __init__(self, num_entities, num_relations, dim, gamma=10.0, epsilon=2.0, *,
                 p_norm: float = 1.0, **tables):
        if p_norm <= 0:
            raise ValueError(f"p_norm must be positive, got {p_norm}")
        super().__init__(num_entities, num_relations, dim, gamma, epsilon, **tables)
        self.p_norm = float(p_norm)

    def _distance(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.linalg.vector_norm(x - y, ord=self.p_norm, dim=-1)

    def _compare_shared(self, query: Tensor, cand: Tensor) -> Tensor:
        if self.p_norm == 1.0 and query.is_cuda and torch.is_grad_enabled():
            dist = fused_l1_distances(query, cand)
            if dist is not None:
                return self.gamma - dist
        # cdist never materialises [B, n, w] and is ~20x faster than broadcasting; its
        # matmul shortcut for p=2 trades exactness, so it is disabled.
        dist = torch.cdist(query, cand, p=self.p_norm, compute_mode="donot_use_mm_for_euclid_dist")
        return self.gamma - dist

    def extra_repr(self) -> str:
        return super().extra_repr() + f", p_norm={self.p_norm:g}"


def _l1_distances(query: Tensor, cand: Tensor) -> Tensor:
    return (query.unsqueeze(1) - cand.unsqueeze(0)).abs().sum(-1)


_FUSED_L1: dict = {}


def fused_l1_distances(query: Tensor, cand: Tensor) -> Tensor | None:
    """``[B, n]`` L1 distances of ``query [B, w]`` to ``cand [n, w]`` through
    :func:`torch.compile`, or None where the compiled call failed (then cdist serves from
    now on; warned once). torch compiles a static graph's backward at its first backward
    pass, outside this call: a failure there is raised, not caught here.

    Used for training on CUDA only: cdist's backward writes a ``[B, n, w]`` buffer twice (once
    per input), where the compiled backward reduces the signs in registers (one H100, 512 x 256
    x 256, forward and backward: 72 us against cdist's 484). On a CPU cdist stays, bit for bit
    as before. Batch shapes are left to dynamo's automatic dynamic shapes: one graph per shape
    (``dynamic=False``) ran the function eagerly in a measured run, and eagerly the broadcast
    is slower than cdist (632 us), so with dynamo disabled cdist serves.
    """
    fn = _FUSED_L1.get("fn")
    if fn is False or getattr(torch._dynamo.config, "disable", False):
        return None
    if fn is None:
        fn = _FUSED_L1["fn"] = torch.compile(_l1_distances)
    try:
        return fn(query, cand)
    except Exception as exc:  # noqa: BLE001 - whatever the compiler raised: cdist is always there
        log.warning("compiled L1 distances unavailable (%s: %s); using torch.cdist", type(exc).__name__, exc)
        _FUSED_L1["fn"] = False
        return None


class BilinearModel(KGEModel):
    """Models scored as ``<query, candidate>``."""

    def _compare(self, query: Tensor, cand: Tensor) -> Tensor:
        if cand.dim() == 2:
            return query @ cand.T
        return torch.bmm(cand, query.unsqueeze(-1)).squeeze(-1)

    def _compare_shared(self, query: Tensor, cand: Tensor) -> Tensor:
        return query @ cand.T
