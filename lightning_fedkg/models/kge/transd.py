"""TransD (Ji et al., ACL 2015): translation after a dynamic, per entity-relation projection."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.models.kge.families import TranslationalModel, relation_space_width, soft_unit_norm

__all__ = ["TransD"]


class TransD(TranslationalModel):
    """TransD: Ji, He, Xu, Liu, Zhao, "Knowledge Graph Embedding via Dynamic Mapping
    Matrix", ACL 2015.

    Entity ``e`` (``entity_emb``) with projection vector ``e_p`` (``entity_proj``),
    relation ``r`` (``relation_emb``, width ``d_r = relation_dim``, default ``d``) with
    ``r_p`` (``relation_proj``). ``M_re = r_p e_p^T + I^{d_r x d}``, so
    ``e_perp = M_re e = I e + (e_p . e) r_p`` where ``I e`` truncates or zero-pads ``e`` to
    ``d_r``. ``s(h, r, t) = gamma - ||h_perp + r - t_perp||_p``.

    All four tables ``U(-rho, rho)``. ``regularization_loss``: soft ``||h||, ||t||, ||r|| <= 1``,
    plus ``||h_perp||, ||t_perp|| <= 1`` when the batch ``triples`` are given.
    """

    relation_dependent_candidates = True

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 10.0,
                 epsilon: float = 2.0, p_norm: float = 1.0, relation_dim: int | None = None):
        rdim = relation_space_width(dim, relation_dim)
        super().__init__(num_entities, num_relations, dim, gamma, epsilon, p_norm=p_norm,
                         relation_width=rdim,
                         extra_tables={"entity_proj": dim, "relation_proj": rdim})

    @property
    def relation_dim(self) -> int:
        return self.relation_emb.shape[1]

    def _project(self, e: Tensor, e_p: Tensor, r_p: Tensor) -> Tensor:
        """``I e + (e_p . e) r_p``; ``e, e_p`` ``[..., d]`` broadcast against ``r_p`` ``[..., d_r]``."""
        rdim = self.relation_dim
        resized = e[..., :rdim] if rdim <= self.dim else F.pad(e, (0, rdim - self.dim))
        return resized + (e * e_p).sum(-1, keepdim=True) * r_p

    def _project_ids(self, e: Tensor, r: Tensor) -> Tensor:
        return self._project(self.lookup(self.entity_emb, e), self.lookup(self.entity_proj, e),
                             self.lookup(self.relation_proj, r))

    def forward(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        h, r, t = head_index, rel_type, tail_index
        diff = self._project_ids(h, r) + self.lookup(self.relation_emb, r) - self._project_ids(t, r)
        return self.gamma - torch.linalg.vector_norm(diff, ord=self.p_norm, dim=-1)

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        return self._project_ids(h, r) + self.lookup(self.relation_emb, r)

    def _head_query(self, r: Tensor, t: Tensor) -> Tensor:
        return self._project_ids(t, r) - self.lookup(self.relation_emb, r)

    def _candidates(self, ids: Tensor, r: Tensor) -> Tensor:
        e, e_p = self.lookup(self.entity_emb, ids), self.lookup(self.entity_proj, ids)
        if e.dim() == 2:
            e, e_p = e.unsqueeze(0), e_p.unsqueeze(0)
        return self._project(e, e_p, self.lookup(self.relation_proj, r).unsqueeze(1))

    def regularization_loss(self, triples: Tensor | None = None) -> Tensor:
        """TransD soft norm constraints over the batch's rows (with projections) or all rows."""
        ent, rel = self._regularized_rows(triples)
        loss = soft_unit_norm(ent) + soft_unit_norm(rel)
        if triples is not None:
            r = triples[:, 1]
            loss = loss + soft_unit_norm(self._project_ids(triples[:, 0], r))
            loss = loss + soft_unit_norm(self._project_ids(triples[:, 2], r))
        return loss
