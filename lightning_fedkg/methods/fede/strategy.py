"""FedE: federated averaging of entity embeddings over the clients that hold each entity.

Chen et al., "FedE: Embedding Knowledge Graphs in Federated Setting", IJCKG 2021, Alg. 1.
Each round the selected clients receive their rows of the union entity table, train them
with their own relations for E local epochs and send them back; the server takes the
holder-mean (Eq. 2, :mod:`lightning_fedkg.federated.holder_mean`). Relation embeddings
never leave a client. Clients are evaluated with the aggregated rows. FedR
(:mod:`lightning_fedkg.methods.fedr`) is the same server over the ``"relation"`` group.
See docs/methods/fede.md.
"""

from __future__ import annotations

from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.strategy import ClientHalf, Strategy

from .config import FedEConfig

__all__ = ["FedE"]


class FedE(Strategy):
    """FedE (Chen et al., IJCKG 2021): holder-mean of the ``"entity"`` group; relations stay local."""

    name = "fede"
    Server = HolderMeanServer
    Client = ClientHalf
    groups = ("entity",)
    config_class = FedEConfig

    @classmethod
    def phases(cls, cfg) -> list[str]:
        return ["fusion"] if cfg.federated.fede.fusion else []
