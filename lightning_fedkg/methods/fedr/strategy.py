"""FedR: federated averaging of relation embeddings only.

Zhang et al., "Efficient Federated Learning on Knowledge Graphs via Privacy-preserving
Relation Embedding Aggregation", Findings of EMNLP 2022. FedE's holder-mean server over
the ``"relation"`` group; entity embeddings never leave a client. Uploads are in clear
unless ``federated.secure_aggregation`` is on. On relation-partitioned splits every
relation has one holder and FedR trains like Single; see docs/methods/fedr.md.
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
