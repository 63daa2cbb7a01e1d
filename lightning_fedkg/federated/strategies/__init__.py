"""Federated settings behind one Strategy interface (see :mod:`.base`)."""

from lightning_fedkg.federated.strategies.base import Strategy
from lightning_fedkg.federated.strategies.entire import Entire
from lightning_fedkg.federated.strategies.fede import FedE, HolderMeanStrategy
from lightning_fedkg.federated.strategies.fedr import FedR
from lightning_fedkg.federated.strategies.single import Single

#: ``federated.strategy`` config value → class.
STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in (Single, Entire, FedE, FedR)}


def build_strategy(name: str) -> Strategy:
    """A fresh strategy for a ``federated.strategy`` value (``single|entire|fede|fedr``)."""
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ValueError(f"unknown federated strategy {name!r}; valid: {', '.join(STRATEGIES)}") from None


__all__ = ["Strategy", "Single", "Entire", "FedE", "FedR", "HolderMeanStrategy", "STRATEGIES", "build_strategy"]
