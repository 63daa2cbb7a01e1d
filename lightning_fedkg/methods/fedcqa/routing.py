"""Where a cross-graph query's projections run (distributed retrieval, :mod:`.retrieval`):
the directory built from the clients' keys, and per batch the hops' routes, the states they
return, and the rows no client can route with the reason why.

The server holds one :class:`Routing`; it sees keys and, under ``task.retrieval: private``,
states only as ciphertext (zero bytes where a row was routed elsewhere, never forwarded).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.federated.message import Message

__all__ = ["Routing", "leaves"]


def leaves(expr, kind: str) -> list[int]:
    """Slot positions (``"a"``) or state ids (``"s"``) an input expression reads."""
    if expr[0] == kind:
        return [int(expr[1])]
    if expr[0] in ("a", "s"):
        return []
    if expr[0] == "p":
        return leaves(expr[1], kind)
    return [x for c in expr[1] for x in leaves(c, kind)]


def _member(ranked: Tensor | None, keys: Tensor) -> Tensor:
    """Whether each of ``keys`` is in the sorted ``ranked`` (None: an empty set)."""
    if ranked is None or len(ranked) == 0:
        return torch.zeros(keys.shape, dtype=torch.bool)
    pos = torch.searchsorted(ranked, keys.contiguous()).clamp(max=len(ranked) - 1)
    return ranked[pos] == keys


class Routing:
    """The server's routing state: :attr:`directory` (from the keys step), and for the batch
    in flight :attr:`states` (per projection node), :attr:`failed` (rows no client can
    route), :attr:`lacks` (why), :attr:`routes` (``(client, node)`` → rows) and, once the
    hops are done, :attr:`live` (the rows every hop reached)."""

    def __init__(self, private: bool) -> None:
        self.private = private
        self.directory: dict | None = None
        self.states: dict = {}
        self.failed = torch.zeros(0, dtype=torch.bool)
        self.lacks: list[dict] = []
        self.routes: dict = {}
        self.live = torch.zeros(0, dtype=torch.long)

    def build_directory(self, clients: list[str], replies: dict[str, Message]) -> None:
        """Union of the entity keys (a row per entity, Eq. 6's table), each relation's owner
        and each client's entity keys, sorted (whether it can start a branch)."""
        answered = [c for c in clients if c in replies]
        entity = torch.cat([replies[c].arrays["entity"] for c in answered])
        union, inverse = torch.unique(entity, return_inverse=True)
        index, start = {}, 0
        for c in answered:
            n = replies[c].arrays["entity"].shape[0]
            index[c], start = inverse[start:start + n], start + n
        relation = torch.cat([replies[c].arrays["relation"] for c in answered])
        owner = torch.cat([torch.full((replies[c].arrays["relation"].shape[0],), clients.index(c))
                           for c in answered])
        order = relation.argsort()
        self.directory = {"entity_keys": union, "entity_index": index,
                          "relation_keys": relation[order], "relation_owner": owner[order],
                          "held": {c: replies[c].arrays["entity"].sort().values for c in answered}}

    def start_batch(self, size: int) -> None:
        """A new batch of ``size`` queries: no state, no failure yet."""
        self.states = {}
        self.failed = torch.zeros(size, dtype=torch.bool)
        self.lacks = []

    def hop_messages(self, clients: list[str], cq, start: int, stop: int, nodes,
                     structure: str) -> dict[str, Message]:
        """One hop's projections ``nodes`` of queries ``start..stop-1`` of ``cq``, each to the
        client that owns its relation and holds its anchors; rows none can take fail."""
        keys, inverse = cq.keys[start:stop], cq.inverse[start:stop]
        owner_of, relation_keys = self.directory["relation_owner"], self.directory["relation_keys"]
        self.routes = {}
        messages: dict[str, dict] = {}
        for node, inner, slot in nodes:
            pos = torch.searchsorted(relation_keys, keys[:, slot].contiguous()).clamp(max=len(relation_keys) - 1)
            known = relation_keys[pos] == keys[:, slot]
            owner = torch.where(known, owner_of[pos], -1)
            self._note_lacks(~known & ~self.failed, None, keys, inverse, slot, None)
            self.failed |= ~known
            # the owner must hold the branch's anchors: a row it cannot start is not sent
            for a in leaves(inner, "a"):
                for k, client in enumerate(clients):
                    mine = (owner == k) & ~self.failed
                    lacking = mine & ~_member(self.directory["held"].get(client), keys[:, a])
                    self._note_lacks(lacking, client, keys, inverse, slot, a)
                    self.failed |= lacking
            for k, client in enumerate(clients):
                rows = ((owner == k) & ~self.failed).nonzero().squeeze(1)
                if not len(rows):
                    continue
                self.routes[(client, node)] = rows
                m = messages.setdefault(client, {"arrays": {}, "nodes": []})
                m["nodes"].append({"id": node, "input": inner, "slot": slot,
                                   "anchors": leaves(inner, "a"), "refs": leaves(inner, "s")})
                m["arrays"][f"{node}:rel"] = keys[rows, slot]
                m["arrays"][f"{node}:inv"] = inverse[rows, slot]
                if self.private:  # which queries: the states' keys and associated data
                    m["arrays"][f"{node}:q"] = start + rows
                for a in leaves(inner, "a"):
                    m["arrays"][f"{node}:a{a}"] = keys[rows, a]
                for ref in leaves(inner, "s"):
                    m["arrays"][f"{node}:s{ref}"] = self.states[ref][rows]
        return {c: Message(arrays=m["arrays"], config={"kind": "project", "structure": structure,
                                                        "nodes": m["nodes"]})
                for c, m in messages.items()}

    def _note_lacks(self, rows: Tensor, client, keys: Tensor, inverse: Tensor, slot: int, anchor) -> None:
        """Remember why ``rows`` (bool) cannot be routed (``retrieve`` explains it)."""
        for row in rows.nonzero().squeeze(1).tolist():
            self.lacks.append({"row": row, "client": client, "relation": int(keys[row, slot]),
                               "inverse": int(inverse[row, slot]),
                               "entity": None if anchor is None else int(keys[row, anchor])})

    def collect_hop(self, replies: dict[str, Message], start: int, stop: int) -> None:
        """The states a hop's clients returned; a client that did not answer fails its rows."""
        for (client, node), rows in self.routes.items():
            if client not in replies:
                self.failed[rows] = True
                continue
            state = replies[client].arrays[str(node)]
            if node not in self.states:
                # rows routed elsewhere stay NaN (paper) or zero bytes (private; never forwarded)
                shape = (stop - start, *state.shape[1:])
                self.states[node] = torch.zeros(shape, dtype=torch.uint8) if self.private else \
                    torch.full(shape, float("nan"))
            self.states[node][rows] = state if self.private else state.float()

    def finish_hops(self) -> Tensor:
        """The rows every hop reached (:attr:`live`), once the batch's hops are done."""
        self.live = (~self.failed).nonzero().squeeze(1)
        return self.live

    def root_inputs(self, root) -> dict[str, Tensor]:
        """The root's input states of the :attr:`live` rows."""
        return {f"s{i}": self.states[i][self.live] for i in leaves(root, "s")}
