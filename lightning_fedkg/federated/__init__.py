"""Federated KGE: parties, strategies as server/client halves, a transport, the round runner.

* :class:`~.channel.Channel` — the in-process transport; every message crosses as bytes
  and is logged (``"server"``, ``"client_k"``).
* :mod:`.message` — :class:`~.message.Message`: named arrays, metrics and config.
* :mod:`.alignment` — round-0 alignment from keyed hashes of names.
* :mod:`.aggregation` — holder-mean over the clients that hold each row (FedE Eq. 2).
* :mod:`.strategies` — ``single``, ``entire``, ``fede``, ``fedr`` (registry: ``STRATEGIES``).
* :mod:`.tasks`, :mod:`.phases` — pluggable tasks and post-training phases.
* :func:`~.orchestrator.run_federated` — the resumable round loop behind ``fedkg fit``.
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
    "Single",
    "Entire",
    "FedE",
    "FedR",
    "STRATEGIES",
    "build_strategy",
    "run_federated",
    "format_table",
]

_LAZY = {
    "run_federated": "orchestrator",
    "format_table": "orchestrator",
    "Strategy": "strategies",
    "ServerHalf": "strategies",
    "ClientHalf": "strategies",
    "Single": "strategies",
    "Entire": "strategies",
    "FedE": "strategies",
    "FedR": "strategies",
    "STRATEGIES": "strategies",
    "build_strategy": "strategies",
}


def __getattr__(name: str):
    # The runner and strategies import Lightning and the data layer; load them only when asked for.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"lightning_fedkg.federated.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'lightning_fedkg.federated' has no attribute {name!r}")
