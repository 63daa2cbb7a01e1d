"""The federated core: parties, strategies as server/client halves, a transport, the loops.

It names no method: methods live in :mod:`lightning_fedkg.methods` and are found through
the registries (:mod:`lightning_fedkg.registry`). Main pieces: :class:`~.channel.Channel`
(the logged in-process transport), :mod:`.message`, :mod:`.alignment` (round 0 from keyed
hashes), :mod:`.aggregation` and :mod:`.holder_mean` (FedE's Eq. 2), :mod:`.strategy` and
:mod:`.peer` (the halves), :mod:`.tasks`, :mod:`.phases`, and
:func:`~.entry.run_federated`, which picks the loop (:mod:`.round_loop`, :mod:`.peer`) or
the backend and runs it through the one skeleton (:func:`~.runner.run_loop`).
The map is docs/DESIGN.md.
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
    "run_federated": "entry",
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
