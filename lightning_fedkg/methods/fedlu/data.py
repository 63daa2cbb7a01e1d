"""FedLU's data rules, which the core data layer does not know.

* The forgetting set: a client's ``unlearn`` split (:data:`FORGET_SPLIT`), read from FedLU's
  files (``<k>/unlearn.txt``) as an extra split, whose triples count among the client's
  training triples (:func:`lightning_fedkg.data.kg.training_triples`); an unlearning's retrain
  folder keeps the removed triples there, so the retrained federation has the source's ids.
* The official validation filter, ``train.valid_filter: without_unlearn``: validation is
  filtered by train ∪ valid ∪ test minus the forgetting set, as the official FedLU client's
  validation loaders are (the test keeps the full filter). For parity only: validation then
  ranks some queries against known true triples.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.data import KGDataModule
from lightning_fedkg.data.kg import triple_keys

__all__ = ["FORGET_SPLIT", "VALID_FILTERS", "without_forget_set", "apply_valid_filter"]

#: The split that holds a client's forgetting set.
FORGET_SPLIT = "unlearn"
#: ``train.valid_filter`` values FedLU honours (the field stays in ``train``, where users set it).
VALID_FILTERS = ("all", "without_unlearn")


def without_forget_set(datamodule: KGDataModule) -> Tensor:
    """The datamodule's evaluation truth without its KG's forgetting set (order kept)."""
    kg, triples = datamodule.kg, datamodule.evaluation_truth()
    forget = triple_keys(kg.triples(FORGET_SPLIT), kg.num_entities, kg.num_relations)
    return triples[~torch.isin(triple_keys(triples, kg.num_entities, kg.num_relations), forget)]


def apply_valid_filter(valid_filter: str, datamodule: KGDataModule) -> KGDataModule:
    """``datamodule`` with the validation filter ``valid_filter`` names (``all``: the test's,
    as built; ``without_unlearn``: :func:`without_forget_set`, where the KG has a
    forgetting set). Returns ``datamodule``."""
    if valid_filter not in VALID_FILTERS:
        raise ValueError(f"valid_filter must be one of {VALID_FILTERS}, got {valid_filter!r}")
    if valid_filter == "without_unlearn" and FORGET_SPLIT in datamodule.kg.split_names:
        datamodule.set_valid_filter(without_forget_set(datamodule))
    return datamodule
