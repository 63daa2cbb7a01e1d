"""ComplEx (Trouillon et al., ICML 2016): DistMult over complex embeddings."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.models.kge.families import BilinearModel

__all__ = ["ComplEx"]


class ComplEx(BilinearModel):
    """ComplEx: Trouillon, Welbl, Riedel, Gaussier, Bouchard, "Complex Embeddings for
    Simple Link Prediction", ICML 2016.

    Entities and relations are complex, stored as ``[re || im]`` (width ``2d``).
    ``s(h, r, t) = Re(sum_k h_k r_k conj(t_k))
    = sum_k (h_re r_re - h_im r_im) t_re + (h_re r_im + h_im r_re) t_im`` (no gamma).
    """

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 10.0,
                 epsilon: float = 2.0):
        super().__init__(num_entities, num_relations, dim, gamma, epsilon,
                         entity_width=2 * dim, relation_width=2 * dim)

    def forward(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        h, r, t = head_index, rel_type, tail_index
        h_re, h_im = self.lookup(self.entity_emb, h).chunk(2, dim=-1)
        r_re, r_im = self.lookup(self.relation_emb, r).chunk(2, dim=-1)
        t_re, t_im = self.lookup(self.entity_emb, t).chunk(2, dim=-1)
        return ((h_re * r_re - h_im * r_im) * t_re + (h_re * r_im + h_im * r_re) * t_im).sum(-1)

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        # h * r, so that s = <(Re, Im) of h r, (t_re, t_im)>
        h_re, h_im = self.lookup(self.entity_emb, h).chunk(2, dim=-1)
        r_re, r_im = self.lookup(self.relation_emb, r).chunk(2, dim=-1)
        return torch.cat([h_re * r_re - h_im * r_im, h_re * r_im + h_im * r_re], dim=-1)

    def _head_query(self, r: Tensor, t: Tensor) -> Tensor:
        # s = Re(h a) with a = r conj(t), i.e. <(h_re, h_im), (Re a, -Im a)>
        r_re, r_im = self.lookup(self.relation_emb, r).chunk(2, dim=-1)
        t_re, t_im = self.lookup(self.entity_emb, t).chunk(2, dim=-1)
        return torch.cat([r_re * t_re + r_im * t_im, r_re * t_im - r_im * t_re], dim=-1)
