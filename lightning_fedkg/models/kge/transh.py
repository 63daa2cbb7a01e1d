"""TransH (Wang et al., AAAI 2014): translation on a relation's hyperplane."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.models.kge.families import TranslationalModel, soft_unit_norm

__all__ = ["TransH"]


class TransH(TranslationalModel):
    """TransH: Wang, Zhang, Feng, Chen, "Knowledge Graph Embedding by Translating on
    Hyperplanes", AAAI 2014.

    Each relation has a translation ``d_r`` (``relation_emb``) and a hyperplane normal
    ``w_r`` (``relation_normal``), used as ``w_r / ||w_r||_2`` so the paper's unit-norm
    constraint holds by construction. With ``e_perp = e - (w_r . e) w_r``:
    ``s(h, r, t) = gamma - ||h_perp + d_r - t_perp||_p``.

    ``regularization_loss`` is the paper's soft constraint
    ``sum_e max(0, ||e||^2 - 1) + sum_r max(0, (w_r . d_r)^2 / ||d_r||^2 - eps^2)``
    with ``eps = orthogonality_margin``.
    """

    relation_dependent_candidates = True

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 10.0,
                 epsilon: float = 2.0, p_norm: float = 1.0, orthogonality_margin: float = 1e-3):
        super().__init__(num_entities, num_relations, dim, gamma, epsilon, p_norm=p_norm,
                         extra_tables={"relation_normal": dim})
        self.orthogonality_margin = float(orthogonality_margin)

    def _normal(self, r: Tensor) -> Tensor:
        return F.normalize(self.lookup(self.relation_normal, r), p=2.0, dim=-1)

    @staticmethod
    def _project(e: Tensor, w: Tensor) -> Tensor:
        return e - (e * w).sum(-1, keepdim=True) * w

    def forward(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        h, r, t = head_index, rel_type, tail_index
        w = self._normal(r)
        h_perp = self._project(self.lookup(self.entity_emb, h), w)
        t_perp = self._project(self.lookup(self.entity_emb, t), w)
        diff = h_perp + self.lookup(self.relation_emb, r) - t_perp
        return self.gamma - torch.linalg.vector_norm(diff, ord=self.p_norm, dim=-1)

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        return self._project(self.lookup(self.entity_emb, h), self._normal(r)) + self.lookup(self.relation_emb, r)

    def _head_query(self, r: Tensor, t: Tensor) -> Tensor:
        return self._project(self.lookup(self.entity_emb, t), self._normal(r)) - self.lookup(self.relation_emb, r)

    def _candidates(self, ids: Tensor, r: Tensor) -> Tensor:
        e = self.lookup(self.entity_emb, ids)
        if e.dim() == 2:
            e = e.unsqueeze(0)
        return self._project(e, self._normal(r).unsqueeze(1))

    def regularization_loss(self, triples: Tensor | None = None) -> Tensor:
        """TransH soft constraints (scale and orthogonality) over the batch's rows or all rows."""
        ent, _ = self._regularized_rows(triples)
        rel = slice(None) if triples is None else triples[:, 1]
        d = self.lookup(self.relation_emb, rel)
        w = F.normalize(self.lookup(self.relation_normal, rel), p=2.0, dim=-1)
        cos2 = (w * d).sum(-1).pow(2) / d.pow(2).sum(-1).clamp_min(1e-12)
        return soft_unit_norm(ent) + F.relu(cos2 - self.orthogonality_margin**2).sum()
