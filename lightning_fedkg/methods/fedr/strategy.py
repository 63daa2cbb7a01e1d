"""FedR: federated averaging of relation embeddings only.

Zhang et al., "Efficient Federated Learning on Knowledge Graphs via Privacy-preserving
Relation Embedding Aggregation", Findings of EMNLP 2022 (arXiv 2203.09553). The server
keeps a union *relation* table and averages each relation over the clients that hold it,
with the engine of FedE (:class:`~.fede.HolderMeanServer`) over the module's
``"relation"`` group; **entity embeddings never leave a client**.

Relation alignment uses keyed hashes (round 0, :mod:`..alignment`) where FedR prescribes a
Private Set Union; the uploads are in clear unless ``federated.secure_aggregation`` is on
(FedR prescribes secure aggregation; :mod:`lightning_fedkg.federated.secure` masks them).

On relation-partitioned benchmarks (FedE's Fed-k, FedLU's R-k/C-k, FedCQA splits) the
clients' relation sets are **disjoint**, so every relation has exactly one holder, the
holder-mean returns each client's own rows and FedR trains exactly like *Single* (apart
from the initial relation rows, which come from the server). A FedR effect needs splits
with shared relations.
"""

from __future__ import annotations

from lightning_fedkg.federated.strategy import ClientHalf, Strategy
from lightning_fedkg.federated.holder_mean import HolderMeanServer

__all__ = ["FedR"]


class FedR(Strategy):
    """FedR: holder-mean of the ``"relation"`` group; entities stay local."""

    name = "fedr"
    Server = HolderMeanServer
    Client = ClientHalf
    groups = ("relation",)
