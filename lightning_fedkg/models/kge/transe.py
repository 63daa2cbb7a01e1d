"""TransE (Bordes et al., NeurIPS 2013): ``gamma - ||h + r - t||_p``."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.models.kge.families import TranslationalModel

__all__ = ["TransE"]


class TransE(TranslationalModel):
    """TransE: Bordes et al., "Translating Embeddings for Modeling Multi-relational Data",
    NeurIPS 2013.

    ``s(h, r, t) = gamma - ||h + r - t||_p`` with ``p = p_norm`` (1 in the FedE code).
    Entities are not normalised (FedE code); ``regularization_loss`` is the default N3.
    """

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 10.0,
                 epsilon: float = 2.0, p_norm: float = 1.0):
        super().__init__(num_entities, num_relations, dim, gamma, epsilon, p_norm=p_norm)

    def forward(self, head_index: Tensor, rel_type: Tensor, tail_index: Tensor) -> Tensor:
        h, r, t = head_index, rel_type, tail_index
        diff = self.lookup(self.entity_emb, h) + self.lookup(self.relation_emb, r) - self.lookup(self.entity_emb, t)
        return self.gamma - torch.linalg.vector_norm(diff, ord=self.p_norm, dim=-1)

    def _tail_query(self, h: Tensor, r: Tensor) -> Tensor:
        return self.lookup(self.entity_emb, h) + self.lookup(self.relation_emb, r)

    def _head_query(self, r: Tensor, t: Tensor) -> Tensor:
        # ||h + r - t|| = ||h - (t - r)||
        return self.lookup(self.entity_emb, t) - self.lookup(self.relation_emb, r)
