"""*Single* (FedE's "Isolation"): every client trains alone on its own KG; nothing is exchanged.

The lower reference of FedE, Chen et al., IJCKG 2021, §3.1. Every client trains in every
round, whatever ``federated.fraction`` says: sampling only matters when something is shared.
"""

from __future__ import annotations

from lightning_fedkg.federated.strategies.base import Strategy

__all__ = ["Single"]


class Single(Strategy):
    """Isolated training: all learners every round, no Channel traffic at all."""

    name = "single"

    def select_clients(self, round: int, generator=None) -> list[int]:
        """Every client, every round (no draw from the selection generator)."""
        return list(range(self.num_learners))
