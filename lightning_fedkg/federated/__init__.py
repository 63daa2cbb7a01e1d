"""The federated core: parties, strategies as server/client halves, a transport, the runners.

It names no method: methods live in :mod:`lightning_fedkg.methods` and are found through
the registries (:mod:`lightning_fedkg.registry`).

* :class:`~.channel.Channel` -- the in-process transport; every message crosses as bytes
  and is logged (``"server"``, ``"client_k"``).
* :mod:`.message` -- :class:`~.message.Message`: named arrays, metrics and config.
* :mod:`.alignment` -- round-0 alignment from keyed hashes of names.
* :mod:`.aggregation` -- holder-mean over the clients that hold each row (FedE Eq. 2);
  :mod:`.holder_mean` -- the server half built on it.
* :mod:`.strategy` -- :class:`~.strategy.Strategy`, :class:`~.strategy.ServerHalf`,
  :class:`~.strategy.ClientHalf`; :mod:`.peer` -- peer-to-peer halves and the event runner.
* :mod:`.tasks`, :mod:`.phases` -- pluggable tasks and post-training phases.
* :func:`~.orchestrator.run_federated` -- the resumable round loop behind ``fedkg fit``.
"""

from lightning_fedkg.federated.aggregation import damped_holder_mean, holder_counts, holder_mean, holder_sums
from lightning_fedkg.federated.channel import Channel, Record
from lightning_fedkg.federated.message import Message

__all__ = [
    "Channel",
    "Record",
    "Message",
    "holder_mean",
    "damped_holder_mean",
    "holder_sums",
    "holder_counts",
    "Strategy",
    "ServerHalf",
    "ClientHalf",
    "HolderMeanServer",
    "STRATEGIES",
    "run_federated",
]

_LAZY = {
    "run_federated": "orchestrator",
    "Strategy": "strategy",
    "ServerHalf": "strategy",
    "ClientHalf": "strategy",
    "STRATEGIES": "strategy",
    "HolderMeanServer": "holder_mean",
}


def __getattr__(name: str):
    # The runner and strategies import Lightning and the data layer; load them only when asked for.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"lightning_fedkg.federated.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lightning_fedkg.federated' has no attribute {name!r}")
