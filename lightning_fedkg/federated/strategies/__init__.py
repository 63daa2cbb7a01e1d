"""Federated settings, each a :class:`~.base.Strategy` of a server and a client half."""

from lightning_fedkg.federated.strategies.base import STRATEGIES, ClientHalf, ServerHalf, Strategy
from lightning_fedkg.federated.strategies.entire import Entire
from lightning_fedkg.federated.strategies.fede import FedE, HolderMeanServer
from lightning_fedkg.federated.strategies.fedec import FedEC
from lightning_fedkg.federated.strategies.fedprox import FedProx
from lightning_fedkg.federated.strategies.fedr import FedR
from lightning_fedkg.federated.strategies.single import Single


def build_strategy(name: str) -> type[Strategy]:
    """The strategy class for a ``federated.strategy`` value (a registered name or an import path)."""
    return STRATEGIES.get(name)


__all__ = ["Strategy", "ServerHalf", "ClientHalf", "Single", "Entire", "FedE", "FedR", "FedProx", "FedEC",
           "HolderMeanServer", "STRATEGIES", "build_strategy"]
