"""TransR (Lin et al., AAAI 2015): translation in a relation space reached by a matrix ``M_r``."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.models.kge.families import TranslationalModel, relation_space_width, soft_unit_norm
from lightning_fedkg.models.shareable import InitSpec

__all__ = ["TransR"]


class TransR(TranslationalModel):
    """TransR: Lin, Liu, Sun, Liu, Zhu, "Learning Entity and Relation Embeddings for
    Knowledge Graph Completion", AAAI 2015.

    Entities live in ``R^d``, relations in ``R^{d_r}`` (``relation_dim``, default ``d``);
    each relation has a matrix ``M_r`` in ``R^{d_r x d}`` stored row-major as
    ``relation_matrix`` ``[R, d_r * d]``. ``s(h, r, t) = gamma - ||M_r h + r - M_r t||_p``.

    Init: entity/relation vectors ``U(-rho, rho)``; ``M_r`` = the (rectangular) identity,
    as in the paper, which starts TransR as TransE on the first ``min(d, d_r)`` coordinates.
    ``regularization_loss``: soft ``||h||, ||t||, ||r|| <= 1``, plus ``||M_r h||, ||M_r t|| <= 1``
    when the batch ``triples`` are given (the projected norms need (h, r) pairs).
    """

    relation_dependent_candidates = True

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 10.0,
                 epsilon: float = 2.0, p_norm: float = 1.0, relation_dim: int | None = None):
        rdim = relation_space_width(dim, relation_dim)
        super().__init__(num_entities, num_relations, dim, gamma, epsilon, p_norm=p_norm,
                         relation_width=rdim, extra_tables={"relation_matrix": rdim * dim})

    @property
    def relation_dim(self) -> int:
        return self.relation_emb.shape[1]

    def reset_parameters(self) -> None:
        super().reset_parameters()
        with torch.no_grad():
            eye = torch.eye(self.relation_dim, self.dim, dtype=self.relation_matrix.dtype)
            self.relation_matrix.copy_(eye.reshape(1, -1).expand_as(self.relation_matrix))

    def init_spec(self, name: str) -> InitSpec:
        if name == "relation_matrix":
            return InitSpec("eye", (self.relation_dim, self.dim))
        return super().init_spec(name)

    def _matrix(self, r: Tensor) -> Tensor:
        return self.lookup(self.relation_matrix, r).view(-1, self.relation_dim, self.dim)

    def _project(self, e: Tensor, r: Tensor) -> Tensor:
        """``M_r e`` for ``e`` ``[B, d]`` -> ``[B, d_r]``."""
        return torch.einsum("bij,bj->bi", self._matrix(r), e)

    def forward(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        h, r, t = head_index, rel_type, tail_index
        diff = (self._project(self.lookup(self.entity_emb, h), r) + self.lookup(self.relation_emb, r)
                - self._project(self.lookup(self.entity_emb, t), r))
        return self.gamma - torch.linalg.vector_norm(diff, ord=self.p_norm, dim=-1)

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        return self._project(self.lookup(self.entity_emb, h), r) + self.lookup(self.relation_emb, r)

    def _head_query(self, r: Tensor, t: Tensor) -> Tensor:
        return self._project(self.lookup(self.entity_emb, t), r) - self.lookup(self.relation_emb, r)

    def _candidates(self, ids: Tensor, r: Tensor) -> Tensor:
        e = self.lookup(self.entity_emb, ids)
        pattern = "bij,cj->bci" if e.dim() == 2 else "bij,bcj->bci"
        return torch.einsum(pattern, self._matrix(r), e)

    def regularization_loss(self, triples: Tensor | None = None) -> Tensor:
        """TransR soft norm constraints over the batch's rows (with projections) or all rows."""
        ent, rel = self._regularized_rows(triples)
        loss = soft_unit_norm(ent) + soft_unit_norm(rel)
        if triples is not None:
            r = triples[:, 1]
            loss = loss + soft_unit_norm(self._project(self.lookup(self.entity_emb, triples[:, 0]), r))
            loss = loss + soft_unit_norm(self._project(self.lookup(self.entity_emb, triples[:, 2]), r))
        return loss
