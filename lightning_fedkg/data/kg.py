"""Knowledge graphs with integer ids: :class:`KnowledgeGraph` and the input policy.

A :class:`KnowledgeGraph` holds named splits (``train``, ``valid``, ``test``, and any extra
split a source carries, e.g. FedLU's forgetting sets) as ``LongTensor[E, 3]`` (head,
relation, tail) with optional vocabularies, and each split as a PyG ``Data``
(:meth:`KnowledgeGraph.data`). Every loader applies :func:`clean_splits` (duplicates and
unseen evaluation triples are dropped with a logged count). The readers of the on-disk
formats are in :mod:`.kg_io`, PyG datasets in and out in :mod:`.pyg`, the one entry point
:func:`~lightning_fedkg.data.loading.load_kg` in :mod:`.loading`; formats and the input
policy are in docs/datasets.md.
"""

from __future__ import annotations

import functools
import logging

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from lightning_fedkg.keys import pack_keys

logger = logging.getLogger("lightning_fedkg")

SPLITS: tuple[str, ...] = ("train", "valid", "test")

class KGFormatError(ValueError):
    """A knowledge-graph file that cannot be read: the message names ``file:line``."""


# --------------------------------------------------------------------------------------
# Triple utilities (vectorized; shared with the federated layer and the datamodule)
# --------------------------------------------------------------------------------------


def triple_keys(triples: Tensor, num_entities: int, num_relations: int) -> Tensor:
    """Injective int64 key ``(h * R + r) * N + t`` of each triple (``LongTensor[E]``).

    Raises :class:`lightning_fedkg.keys.KeyOverflowError` (a ``ValueError``) when ``N * R * N``
    exceeds the int64 range.
    """
    t = triples.long()
    return pack_keys((t[:, 0], t[:, 1], t[:, 2]), (num_entities, num_relations, num_entities), "triples")


def first_occurrence(keys: Tensor) -> Tensor:
    """Indices of the first occurrence of every distinct key, in original order."""
    # numpy's unique reports first occurrences directly (torch's does not)
    _, first = np.unique(keys.numpy(), return_index=True)
    return torch.from_numpy(np.sort(first)).long()


def unique_triples(triples: Tensor, num_entities: int, num_relations: int) -> Tensor:
    """Triples with duplicates removed, first occurrences kept in their original order."""
    return triples[first_occurrence(triple_keys(triples, num_entities, num_relations))]

#: The splits a model is evaluated on. Every other split of a KG (``train`` and any extra
#: split a source carries, such as FedLU's forgetting sets) holds triples the party owns as
#: training data: the reference of the input policy and of a client's vocabulary. An extra
#: split may hold triples that ``train`` lacks (an unlearning's retrain folder keeps the
#: removed triples there), so a federation reloaded from it keeps its entities, ids and
#: evaluation splits.
EVALUATION_SPLITS: tuple[str, ...] = ("valid", "test")


def training_triples(splits: dict[str, Tensor]) -> Tensor:
    """The triples of every split in ``splits`` but :data:`EVALUATION_SPLITS` (``train`` first)."""
    names = ["train"] + [s for s in splits if s != "train" and s not in EVALUATION_SPLITS]
    return torch.cat([splits[s] for s in names if s in splits])


def clean_splits(
    splits: dict[str, Tensor], num_entities: int, num_relations: int, source: str = "kg"
) -> tuple[dict[str, Tensor], dict[str, dict[str, int]]]:
    """Apply the input policy to id splits (the reference is :func:`training_triples`:
    ``train`` and any extra split that is not an evaluation split).

    Removes duplicates inside each split, then drops triples of every other split whose
    head, relation or tail does not occur in the reference. Non-zero counts are logged with
    ``source`` in the message. Returns the cleaned splits and
    ``{split: {"duplicates": d, "unseen": u}}``.
    """
    if "train" not in splits:
        raise KeyError("splits must contain 'train'")
    out: dict[str, Tensor] = {}
    removed: dict[str, dict[str, int]] = {}
    train = unique_triples(splits["train"], num_entities, num_relations)
    reference = training_triples({**splits, "train": train})
    seen_ent = torch.zeros(num_entities, dtype=torch.bool)
    seen_ent[reference[:, 0]] = True
    seen_ent[reference[:, 2]] = True
    seen_rel = torch.zeros(num_relations, dtype=torch.bool)
    seen_rel[reference[:, 1]] = True
    for name, triples in splits.items():
        unique = train if name == "train" else unique_triples(triples, num_entities, num_relations)
        dup = triples.shape[0] - unique.shape[0]
        unseen = 0
        if name in EVALUATION_SPLITS:
            keep = seen_ent[unique[:, 0]] & seen_rel[unique[:, 1]] & seen_ent[unique[:, 2]]
            unseen = int((~keep).sum())
            unique = unique[keep]
        out[name] = unique
        removed[name] = {"duplicates": dup, "unseen": unseen}
        if dup:
            logger.warning("%s: removed %d duplicate triples from split '%s'", source, dup, name)
        if unseen:
            logger.warning(
                "%s: dropped %d '%s' triples whose entity or relation does not occur in train",
                source, unseen, name,
            )
    return out, removed


