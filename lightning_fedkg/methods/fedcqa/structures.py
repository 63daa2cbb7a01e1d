"""Complex logical queries on a KG: their structures and batched answering (FedCQA's data).

Structures follow KGReasoning's nested-tuple grammar; an instance is one row of integers in
depth-first order, a batch of one structure a ``LongTensor [B, slots]``. Relation ``k`` is
id ``2k`` forward and ``2k + 1`` inverse (:class:`QueryGraph`). Answers are set operations on
boolean ``[B, N]`` entity matrices, a batch at a time, with no Python loop over queries or
edges. Sampling and the query sets are :mod:`.queries`. See docs/methods/fedcqa.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

__all__ = ["STRUCTURES", "QueryGraph", "num_slots", "anchors_and_relations", "answer", "is_branch", "is_union"]

E, R, U = "e", "r", "u"
_B1 = (E, (R,))

#: The nine query structures (FedCQA uses all but 3p).
STRUCTURES: dict[str, tuple] = {
    "1p": (E, (R,)),
    "2p": (E, (R, R)),
    "3p": (E, (R, R, R)),
    "2i": (_B1, _B1),
    "3i": (_B1, _B1, _B1),
    "ip": ((_B1, _B1), (R,)),
    "pi": ((E, (R, R)), _B1),
    "2u": (_B1, _B1, (U,)),
    "up": ((_B1, _B1, (U,)), (R,)),
}


def is_branch(node) -> bool:
    """``(anchor or compound, (r, ...))``."""
    return (isinstance(node, tuple) and len(node) == 2 and isinstance(node[1], tuple) and len(node[1]) > 0
            and all(x == R for x in node[1]))


def is_union(node) -> bool:
    return isinstance(node, tuple) and len(node) > 1 and node[-1] == (U,)


def num_slots(structure) -> int:
    """Integers in an instance of ``structure``."""
    if structure == E or structure == R or structure == (U,):
        return 1
    if is_branch(structure):
        return num_slots(structure[0]) + len(structure[1])
    return sum(num_slots(part) for part in structure)


def anchors_and_relations(structure) -> tuple[list[int], list[int]]:
    """Slot positions of the anchors and of the relations of ``structure``."""
    anchors, relations = [], []

    def walk(node, pos: int) -> int:
        if node == E:
            anchors.append(pos)
            return pos + 1
        if node == (U,):
            return pos + 1
        if is_branch(node):
            pos = walk(node[0], pos)
            for _ in node[1]:
                relations.append(pos)
                pos += 1
            return pos
        for part in node:
            pos = walk(part, pos)
        return pos

    walk(structure, 0)
    return anchors, relations


@dataclass
class QueryGraph:
    """A KG's triples with their inverses, indexed for projections and backward walks.

    Built with :meth:`from_triples` from ``[T, 3]`` triples of ``num_relations`` relations;
    holds ``2 · num_relations`` relation ids (``2k`` forward, ``2k + 1`` inverse).
    """

    num_entities: int
    num_relations: int  # with inverses
    heads: Tensor       # edges sorted by (relation, head)
    rels: Tensor
    tails: Tensor
    rel_start: Tensor   # [R + 1] offsets of each relation's edges
    edge_keys: Tensor   # relation · N + head of each edge, sorted (for projections)

    @classmethod
    def from_triples(cls, triples: Tensor, num_entities: int, num_relations: int) -> "QueryGraph":
        h, r, t = triples[:, 0].long(), triples[:, 1].long(), triples[:, 2].long()
        heads = torch.cat([h, t])
        rels = torch.cat([2 * r, 2 * r + 1])
        tails = torch.cat([t, h])
        key = torch.unique(rels * num_entities * num_entities + heads * num_entities + tails)  # no duplicates
        n2 = num_entities * num_entities
        rels, rest = key // n2, key % n2
        heads, tails = rest // num_entities, rest % num_entities
        counts = torch.bincount(rels, minlength=2 * num_relations)
        start = torch.zeros(2 * num_relations + 1, dtype=torch.long)
        start[1:] = torch.cumsum(counts, 0)
        return cls(num_entities, 2 * num_relations, heads, rels, tails, start, rels * num_entities + heads)

    def project(self, sets: Tensor, relations: Tensor, max_pairs: int = 1 << 24) -> Tensor:
        """``[B, N]`` bool: the entities reached from each row's set through its relation.

        Work is proportional to the edges actually followed: every (row, member) pair looks
        up its edges ``(relation of the row, member, ·)`` by binary search in the edges
        sorted by (relation, head), and the tails are set, ``max_pairs`` at a time."""
        out = torch.zeros_like(sets)
        rows, members = sets.nonzero(as_tuple=True)
        if rows.numel() == 0:
            return out
        keys = relations[rows] * self.num_entities + members
        lo = torch.searchsorted(self.edge_keys, keys)
        counts = torch.searchsorted(self.edge_keys, keys, right=True) - lo
        ends = torch.cumsum(counts, 0)
        start = 0
        while start < rows.numel():
            # the longest run of pairs whose edges fit in max_pairs (at least one pair)
            base = int(ends[start - 1]) if start else 0
            stop = max(start + 1, int(torch.searchsorted(ends, base + max_pairs, right=True)))
            c = counts[start:stop]
            total = int(c.sum())
            if total:
                owner = torch.repeat_interleave(torch.arange(start, stop), c)
                offset = torch.arange(total) - torch.repeat_interleave(torch.cumsum(c, 0) - c, c)
                out[rows[owner], self.tails[lo[owner] + offset]] = True
            start = stop
        return out

    def incoming(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Backward-walk index: edges sorted by (tail, relation); per node the range of its
        distinct incoming relations; per (tail, relation) pair the range of its heads.
        Returns ``(pair_rel, pair_start, pair_count, node_start, node_count, heads_sorted)``;
        built once per graph (every structure's sampler walks the same index)."""
        return self._incoming

    @cached_property
    def _incoming(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        n = self.num_entities
        order = torch.argsort(self.tails * self.num_relations + self.rels, stable=True)
        tails, rels, heads = self.tails[order], self.rels[order], self.heads[order]
        pair_key, pair_count = torch.unique_consecutive(tails * self.num_relations + rels, return_counts=True)
        pair_start = torch.zeros_like(pair_count)
        pair_start[1:] = torch.cumsum(pair_count, 0)[:-1]
        pair_tail, pair_rel = pair_key // self.num_relations, pair_key % self.num_relations
        node_count = torch.bincount(pair_tail, minlength=n)
        node_start = torch.zeros(n, dtype=torch.long)
        node_start[1:] = torch.cumsum(node_count, 0)[:-1]
        return pair_rel, pair_start, pair_count, node_start, node_count, heads


def _onehot(ids: Tensor, n: int) -> Tensor:
    out = torch.zeros(ids.shape[0], n, dtype=torch.bool)
    out[torch.arange(ids.shape[0]), ids] = True
    return out


def answer(structure, queries: Tensor, graph: QueryGraph) -> Tensor:
    """``[B, N]`` bool: the answers of each instance of ``structure`` on ``graph``."""

    def run(node, pos: int) -> tuple[Tensor, int]:
        if is_branch(node):
            if node[0] == E:
                sets, pos = _onehot(queries[:, pos], graph.num_entities), pos + 1
            else:
                sets, pos = run(node[0], pos)
            for _ in node[1]:
                sets, pos = graph.project(sets, queries[:, pos]), pos + 1
            return sets, pos
        union = is_union(node)
        parts = node[:-1] if union else node
        out = None
        for part in parts:
            sets, pos = run(part, pos)
            out = sets if out is None else (out | sets if union else out & sets)
        return out, pos + (1 if union else 0)

    sets, _ = run(structure, 0)
    return sets
