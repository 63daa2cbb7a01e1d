"""A FedE-like strategy whose client_1 crashes in round 1, named by import path
(``federated.strategy: tests.plugin_flaky:FlakyFedE``) so that it also fails inside a Ray
actor, where a test's monkeypatch does not reach; used by tests/test_clients_ray.py."""

from __future__ import annotations

from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.strategy import ClientHalf, Strategy

__all__ = ["FlakyClient", "FlakyFedE"]


class FlakyClient(ClientHalf):
    """FedE's client half, but client_1 takes its rows and then crashes in round 1."""

    def on_train(self, message, round):
        if self.party.name == "client_1" and round == 1:
            self.receive(message.arrays)
            raise RuntimeError("injected crash")
        return super().on_train(message, round)


class FlakyFedE(Strategy):
    """Holder-mean of the ``"entity"`` group with :class:`FlakyClient`."""

    name = "flaky_fede"
    Server = HolderMeanServer
    Client = FlakyClient
    groups = ("entity",)
