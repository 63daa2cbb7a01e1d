"""Query encoders for complex query answering: structures to embeddings, embeddings to scores.

A query with unions is answered in disjunctive normal form (Ren & Leskovec, NeurIPS 2020;
REFERENCE §6.1): :func:`dnf` rewrites a structure into union-free alternatives, each
encoded on its own, and an entity's score is its best score over the alternatives.

:class:`GQE` (Hamilton et al., "Embedding Logical Queries on Knowledge Graphs", NeurIPS
2018, in KGReasoning's form, REFERENCE §6.3): an anchor is its entity row, a projection
adds the relation row, an intersection is an attention-weighted sum of the branch
embeddings (weights per dimension from a two-layer network, softmax over the branches),
and ``s(e, q) = γ − ‖e − q‖₁``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_fedkg.data.queries import STRUCTURES, is_branch, is_union

__all__ = ["dnf", "GQE"]

E = "e"


def dnf(structure) -> list[tuple[object, list[int]]]:
    """Union-free alternatives of ``structure``: ``[(schema, slots)]``, where ``slots`` are
    the positions in an instance of ``structure`` that fill ``schema`` in its own order.
    2u gives two 1p alternatives, up two 2p ones (the shared last relation in both)."""

    def walk(node, pos: int) -> tuple[list[tuple[object, list[int]]], int]:
        if node == E:
            return [(E, [pos])], pos + 1
        if is_branch(node):
            inner, pos = walk(node[0], pos)
            rels = list(range(pos, pos + len(node[1])))
            return [((schema, node[1]), slots + rels) for schema, slots in inner], pos + len(node[1])
        union = is_union(node)
        parts = node[:-1] if union else node
        per_part = []
        for part in parts:
            alts, pos = walk(part, pos)
            per_part.append(alts)
        if union:
            return [alt for alts in per_part for alt in alts], pos + 1
        combos: list[tuple[tuple, list[int]]] = [((), [])]
        for alts in per_part:
            combos = [(schemas + (schema,), slots + more) for schemas, slots in combos for schema, more in alts]
        return [(schemas, slots) for schemas, slots in combos], pos

    alternatives, _ = walk(structure, 0)
    return alternatives


class GQE(nn.Module):
    """GQE's operators over an entity table ``[N, d]`` and a relation table ``[R, d]``
    (``R`` counting inverses); ``gamma`` is the score margin, the init range
    ``(gamma + 2) / d`` as KGReasoning's."""

    def __init__(self, num_entities: int, num_relations: int, dim: int, gamma: float = 24.0) -> None:
        super().__init__()
        self.gamma = float(gamma)
        bound = (self.gamma + 2.0) / dim
        self.entity_emb = nn.Parameter(torch.empty(num_entities, dim).uniform_(-bound, bound))
        self.relation_emb = nn.Parameter(torch.empty(num_relations, dim).uniform_(-bound, bound))
        self.attention = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim))

    def project(self, q: Tensor, relations: Tensor) -> Tensor:
        return q + self.relation_emb[relations]

    def intersect(self, branches: Tensor) -> Tensor:
        """``[B, k, d]`` branch embeddings -> ``[B, d]``."""
        weights = torch.softmax(self.attention(branches), dim=1)
        return (weights * branches).sum(1)

    def _encode(self, schema, rows: Tensor, pos: int) -> tuple[Tensor, int]:
        if schema == E:
            return self.entity_emb[rows[:, pos]], pos + 1
        if is_branch(schema):
            q, pos = self._encode(schema[0], rows, pos)
            for _ in schema[1]:
                q, pos = self.project(q, rows[:, pos]), pos + 1
            return q, pos
        branches = []
        for part in schema:
            q, pos = self._encode(part, rows, pos)
            branches.append(q)
        return self.intersect(torch.stack(branches, 1)), pos

    def embed(self, structure: str, queries: Tensor) -> Tensor:
        """``[B, K, d]``: one embedding per DNF alternative of each query of ``structure``."""
        out = []
        for schema, slots in dnf(STRUCTURES[structure]):
            q, _ = self._encode(schema, queries[:, slots], 0)
            out.append(q)
        return torch.stack(out, 1)

    def score(self, embeddings: Tensor, entities: Tensor | None = None) -> Tensor:
        """``[B, n]``: ``γ − ‖e − q‖₁`` maximised over the alternatives, for every entity
        (or the ``entities`` given)."""
        table = self.entity_emb if entities is None else self.entity_emb[entities]
        b, k, d = embeddings.shape
        distance = torch.cdist(embeddings.reshape(b * k, d), table, p=1).view(b, k, -1)
        return (self.gamma - distance).max(1).values