# --------------------------------------------------------------------------------------
# KnowledgeGraph
# --------------------------------------------------------------------------------------


class KnowledgeGraph:
    """One KG with integer ids ``0..num_entities-1`` and ``0..num_relations-1``.

    Args:
        splits: ``{split: LongTensor[E, 3]}`` with columns (head, relation, tail); must
            contain ``"train"``, ``"valid"`` and ``"test"`` and may contain more.
        num_entities, num_relations: sizes of the id spaces (ids may be unused).
        entity_names, relation_names: optional id -> name lists.
        name: a label used in logs and stats.

    The constructor only validates; loaders apply the input policy (:func:`clean_splits`).
    """

    def __init__(
        self,
        splits: dict[str, Tensor],
        num_entities: int,
        num_relations: int,
        entity_names: list[str] | None = None,
        relation_names: list[str] | None = None,
        name: str = "kg",
    ) -> None:
        missing = [s for s in SPLITS if s not in splits]
        if missing:
            raise ValueError(f"splits must contain {SPLITS}; missing {missing}")
        self.name = name
        self.num_entities = int(num_entities)
        self.num_relations = int(num_relations)
        self._splits: dict[str, Tensor] = {}
        for split, triples in splits.items():
            t = torch.as_tensor(triples)
            if t.dim() != 2 or t.shape[1] != 3:
                raise ValueError(f"split '{split}' must have shape [E, 3], got {tuple(t.shape)}")
            t = t.long().contiguous()
            if t.numel():
                ent = t[:, [0, 2]]
                if int(ent.min()) < 0 or int(ent.max()) >= self.num_entities:
                    raise ValueError(f"split '{split}': entity id outside [0, {self.num_entities})")
                if int(t[:, 1].min()) < 0 or int(t[:, 1].max()) >= self.num_relations:
                    raise ValueError(f"split '{split}': relation id outside [0, {self.num_relations})")
            self._splits[split] = t
        for label, names, size in (("entity", entity_names, self.num_entities),
                                   ("relation", relation_names, self.num_relations)):
            if names is not None and len(names) != size:
                raise ValueError(f"{len(names)} {label} names for {size} ids")
        self.entity_names = list(entity_names) if entity_names is not None else None
        self.relation_names = list(relation_names) if relation_names is not None else None
        #: what the loader's input policy removed: ``{split: {"duplicates", "unseen"}}``
        self.removed: dict[str, dict[str, int]] = {}

    # Built on first use: a federation makes a KnowledgeGraph per client, and training never
    # looks a name up (a 300k-entity vocabulary is a 0.2 s dict per graph).
    @functools.cached_property
    def entity_to_id(self) -> dict[str, int]:
        """Entity name -> id (empty without names)."""
        return {n: i for i, n in enumerate(self.entity_names)} if self.entity_names else {}

    @functools.cached_property
    def relation_to_id(self) -> dict[str, int]:
        """Relation name -> id (empty without names)."""
        return {n: i for i, n in enumerate(self.relation_names)} if self.relation_names else {}

    @property
    def split_names(self) -> list[str]:
        """Names of the splits, ``train``, ``valid``, ``test`` first."""
        return list(self._splits)

    def triples(self, split: str = "train") -> Tensor:
        """``LongTensor[E, 3]`` (head, relation, tail) of one split."""
        try:
            return self._splits[split]
        except KeyError:
            raise KeyError(f"unknown split '{split}'; have {self.split_names}") from None

    def data(self, split: str = "train") -> Data:
        """One split as ``Data(edge_index=[2, E] (heads, tails), edge_type=[E], num_nodes=N)``."""
        t = self.triples(split)
        return Data(edge_index=t[:, [0, 2]].t().contiguous(), edge_type=t[:, 1].clone(),
                    num_nodes=self.num_entities)

    @property
    def train(self) -> Data:
        return self.data("train")

    @property
    def valid(self) -> Data:
        return self.data("valid")

    @property
    def test(self) -> Data:
        return self.data("test")

    def all_true_triples(self) -> Tensor:
        """Distinct triples of train ∪ valid ∪ test."""
        cat = torch.cat([self._splits[s] for s in SPLITS])
        return unique_triples(cat, self.num_entities, self.num_relations)

    def stats(self) -> dict:
        """``{"name", "entities", "relations", "train", "valid", "test", <other splits>}``."""
        out: dict = {"name": self.name, "entities": self.num_entities,
                     "relations": self.num_relations}
        out.update({s: int(t.shape[0]) for s, t in self._splits.items()})
        return out

    def __repr__(self) -> str:
        sizes = ", ".join(f"{s}={t.shape[0]}" for s, t in self._splits.items())
        return (f"KnowledgeGraph(name={self.name!r}, entities={self.num_entities}, "
                f"relations={self.num_relations}, {sizes})")

