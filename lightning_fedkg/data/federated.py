"""Federated knowledge graphs: one :class:`KnowledgeGraph` per client plus a global id table.

Each client uses local ids (its training entities in increasing global id), so
``entity_index[c]`` is FedE's sorted index array ``idx_c``; :meth:`FederatedKG.client_data`
gives a client's splits as PyG ``Data``. Sources: the partitioners of one KG
(:mod:`.partition`) and the folder layouts (:mod:`.federated_io`), described in
docs/datasets.md.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from .kg import KGFormatError, KnowledgeGraph, clean_splits, training_triples, unique_triples


def present_ids(ids: Tensor, size: int) -> Tensor:
    """Sorted distinct values of ``ids`` (all in ``[0, size)``), via a mask instead of a sort."""
    mask = torch.zeros(size, dtype=torch.bool)
    mask[ids.reshape(-1)] = True
    return mask.nonzero().flatten()


def _select(names: list[str] | None, index: Tensor) -> list[str] | None:
    if names is None:
        return None
    return np.asarray(names, dtype=object)[index.numpy()].tolist()


def _existence(index: list[Tensor], size: int) -> Tensor:
    """``BoolTensor[len(index), size]``: row c is True at ``index[c]``."""
    out = torch.zeros(len(index), size, dtype=torch.bool)
    for c, idx in enumerate(index):
        out[c, idx] = True
    return out


class FederatedKG:
    """Clients' KGs in local ids, tied together by local -> global index tensors.

    Args:
        clients: one :class:`KnowledgeGraph` per client, in local ids.
        entity_index: per client, ``LongTensor[n_c]`` local entity id -> global id.
        relation_index: per client, ``LongTensor[m_c]`` local relation id -> global id.
        num_entities, num_relations: sizes of the global tables.
        entity_names, relation_names: optional global id -> name lists.
        name: label for logs and stats.

    Use :meth:`from_global_splits` to build one from triples in global ids.
    """

    def __init__(
        self,
        clients: list[KnowledgeGraph],
        entity_index: list[Tensor],
        relation_index: list[Tensor],
        num_entities: int,
        num_relations: int,
        entity_names: list[str] | None = None,
        relation_names: list[str] | None = None,
        name: str = "fedkg",
    ) -> None:
        if not (len(clients) == len(entity_index) == len(relation_index)):
            raise ValueError("clients, entity_index and relation_index must have equal length")
        for c, (kg, ei, ri) in enumerate(zip(clients, entity_index, relation_index)):
            for label, idx, size, total in (("entity", ei, kg.num_entities, num_entities),
                                            ("relation", ri, kg.num_relations, num_relations)):
                if idx.numel() != size:
                    raise ValueError(f"client {c}: {label}_index has {idx.numel()} ids for {size} local ids")
                if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= total):
                    raise ValueError(f"client {c}: {label}_index outside [0, {total})")
                if idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()):
                    raise ValueError(f"client {c}: {label}_index must be strictly increasing")
        self.clients = list(clients)
        self.entity_index = [torch.as_tensor(i).long() for i in entity_index]
        self.relation_index = [torch.as_tensor(i).long() for i in relation_index]
        self.num_entities = int(num_entities)
        self.num_relations = int(num_relations)
        self.entity_names = list(entity_names) if entity_names is not None else None
        self.relation_names = list(relation_names) if relation_names is not None else None
        self.name = name

    @classmethod
    def from_global_splits(
        cls,
        client_splits: list[dict[str, Tensor]],
        num_entities: int,
        num_relations: int,
        entity_names: list[str] | None = None,
        relation_names: list[str] | None = None,
        name: str = "fedkg",
        clean: bool = True,
    ) -> "FederatedKG":
        """Build from per-client splits in GLOBAL ids.

        With ``clean=True`` the input policy (:func:`~lightning_fedkg.data.kg.clean_splits`)
        is applied per client: duplicates removed, evaluation triples whose entity or
        relation is absent from that client's training triples (``train`` and any extra split:
        :func:`~lightning_fedkg.data.kg.training_triples`) dropped. Local ids
        are then the client's entities / relations of those triples in increasing global id.
        """
        clients, ent_idx, rel_idx = [], [], []
        for c, splits in enumerate(client_splits):
            label = f"{name}/client_{c}"
            removed = {}
            if clean:
                splits, removed = clean_splits(splits, num_entities, num_relations, source=label)
            if splits["train"].shape[0] == 0:
                raise KGFormatError(f"{label}: empty train split")
            trained = training_triples(splits)
            ents = present_ids(trained[:, [0, 2]], num_entities)
            rels = present_ids(trained[:, 1], num_relations)
            e_map = torch.full((num_entities,), -1, dtype=torch.long)
            e_map[ents] = torch.arange(ents.numel())
            r_map = torch.full((num_relations,), -1, dtype=torch.long)
            r_map[rels] = torch.arange(rels.numel())
            local = {}
            for s, t in splits.items():
                loc = torch.stack([e_map[t[:, 0]], r_map[t[:, 1]], e_map[t[:, 2]]], 1)
                if (loc < 0).any():
                    raise ValueError(f"{label}: split '{s}' uses ids absent from train "
                                     "(pass clean=True)")
                local[s] = loc
            kg = KnowledgeGraph(local, ents.numel(), rels.numel(), _select(entity_names, ents),
                                _select(relation_names, rels), name=label)
            kg.removed = removed
            clients.append(kg)
            ent_idx.append(ents)
            rel_idx.append(rels)
        return cls(clients, ent_idx, rel_idx, num_entities, num_relations,
                   entity_names, relation_names, name)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    def global_triples(self, client: int, split: str = "train") -> Tensor:
        """A client's split mapped to global ids."""
        t = self.clients[client].triples(split)
        return torch.stack([self.entity_index[client][t[:, 0]],
                            self.relation_index[client][t[:, 1]],
                            self.entity_index[client][t[:, 2]]], 1)

    def client_data(self, client: int, split: str | None = None) -> dict[str, Data] | Data:
        """Client ``client``'s splits as PyG ``Data`` in its LOCAL ids, one per split (the
        layout of ``FB15k_237(root, split=...)``): ``edge_index`` ``[2, E]`` (local heads,
        tails), ``edge_type`` ``[E]`` (local relations), ``num_nodes`` (its entities), and
        the id maps ``n_id`` ``[num_nodes]`` (local entity -> global entity, PyG's name for a
        subgraph's node ids) and ``r_id`` (local relation -> global relation): so
        ``n_id[edge_index]`` and ``r_id[edge_type]`` are the edges in global ids, and
        :meth:`global_triples` the same as ``[E, 3]``. Keys are PyG's split names
        (``train``, ``val``, ``test``, any extra split under its own); with ``split`` (ours
        or PyG's name) just that ``Data``."""
        kg = self.clients[client]
        pyg_name = {"valid": "val"}
        out = {}
        for s in kg.split_names:
            data = kg.data(s)
            data.n_id = self.entity_index[client]
            data.r_id = self.relation_index[client]
            out[pyg_name.get(s, s)] = data
        if split is None:
            return out
        key = pyg_name.get(split, split)
        if key not in out:
            raise KeyError(f"client {client} has no split {split!r}; have {sorted(out)}")
        return out[key]

    def with_all_entities(self) -> "FederatedKG":
        """The same clients, each holding every entity of the federation (``data.client_entities:
        all``): a client's triples in global entity ids, its tables sized to all entities.

        The FedCQA code sets its clients up this way: every client's softmax and in-graph ranking
        run over all entities, and an entity outside a client's triples is trained there only as
        a candidate. A holder-mean then averages every row over every client. Relations stay the
        client's own."""
        n = self.num_entities
        clients = []
        for kg, ent in zip(self.clients, self.entity_index):
            splits = {s: torch.stack([ent[t[:, 0]], t[:, 1], ent[t[:, 2]]], 1)
                      for s, t in ((s, kg.triples(s)) for s in kg.split_names)}
            wide = KnowledgeGraph(splits, n, kg.num_relations, self.entity_names, kg.relation_names, name=kg.name)
            wide.removed = getattr(kg, "removed", {})
            clients.append(wide)
        return FederatedKG(clients, [torch.arange(n) for _ in clients], self.relation_index, n, self.num_relations,
                           self.entity_names, self.relation_names, self.name)

    def entity_existence(self) -> Tensor:
        """``BoolTensor[C, num_entities]``: ``v^c``, True where client c holds the entity."""
        return _existence(self.entity_index, self.num_entities)

    def relation_existence(self) -> Tensor:
        """``BoolTensor[C, num_relations]``, True where client c holds the relation."""
        return _existence(self.relation_index, self.num_relations)

    def union(self) -> KnowledgeGraph:
        """All clients' data in global ids (the centralised 'entire' setting).

        Each split is the concatenation of the clients' splits (client 0 first) with
        duplicates removed; splits present only in some clients are included too.
        """
        names: list[str] = []
        for kg in self.clients:
            names += [s for s in kg.split_names if s not in names]
        splits = {}
        for s in names:
            parts = [self.global_triples(c, s) for c, kg in enumerate(self.clients)
                     if s in kg.split_names]
            splits[s] = unique_triples(torch.cat(parts), self.num_entities, self.num_relations)
        return KnowledgeGraph(splits, self.num_entities, self.num_relations,
                              self.entity_names, self.relation_names, name=self.name)

    def stats(self) -> list[dict]:
        """Per client: ``{"client", "name", "entities", "relations", "train", "valid", "test", ...}``."""
        return [{"client": c, **kg.stats()} for c, kg in enumerate(self.clients)]

    def __repr__(self) -> str:
        return (f"FederatedKG(name={self.name!r}, clients={self.num_clients}, "
                f"entities={self.num_entities}, relations={self.num_relations})")
