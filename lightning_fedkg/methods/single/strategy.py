"""*Single* (FedE's "Isolation"): every client trains alone on its own KG; nothing is exchanged.

The lower reference of FedE, Chen et al., IJCKG 2021, §3.1. Every client trains in every
round, whatever ``federated.fraction`` says: sampling only matters when something is shared.
No array ever crosses; clients report only their evaluation metrics.
"""

from __future__ import annotations

from lightning_fedkg.federated.strategy import ServerHalf, Strategy

__all__ = ["Single"]


class SingleServer(ServerHalf):
    def select_clients(self, round: int) -> list[str]:
        """Every client, every round (no draw from the selection generator)."""
        return list(self.clients)


class Single(Strategy):
    """Isolated training: all clients every round, no arrays on the wire."""

    name = "single"
    Server = SingleServer
