"""*Single*: every client trains alone on its own KG (FedE's Isolation)."""

from .strategy import Single, SingleServer

__all__ = ["Single", "SingleServer"]
