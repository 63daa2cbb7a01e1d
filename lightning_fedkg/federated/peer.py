"""Peer-to-peer methods: parties without a server, driven by events instead of rounds.

Some methods have no central server and no synchronous rounds: FKGE (Peng et al., 2021)
lets pairs of KG owners run handshakes whenever both are free. Such a method is a
:class:`PeerStrategy` whose one half, :class:`PeerHalf`, lives at every party. A peer
reacts to a delivered message by returning the messages it sends next
(``(receiver, event, Message)`` triples); :class:`EventRunner` delivers them one at a time
through the same :class:`~.channel.Channel` as the round runner (same bytes, same log), over
the same :class:`~.party.Party` objects, with the same per-party checkpoints and
``metrics.json`` fields. Peers align with each other pairwise
(:func:`~.alignment.pairwise_alignment` over their keyed hashes, :meth:`PeerHalf.digests`).

This runner is the deterministic scheduler: pending messages are delivered in the order
they were sent (FIFO), one at a time, so a run is reproducible and resumable after any
event. An asynchronous mode (one process per party on a distributed engine) replaces the
scheduler and the transport, not the peers.

The event budget is ``federated.rounds`` (the number of deliveries); a run also ends when no
message is pending.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
from torch import Tensor

from lightning_fedkg.config import ConfigError, ExperimentConfig
from lightning_fedkg.federated.alignment import federation_key, hash_names
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.checkpoint import (
    CHECKPOINT_DIR,
    capture_rng,
    commit_round,
    load_party,
    restore_rng,
)
from lightning_fedkg.federated.message import Message, decode, encode
from lightning_fedkg.federated.party import Party, build_client_parties, load_federated_kg
from lightning_fedkg.federated.strategies.base import STRATEGIES, Strategy
from lightning_fedkg.federated.tasks import TASKS, weighted_average, with_count

__all__ = ["PeerHalf", "PeerStrategy", "EventRunner", "Delivery", "run_peer_to_peer"]

log = logging.getLogger("lightning_fedkg")

#: What a peer sends: ``(receiver, event, message)``.
Outgoing = tuple[str, str, Message]
RUNNER = "runner"
CHECKPOINT_VERSION = 1


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
                      purge_step: int | None) -> list[Party]:
        """The parties of a run (default: one per client of ``cfg.data``'s federated KG)."""
        return build_client_parties(cfg, task, load_federated_kg(cfg), run_dir, purge_step)

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
        self.strategy = STRATEGIES.get(cfg.federated.strategy)
        if not issubclass(self.strategy, PeerStrategy):
            raise ConfigError(f"{cfg.federated.strategy!r} is not a peer-to-peer strategy")
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
        """Each party evaluates itself (no server): ``(weighted average, per-party entries)``."""
        per_party = [{"name": n, **self.parties[n].evaluate(split)} for n in sorted(self.parties)]
        return weighted_average(per_party, self.task.metric_keys), per_party

    # ------------------------------------------------------------------ state
    def states(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            n: {"party": self.parties[n].state_dict(), "peer": self.peers[n].state_dict()} for n in self.parties
        }
        out[RUNNER] = {
            "events": self.events,
            "started": self.started,
            "pending": [(d.sender, d.receiver, d.event, encode(d.message)) for d in self.pending],
            "channel": self.channel.state_dict(),
            "failures": self.failures,
            "rng": capture_rng(),
        }
        return out

    def load_states(self, load) -> None:
        for n in self.parties:
            state = load(n)
            self.parties[n].load_state_dict(state["party"])
            self.peers[n].load_state_dict(state["peer"])
        runner = load(RUNNER)
        self.events, self.started = int(runner["events"]), bool(runner["started"])
        self.pending = deque(Delivery(s, r, e, decode(b)) for s, r, e, b in runner["pending"])
        self.channel.load_state_dict(runner["channel"])
        self.failures = list(runner["failures"])
        restore_rng(runner["rng"])

    def close(self) -> None:
        self.channel.close()
        for p in self.parties.values():
            if p.writer is not None:
                p.writer.close()


def run_peer_to_peer(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True) -> dict:
    """Run a :class:`PeerStrategy` in ``run_dir`` until no message is pending or
    ``federated.rounds`` deliveries were handled; resumable after any delivery.

    Returns the ``metrics.json`` dict: ``test`` and ``clients`` (each party's own test, after
    the run, triple-weighted), ``events``, ``bytes_sent``, ``wire_bytes``, ``strategy``,
    ``runner: "event"``, ``failures`` and ``peers`` (each peer's :meth:`PeerHalf.report`).
    """
    from lightning_fedkg.rundir import RunDirectory

    with RunDirectory.open(run_dir, cfg):
        return _run_events(cfg, Path(run_dir), resume)


def _run_events(cfg: ExperimentConfig, run_dir: Path, resume: bool) -> dict:
    from lightning_fedkg.federated.orchestrator import fingerprint, resume_manifest
    from lightning_fedkg.runtime import configure_torch

    configure_torch(cfg.trainer)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    ckpt_dir = run_dir / CHECKPOINT_DIR
    manifest_path, manifest = resume_manifest(ckpt_dir, cfg, CHECKPOINT_VERSION, resume)
    runner = EventRunner(cfg, run_dir, purge_step=int(manifest["round"]) + 1 if manifest else None)
    if manifest is not None:
        runner.load_states(lambda party: load_party(manifest_path, manifest, party))
        log.info("resuming %s after event %d", run_dir, runner.events)
    runner.channel.open_log(run_dir / "channel_log.jsonl",
                            run_dir / "payloads" if cfg.federated.record_payloads else None)
    if not runner.started:
        runner.start()
    commit_on = runner.strategy.checkpoint_events
    while runner.pending and runner.events < cfg.federated.rounds:
        delivered = runner.step()
        if (commit_on is None or delivered.event in commit_on or not runner.pending
                or runner.events >= cfg.federated.rounds):
            commit_round(ckpt_dir, f"round_{runner.events:04d}", runner.states(),
                         {"version": CHECKPOINT_VERSION, "round": runner.events, "fingerprint": fingerprint(cfg)})
    avg, per_party = runner.evaluate("test")
    metrics = {
        "test": with_count(avg, per_party),
        "clients": per_party,
        "events": runner.events,
        "pending": len(runner.pending),
        "bytes_sent": int(runner.channel.total_bytes),
        "wire_bytes": int(runner.channel.total_wire_bytes),
        "strategy": cfg.federated.strategy,
        "runner": "event",
        "failures": runner.failures,
    }
    reports = {n: runner.peers[n].report() for n in sorted(runner.peers)}
    metrics.update(runner.strategy.summarize(reports))
    metrics["peers"] = reports
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    runner.close()
    return metrics


def is_peer_strategy(name: str) -> bool:
    """Whether ``federated.strategy`` names a :class:`PeerStrategy`."""
    return issubclass(STRATEGIES.get(name), PeerStrategy)

