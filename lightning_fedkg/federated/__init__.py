"""Federated KGE: a Channel that logs every payload, Strategies, and the round loop.

* :class:`~.channel.Channel` — the only path between parties (``"server"``, ``"client_k"``).
* :mod:`.aggregation` — holder-mean over the clients that hold each row (FedE Eq. 2).
* :mod:`.strategies` — ``single``, ``entire``, ``fede``, ``fedr`` behind one hook set.
* :func:`~.orchestrator.run_federated` — the resumable round loop behind ``fedkg fit``.
"""

from lightning_fedkg.federated.aggregation import damped_holder_mean, holder_counts, holder_mean, holder_sums
from lightning_fedkg.federated.channel import Channel, Record
from lightning_fedkg.federated.strategies import STRATEGIES, Entire, FedE, FedR, Single, Strategy, build_strategy

__all__ = [
    "Channel",
    "Record",
    "holder_mean",
    "damped_holder_mean",
    "holder_sums",
    "holder_counts",
    "Strategy",
    "Single",
    "Entire",
    "FedE",
    "FedR",
    "STRATEGIES",
    "build_strategy",
    "run_federated",
    "format_table",
]


def __getattr__(name: str):
    # The orchestrator imports Lightning and the data layer; load it only when asked for.
    if name in ("run_federated", "format_table"):
        from lightning_fedkg.federated import orchestrator

        return getattr(orchestrator, name)
    raise AttributeError(f"module 'lightning_fedkg.federated' has no attribute {name!r}")
