"""FedR: federated averaging of relation embeddings only.

Zhang et al., "Efficient Federated Learning on Knowledge Graphs via Privacy-preserving
Relation Embedding Aggregation", Findings of EMNLP 2022 (arXiv 2203.09553). The server
keeps a union *relation* table and averages each relation over the clients that hold it,
with the engine of FedE (:class:`~.fede.HolderMeanStrategy`); **entity embeddings never
leave a client**.

What FedR additionally prescribes and this strategy does **not** implement yet:

* relation alignment by *Private Set Union* — here the union relation table and index
  maps come from the data layer, as if the union were already computed;
* *Secure Aggregation* of the uploads — here the server sees every relation row in clear.

On relation-partitioned benchmarks (FedE's Fed-k, FedLU's R-k/C-k, FedCQA splits) the
clients' relation sets are **disjoint**, so every relation has exactly one holder, the
holder-mean returns each client's own rows and FedR trains exactly like *Single* (apart
from the initial relation rows, which come from the server). A FedR effect needs splits
with shared relations.
"""

from __future__ import annotations

from torch import Tensor

from lightning_fedkg.federated.strategies.fede import HolderMeanStrategy

__all__ = ["FedR"]


class FedR(HolderMeanStrategy):
    """FedR: holder-mean of ``relation_*`` tables over ``relation_index``; entities stay local."""

    name = "fedr"
    prefix = "relation_"

    def index_maps(self, fkg) -> list[Tensor]:
        return list(fkg.relation_index)

    def existence(self, fkg) -> Tensor:
        return fkg.relation_existence()
