"""Where the client halves of a round-based run live: a *client pool*.

:class:`~.federation.FederatedRun` talks to its clients only through a pool.
:class:`LocalClients` (the default) keeps every party and client half in this process;
another pool (:class:`~lightning_fedkg.backends.ray.clients.RayClients`, ``federated.clients=ray``; Flower's) keeps
them elsewhere and implements the same operations:
:meth:`exchange`, :meth:`deliver`, :meth:`states` / :meth:`load_states`, :meth:`close` /
:meth:`mute`. A pool is built by a factory ``pool(run)`` passed as
``FederatedRun(..., clients=pool)``. See docs/DESIGN.md.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from typing import Any, Callable

from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import SERVER

__all__ = ["ClientPool", "LocalClients", "Wire"]

log = logging.getLogger("lightning_fedkg")

#: The Channel names of one stage's two directions: ``(download name, upload name)``.
Wire = tuple[str, str]


def _where(err: BaseException) -> str:
    """`` (at file.py:line)``: the innermost line of this package the error passed through, so
    that a client's failure in a log says where (the whole traceback at DEBUG level)."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if f"{os.sep}lightning_fedkg{os.sep}" in f.filename]
    return f" (at {frames[-1].filename.rsplit(os.sep + 'lightning_fedkg' + os.sep, 1)[1]}:{frames[-1].lineno})" \
        if frames else ""


class ClientPool:
    """The operations a :class:`~.federation.FederatedRun` needs from its clients."""

    #: The clients' names, in client order (``client_0``, ...).
    names: list[str]

    def exchange(self, round: int, stage: str, messages: dict[str, Message], wire: Wire,
                 channel: Channel, timeout: float | None) -> tuple[dict[str, Message], dict[str, str]]:
        """``(replies, failures)`` of the clients addressed by ``messages`` for ``stage``."""
        raise NotImplementedError

    def deliver(self, round: int, name: str, message: Message, down: str, channel: Channel) -> None:
        """Write ``message``'s arrays into client ``name``'s shared groups; no reply."""
        raise NotImplementedError

    def states(self, weights_only: bool = False) -> dict[str, Any]:
        """``{client: state}`` for a checkpoint (see :meth:`~.federation.FederatedRun.party_states`)."""
        raise NotImplementedError

    def load_states(self, load: Callable[[str], Any], weights_only: bool = False) -> None:
        """Restore every client from ``load(client)``."""
        raise NotImplementedError

    @property
    def parties(self) -> list:
        """The clients' :class:`~.party.Party` objects, where they are in this process."""
        raise RuntimeError(f"the clients of this run live outside this process ({type(self).__name__}); "
                           f"their parties cannot be reached from here")

    def report(self) -> dict:
        """Blocks for ``metrics.json`` about where the clients ran (none by default)."""
        return {}

    def mute(self) -> None:
        """Log nothing more to TensorBoard."""

    def close(self) -> None:
        """Release what the pool holds."""


class LocalClients(ClientPool):
    """Every client's party and half in this process, called one after the other.

    Each message still crosses the :class:`~.channel.Channel` (serialized and decoded), so
    what a client receives is a copy, exactly as from another process.
    """

    def __init__(self, parties: list, halves: dict[str, Any]) -> None:
        self._parties = list(parties)
        self.halves = dict(halves)
        self.names = [p.name for p in self._parties]

    @property
    def parties(self) -> list:
        return self._parties

    def exchange(self, round, stage, messages, wire, channel, timeout):
        down, up = wire
        replies, failures = {}, {}
        for name, message in messages.items():
            received = message if message.is_empty() else channel.send(SERVER, name, down, message, round)
            start = time.perf_counter()
            try:
                reply = self.halves[name].handle(stage, received, round)
            except Exception as err:  # a failing client must not take the federation down
                failures[name] = f"{type(err).__name__}: {err}"
                log.warning("round %d, %s: %s failed: %s%s", round, stage, name, failures[name], _where(err),
                            exc_info=log.isEnabledFor(logging.DEBUG))
                continue
            elapsed = time.perf_counter() - start
            if timeout is not None and elapsed > timeout:
                # In-process calls cannot be interrupted: a late answer is discarded.
                failures[name] = f"timeout after {elapsed:.3f} s (federated.client_timeout={timeout})"
                log.warning("round %d, %s: %s %s", round, stage, name, failures[name])
                continue
            reply = reply if reply is not None else Message()
            replies[name] = reply if reply.is_empty() else channel.send(name, SERVER, up, reply, round)
        return replies, failures

    def deliver(self, round, name, message, down, channel):
        received = message if message.is_empty() else channel.send(SERVER, name, down, message, round)
        self.halves[name].receive(received.arrays)

    def states(self, weights_only=False):
        out = {}
        for p in self._parties:
            state = {"module": p.state_dict()["module"]} if weights_only else p.state_dict()
            state["half"] = self.halves[p.name].state_dict()
            out[p.name] = state
        return out

    def load_states(self, load, weights_only=False):
        for p in self._parties:
            state = load(p.name)
            p.load_state_dict(state, weights_only=weights_only)
            self.halves[p.name].load_state_dict(state["half"])

    def mute(self):
        for p in self._parties:
            if p.writer is not None:
                p.writer.close()
                p.writer = None

    def close(self):
        self.mute()
