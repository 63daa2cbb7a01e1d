"""Peer-to-peer methods: parties without a server, driven by events instead of rounds.

A :class:`PeerStrategy` has one half, :class:`PeerHalf`, at every party; a peer reacts to a
delivered message by returning the ``(receiver, event, Message)`` triples it sends next.
:class:`EventRunner` delivers them one at a time, FIFO, through the same
:class:`~.channel.Channel`, parties and checkpoints as the round loop, so a run is
reproducible and resumable after any event; ``federated.backend=ray`` (:mod:`~lightning_fedkg.backends.ray.peer`)
replaces the scheduler, not the peers. The budget is ``federated.rounds`` deliveries.
See docs/DESIGN.md.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from lightning_fedkg.config import ConfigError, ExperimentConfig
from lightning_fedkg.federated.alignment import federation_key, hash_names
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.checkpoint import (
    CHECKPOINT_DIR,
    CheckpointError,
    capture_rng,
    check_format,
    latest_manifest,
    load_party,
    read_manifest,
    resolve_manifest,
    restore_rng,
)
from lightning_fedkg.federated.message import Message, decode, encode
from lightning_fedkg.federated.party import Party, build_client_parties, load_federated_kg
from lightning_fedkg.federated.runner import Loop, run_loop
from lightning_fedkg.federated.strategy import STRATEGIES, Strategy
from lightning_fedkg.federated.tasks import TASKS, weighted_average, with_count

__all__ = ["PeerHalf", "PeerStrategy", "EventRunner", "Delivery", "run_peer_to_peer", "peer_strategy",
           "build_named_party", "evaluate_peer_checkpoint"]

log = logging.getLogger("lightning_fedkg")

#: What a peer sends: ``(receiver, event, message)``.
Outgoing = tuple[str, str, Message]
RUNNER = "runner"
CHECKPOINT_VERSION = 2


@dataclass
class Delivery:
    """A message in flight: already sent (logged) by ``sender``, not yet handled by ``receiver``."""

    sender: str
    receiver: str
    event: str
    message: Message


class PeerHalf:
    """One party of a peer-to-peer method; acts on its own :class:`~.party.Party` only.

    Subclasses implement :meth:`start` (what a peer sends when the run begins) and one
    ``on_<event>(message, sender) -> list[Outgoing]`` per event they handle.
    """

    def __init__(self, party: Party, strategy: type["PeerStrategy"], peers: list[str]) -> None:
        self.party = party
        self.name = party.name
        self.cfg = party.cfg
        #: The method's own ``federated.<name>`` section (None without one), as for the halves.
        self.settings = strategy.section(party.cfg)
        self.groups = strategy.groups
        self.peers = [p for p in peers if p != party.name]
        self._key = federation_key(party.cfg.federated.federation_key, party.cfg.seed)

    def digests(self, index: str = "entity") -> Tensor:
        """Keyed hashes of this party's item names, for pairwise alignment with a peer."""
        return hash_names(self.party.names[index], self._key)

    def start(self) -> list[Outgoing]:
        """Messages sent when the run begins (default: none)."""
        return []

    def handle(self, event: str, message: Message, sender: str) -> list[Outgoing]:
        handler = getattr(self, f"on_{event}", None)
        if handler is None:
            raise NotImplementedError(f"{type(self).__name__} has no handler for event {event!r}")
        return list(handler(message, sender) or [])

    def report(self) -> dict:
        """JSON-able facts for ``metrics.json["peers"][name]`` (default: none)."""
        return {}

    def state_dict(self) -> dict:
        """Protocol state beyond the party's weights (queues, counters, budgets)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def close(self) -> None:
        """Release what the peer holds beyond its state (threads, files) when the run ends
        (default: nothing)."""


class PeerStrategy(Strategy):
    """A method run by :class:`EventRunner`: no server half, one :attr:`Peer` half per party.

    Attributes:
        checkpoint_events: the events after whose delivery the runner commits a resume
            point; None commits after every delivery. A method whose inner loop is many
            small messages (FKGE's PPAT batches) commits at its protocol's boundaries only.
    """

    runner = "event"
    Peer: type[PeerHalf] = PeerHalf
    checkpoint_events: frozenset[str] | None = None

    @classmethod
    def build_parties(cls, cfg: ExperimentConfig, task, run_dir: Path | None,
                      purge_step: int | None, only: str | None = None) -> list[Party]:
        """The parties of a run (default: one per client of ``cfg.data``'s federated KG).

        ``only``: build just the party of that name (a process that runs one party, such
        as a Ray actor, builds nothing else). An override builds the parties
        :meth:`party_names` lists and honours ``only``.
        """
        return build_client_parties(cfg, task, load_federated_kg(cfg), run_dir, purge_step, only=only)

    @classmethod
    def party_names(cls, cfg: ExperimentConfig) -> list[str]:
        """The names of the parties :meth:`build_parties` builds, without building them (the
        Ray backend's driver addresses one actor per name). Default: ``client_<k>`` for each
        client of ``cfg.data``'s federated KG (the KG is loaded, no module is built); for a
        strategy that overrides :meth:`build_parties` and not this, the names of parties
        built here (correct, but it builds every model: override this too)."""
        from lightning_fedkg.federated.strategy import client_name

        if getattr(cls.build_parties, "__func__", None) is PeerStrategy.build_parties.__func__:
            return [client_name(k) for k in range(load_federated_kg(cfg).num_clients)]
        return [p.name for p in cls.build_parties(cfg, TASKS.get(cfg.federated.task)(), None, None)]

    @classmethod
    def summarize(cls, reports: dict[str, dict]) -> dict:
        """Top-level ``metrics.json`` entries built from every peer's :meth:`PeerHalf.report`
        (default: none; the reports are always kept under ``"peers"``)."""
        return {}


class EventRunner:
    """Delivers peers' messages one at a time through a Channel (deterministic FIFO).

    Attributes:
        parties, peers: ``{name: Party}``, ``{name: PeerHalf}``.
        pending: messages sent and not yet handled.
        events: deliveries handled so far (the ``round`` field of the wire log).
    """

    def __init__(self, cfg: ExperimentConfig, run_dir: str | Path | None, purge_step: int | None = None,
                 transport: Channel | None = None) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.strategy = peer_strategy(cfg)
        self.task = TASKS.get(cfg.federated.task)()
        self.channel = transport if transport is not None else Channel()
        clients = self.strategy.build_parties(cfg, self.task, self.run_dir, purge_step)
        self.parties = {p.name: p for p in clients}
        names = list(self.parties)
        self.peers = {n: self.strategy.Peer(p, self.strategy, names) for n, p in self.parties.items()}
        self.pending: deque[Delivery] = deque()
        self.events = 0
        self.started = False
        self.failures: list[dict] = []

    # ------------------------------------------------------------------ delivery
    def post(self, sender: str, outgoing: list[Outgoing]) -> None:
        """Send each outgoing message (logged now, at the current event count) and queue it."""
        for receiver, event, message in outgoing:
            if receiver not in self.peers:
                raise KeyError(f"{sender} sent {event!r} to unknown party {receiver!r}")
            received = self.channel.send(sender, receiver, event, message, self.events)
            self.pending.append(Delivery(sender, receiver, event, received))

    def start(self) -> None:
        """Every peer's opening messages, in party-name order."""
        for name in sorted(self.peers):
            self.post(name, self.peers[name].start())
        self.started = True

    def step(self) -> Delivery | None:
        """Handle the oldest pending message; None when nothing is pending."""
        if not self.pending:
            return None
        d = self.pending.popleft()
        self.events += 1
        try:
            outgoing = self.peers[d.receiver].handle(d.event, d.message, d.sender)
        except Exception as err:  # a failing peer must not take the others down
            reason = f"{type(err).__name__}: {err}"
            self.failures.append({"round": self.events, "stage": d.event, "party": d.receiver, "error": reason})
            log.warning("event %d: %s failed on %r from %s: %s", self.events, d.receiver, d.event, d.sender, reason)
            return d
        self.post(d.receiver, outgoing)
        return d

    def evaluate(self, split: str) -> tuple[dict, list[dict]]:
        """Each party evaluates itself (no server): ``(weighted average, per-party entries)``.

        Nothing is downloaded for it, so ``federated.evaluate`` changes nothing here: a
        party always evaluates what it holds (there is no aggregation to come before)."""
        per_party = [{"name": n, **self.parties[n].evaluate(split)} for n in sorted(self.parties)]
        return weighted_average(per_party, self.task.metric_keys), per_party

    # ------------------------------------------------------------------ state
    def states(self) -> dict[str, Any]:
        out: dict[str, Any] = {n: party_state(self.parties[n], self.peers[n]) for n in self.parties}
        out[RUNNER] = runner_state(self.events, self.started,
                                   [(d.sender, d.receiver, d.event, encode(d.message)) for d in self.pending],
                                   self.channel, self.failures)
        return out

    def load_states(self, load) -> None:
        for n in self.parties:
            load_party_state(self.parties[n], self.peers[n], load(n))
        runner = load(RUNNER)
        self.events, self.started = int(runner["events"]), bool(runner["started"])
        self.pending = deque(Delivery(s, r, e, decode(b)) for s, r, e, b in runner["pending"])
        self.channel.load_state_dict(runner["channel"])
        self.failures = list(runner["failures"])
        restore_rng(runner["rng"])

    def close(self) -> None:
        self.channel.close()
        for peer in self.peers.values():
            peer.close()
        for p in self.parties.values():
            if p.writer is not None:
                p.writer.close()


# ---------------------------------------------------------------------- shared by both backends
def peer_strategy(cfg: ExperimentConfig) -> type[PeerStrategy]:
    """The :class:`PeerStrategy` that ``federated.strategy`` names; ConfigError for any other."""
    strategy = STRATEGIES.get(cfg.federated.strategy)
    if not issubclass(strategy, PeerStrategy):
        raise ConfigError(f"{cfg.federated.strategy!r} is not a peer-to-peer strategy")
    fc = cfg.federated
    if fc.secure_aggregation.enabled or fc.dp.enabled:
        raise ConfigError(f"federated.secure_aggregation and federated.dp protect a server's aggregation; "
                          f"{fc.strategy!r} is peer-to-peer and has none (its own privacy settings are in "
                          f"federated.{fc.strategy})")
    return strategy


def build_named_party(strategy: type[PeerStrategy], cfg: ExperimentConfig, task, run_dir: Path | None,
                      purge_step: int | None, name: str) -> Party:
    """Only party ``name`` of a run (``build_parties(..., only=name)``)."""
    built = strategy.build_parties(cfg, task, run_dir, purge_step, only=name)
    if [p.name for p in built] != [name]:
        raise ConfigError(f"{strategy.__name__}.build_parties built no single party {name!r} (built "
                          f"{[p.name for p in built]}); its parties must be those party_names() lists")
    return built[0]


def party_state(party: Party, peer: PeerHalf) -> dict:
    """One party's checkpoint file: its weights/sampler state and its peer's protocol state."""
    return {"party": party.state_dict(), "peer": peer.state_dict()}


def load_party_state(party: Party, peer: PeerHalf, state: dict) -> None:
    """Undo :func:`party_state` in place."""
    party.load_state_dict(state["party"])
    peer.load_state_dict(state["peer"])


def runner_state(events: int, started: bool, pending: list[tuple[str, str, str, bytes]], channel: Channel,
                 failures: list[dict]) -> dict:
    """The ``runner`` checkpoint file: event count, messages sent and not yet handled
    (``(sender, receiver, event, bytes)``), the wire log, failures and this process's RNG."""
    return {"events": int(events), "started": bool(started), "pending": list(pending),
            "channel": channel.state_dict(), "failures": list(failures), "rng": capture_rng()}


def peer_metrics(cfg: ExperimentConfig, strategy: type[PeerStrategy], task, per_party: list[dict], *,
                 events: int, pending: int, channel: Channel, failures: list[dict], reports: dict[str, dict],
                 engine: str) -> dict:
    """The ``metrics.json`` dict of a peer-to-peer run (see :func:`run_peer_to_peer`)."""
    metrics = {
        "test": with_count(weighted_average(per_party, task.metric_keys), per_party),
        "clients": per_party,
        "events": int(events),
        "pending": int(pending),
        "bytes_sent": int(channel.total_bytes),
        "wire_bytes": int(channel.total_wire_bytes),
        "strategy": cfg.federated.strategy,
        "runner": "event",
        "engine": engine,
        "failures": list(failures),
    }
    metrics.update(strategy.summarize(reports))
    metrics["peers"] = reports
    return metrics


class EventLoop(Loop):
    """The deterministic event loop: :class:`EventRunner` in this process, a resume point
    after every delivery (or after the strategy's ``checkpoint_events``, the last delivery
    and the budget's end). ``metrics.json``: see :func:`peer_metrics`, with ``engine:
    "local"`` and ``wall_seconds`` (start to the last delivery, as on Ray)."""

    version = CHECKPOINT_VERSION
    unit = "event"

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, purge_step: int | None = None) -> None:
        self.cfg = cfg
        self.runner = EventRunner(cfg, run_dir, purge_step=purge_step)
        self.channel = self.runner.channel
        self.wall = 0.0

    def restore(self, load, manifest) -> None:
        self.runner.load_states(load)

    def run(self, commit) -> None:
        runner, budget = self.runner, self.cfg.federated.rounds
        began = time.perf_counter()
        if not runner.started:
            runner.start()
        commit_on = runner.strategy.checkpoint_events
        while runner.pending and runner.events < budget:
            delivered = runner.step()
            if commit_on is None or delivered.event in commit_on or not runner.pending or runner.events >= budget:
                commit(runner.events, runner.states())
        self.wall = time.perf_counter() - began

    def results(self) -> dict:
        runner = self.runner
        _, per_party = runner.evaluate("test")
        reports = {n: runner.peers[n].report() for n in sorted(runner.peers)}
        metrics = peer_metrics(self.cfg, runner.strategy, runner.task, per_party, events=runner.events,
                               pending=len(runner.pending), channel=runner.channel, failures=runner.failures,
                               reports=reports, engine="local")
        metrics["wall_seconds"] = round(self.wall, 3)
        return metrics

    def close(self) -> None:
        self.runner.close()


def run_peer_to_peer(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True) -> dict:
    """Run a :class:`PeerStrategy` on :class:`EventLoop` in ``run_dir`` until no message is
    pending or ``federated.rounds`` deliveries were handled; resumable after any delivery.
    ``run_dir`` is open and the process seeded (:func:`lightning_fedkg.run.fit`).

    Returns the ``metrics.json`` dict: ``test`` and ``clients`` (each party's own test, after
    the run, triple-weighted), ``events``, ``pending``, ``bytes_sent``, ``wire_bytes``,
    ``strategy``, ``runner: "event"``, ``engine`` (``"local"``), ``failures``, ``peers``
    (each peer's :meth:`PeerHalf.report`) and the strategy's :meth:`PeerStrategy.summarize`.
    """
    return run_loop(cfg, run_dir, EventLoop, EventLoop.version, resume)


def evaluate_peer_checkpoint(cfg: ExperimentConfig, ckpt: str | Path) -> dict:
    """Test every party of a peer-to-peer run with a committed state (``fedkg test``): ``ckpt``
    is a manifest, or a run or checkpoints folder (its newest committed state, e.g. the end
    of a finished run of either backend). Writes nothing; the caller seeds the process
    (:func:`lightning_fedkg.run.evaluate`).

    Returns ``{"test", "clients", "strategy", "events"}`` as in ``metrics.json``.
    """
    path = Path(ckpt)
    if path.is_dir():
        manifest_path = latest_manifest(path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path)
        if manifest_path is None:
            raise CheckpointError(f"no committed peer-to-peer checkpoint under {path}")
    else:
        manifest_path = resolve_manifest(path)
    manifest = read_manifest(manifest_path)
    check_format(manifest_path, manifest, CHECKPOINT_VERSION)
    runner = EventRunner(cfg, run_dir=None)
    for name, party in runner.parties.items():
        party.load_state_dict(load_party(manifest_path, manifest, name)["party"], weights_only=True)
    avg, per_party = runner.evaluate("test")
    return {"test": with_count(avg, per_party), "clients": per_party, "strategy": cfg.federated.strategy,
            "events": int(manifest.get("round", 0))}


def is_peer_strategy(name: str) -> bool:
    """Whether ``federated.strategy`` names a :class:`PeerStrategy`."""
    return issubclass(STRATEGIES.get(name), PeerStrategy)

