"""*Entire*: one model trained on the union of the clients' KGs (in-process reference)."""

from .strategy import Entire

__all__ = ["Entire"]
