"""The optimizers a KGE learner trains with (``train.optimizer``): dense Adam, or a row-sparse
Adam whose step costs what the batch touches.

``"adam"`` (the default) is ``torch.optim.Adam`` over every parameter, as the official FedE,
FedLU and RotatE code: each step reads and writes every row of every table, O(rows x width).
``"sparse_adam"`` is :class:`RowSparseAdam` (``torch.optim.SparseAdam``, what torch ships for
this; PyTorch-BigGraph and DGL-KE use a row-wise Adagrad): the model's tables hand out rows
through ``F.embedding(..., sparse=True)`` (:meth:`~lightning_fedkg.models.kge.KGEModel.lookup`),
so each gradient is a sparse tensor of the rows the batch read, and only those rows are
updated. Every KGE parameter is such a row table (TransR's matrices are ``[R, d_r * d]``
rows), so one SparseAdam serves them all, relations included. Semantics, limits and
measurements: docs/performance.md ("Row-sparse training") and docs/results/scale.md.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from lightning_fedkg.config import OPTIMIZERS

__all__ = ["OPTIMIZERS", "RowSparseAdam", "build_optimizer", "is_row_sparse"]


def is_row_sparse(name: str) -> bool:
    """Whether optimizer ``name`` needs row-sparse gradients from the model's tables."""
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {name!r}")
    return name == "sparse_adam"


class RowSparseAdam(torch.optim.SparseAdam):
    """``torch.optim.SparseAdam`` that names the table and the likely cause when a parameter
    arrives with a dense gradient (SparseAdam's own error says only "dense gradients").

    Lazy Adam, as SparseAdam computes it: a row's moments decay only on the steps that touch
    it (dense Adam decays every row's at every step, and keeps moving a row through its first
    moment after its last gradient); the bias correction uses the table's step count (steps
    with any gradient for the table), not the row's; ``eps`` is added to ``sqrt(v)`` before
    ``v``'s bias correction goes into the step size. The moments are dense tensors the size
    of the tables (as Adam's), allocated at the first step; a step reads and writes only the
    rows of its batch.

    A whole-table loss term gives a table a dense gradient, which no row-sparse update can
    apply without touching every row: FedProx's proximal term or FedEC's contrastive term
    (with ``mu > 0``), or a model that indexes a table directly (``table[ids]``) instead of
    through ``KGEModel.lookup``. :meth:`step` refuses it.

    Args:
        named_parameters: ``(name, Parameter)`` pairs, e.g. ``module.named_parameters()``.
        lr: the learning rate; the other arguments are SparseAdam's.
    """

    def __init__(self, named_parameters: Iterable[tuple[str, nn.Parameter]], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        named = list(named_parameters)
        super().__init__([p for _, p in named], lr=lr, betas=betas, eps=eps)
        # Held by identity, not saved: names are for error messages only.
        self._names = {id(p): name for name, p in named}

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None and not p.grad.is_sparse:
                    name = self._names.get(id(p), "a parameter")
                    raise RuntimeError(
                        f"train.optimizer=sparse_adam: {name} received a dense gradient, which a row-sparse "
                        f"update cannot apply without touching every row. A loss term reads the whole table "
                        f"(FedProx's proximal term or FedEC's contrastive term with mu > 0), or the model "
                        f"indexes it directly instead of through KGEModel.lookup; use train.optimizer=adam")
        return super().step(closure)


def build_optimizer(name: str, module: nn.Module, lr: float) -> torch.optim.Optimizer:
    """A fresh optimizer ``name`` (:data:`OPTIMIZERS`) over ``module``'s parameters."""
    if is_row_sparse(name):
        return RowSparseAdam(module.named_parameters(), lr=lr)
    return torch.optim.Adam(module.parameters(), lr=lr)
