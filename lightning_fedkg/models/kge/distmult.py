"""DistMult (Yang et al., ICLR 2015): the trilinear product ``sum_k h_k r_k t_k``."""

from __future__ import annotations

from torch import Tensor

from lightning_fedkg.models.kge.families import BilinearModel

__all__ = ["DistMult"]


class DistMult(BilinearModel):
    """DistMult: Yang, Yih, He, Gao, Deng, "Embedding Entities and Relations for Learning
    and Inference in Knowledge Bases", ICLR 2015.

    ``s(h, r, t) = sum_k h_k r_k t_k`` (no gamma).
    """

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 10.0,
                 epsilon: float = 2.0):
        super().__init__(num_entities, num_relations, dim, gamma, epsilon)

    def forward(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        h, r, t = head_index, rel_type, tail_index
        return (self.lookup(self.entity_emb, h) * self.lookup(self.relation_emb, r)
                * self.lookup(self.entity_emb, t)).sum(-1)

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        return self.lookup(self.entity_emb, h) * self.lookup(self.relation_emb, r)

    def _head_query(self, r: Tensor, t: Tensor) -> Tensor:
        return self.lookup(self.relation_emb, r) * self.lookup(self.entity_emb, t)
