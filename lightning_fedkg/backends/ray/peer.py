"""The asynchronous backend for peer-to-peer methods: one Ray actor process per party.

``federated.backend=ray`` (the ``ray`` extra) runs the same :class:`~lightning_fedkg.federated.peer.PeerStrategy` as
:class:`~lightning_fedkg.federated.peer.EventRunner` with every party in its own :class:`PartyActor`. The driver is
the only router: it logs each message on one :class:`~lightning_fedkg.federated.channel.Channel` and delivers FIFO
per receiver. The run ends at quiescence or after ``federated.rounds`` deliveries and is
committed as the local backend commits, so either backend resumes the other's checkpoints;
nothing is committed mid-run and a Ray run is not bit-reproducible. Actors, threads, GPUs
and multi-machine notes: docs/deployment.md.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
import time
import warnings
from collections import deque
from pathlib import Path
from typing import Any, Iterator

from lightning_fedkg.config import ConfigError, ExperimentConfig
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.message import Message, decode, encode
from lightning_fedkg.federated.peer import CHECKPOINT_VERSION
from lightning_fedkg.federated.runner import Loop, run_loop

__all__ = ["RayEventLoop", "RayBackend", "run_peer_to_peer_ray", "PartyActor", "RayNotInstalledError", "import_ray"]

log = logging.getLogger("lightning_fedkg")

#: What an actor sends: ``(receiver, event, encode(message))``.
Wire = tuple[str, str, bytes]


class RayNotInstalledError(ConfigError, ImportError):
    """``federated.backend=ray`` without Ray installed (a config error for the CLI, an ImportError for code)."""


def import_ray(key: str = "federated.backend=ray"):
    """The ``ray`` module, or :class:`RayNotInstalledError` saying that ``key`` (the setting
    that asked for Ray) needs it and how to install it."""
    try:
        import ray
    except ImportError as err:
        raise RayNotInstalledError(
            f'{key} needs Ray, which is not installed ({err}): pip install "lightning-fedkg[ray]"'
        ) from None
    return ray


# ---------------------------------------------------------------------- the actor
class PartyActor:
    """One party in its own process: its :class:`~lightning_fedkg.federated.party.Party` and :class:`~lightning_fedkg.federated.peer.PeerHalf`.

    Wrapped by ``ray.remote`` in the driver (this module imports no Ray). Everything that
    crosses between parties is :func:`~lightning_fedkg.federated.message.encode`'s bytes; checkpoint states (the
    party's own) go to and from the driver as Python objects.
    """

    def __init__(self, cfg: ExperimentConfig, name: str, names: list[str], run_dir: str | None,
                 purge_step: int | None) -> None:
        from lightning_fedkg.federated.peer import build_named_party, peer_strategy
        from lightning_fedkg.federated.tasks import TASKS
        from lightning_fedkg.runtime import prepare_process

        prepare_process(cfg)  # a process of its own: fit's setup does not reach it
        strategy = peer_strategy(cfg)
        self.party = build_named_party(strategy, cfg, TASKS.get(cfg.federated.task)(),
                                       Path(run_dir) if run_dir else None, purge_step, name)
        self.peer = strategy.Peer(self.party, strategy, list(names))

    def pid(self) -> int:
        return os.getpid()

    def load_state(self, state: dict) -> None:
        from lightning_fedkg.federated.peer import load_party_state

        load_party_state(self.party, self.peer, state)

    def state(self) -> dict:
        from lightning_fedkg.federated.peer import party_state

        return party_state(self.party, self.peer)

    def start(self) -> list[Wire]:
        return self._wire(self.peer.start())

    def deliver(self, sender: str, event: str, data: bytes) -> tuple[list[Wire], str | None]:
        """Handle one message: ``(what the peer sends, None)``, or ``([], "Error: reason")``
        when its handler raised (the driver records the failure; the party goes on)."""
        message = decode(data)
        try:
            outgoing = self.peer.handle(event, message, sender)
        except Exception as err:  # a failing handler must not take the party down
            return [], f"{type(err).__name__}: {err}"
        return self._wire(outgoing), None

    def evaluate(self, split: str) -> dict:
        return {"name": self.party.name, **self.party.evaluate(split)}

    def report(self) -> dict:
        return self.peer.report()

    def close(self) -> None:
        self.peer.close()
        if self.party.writer is not None:
            self.party.writer.close()

    def _wire(self, outgoing) -> list[Wire]:
        out = []
        for receiver, event, message in outgoing:
            if not isinstance(message, Message):
                raise TypeError(f"{self.party.name} sent {event!r} to {receiver!r} as "
                                f"{type(message).__name__}; peers send Message objects")
            out.append((receiver, event, encode(message)))
        return out


# ---------------------------------------------------------------------- the driver
class Router:
    """The driver's side: routes actors' messages through one Channel, FIFO per receiver.

    Attributes:
        pending: ``(sender, receiver, event, bytes)`` sent (logged) and not yet submitted.
        events: deliveries handled so far; ``failures`` as in :class:`~lightning_fedkg.federated.peer.EventRunner`.
    """

    def __init__(self, ray, actors: dict[str, Any], channel: Channel, budget: int) -> None:
        self.ray, self.actors, self.channel, self.budget = ray, actors, channel, int(budget)
        self.pending: deque[tuple[str, str, str, bytes]] = deque()
        self.events = 0
        self.started = False
        self.failures: list[dict] = []
        self._flight: dict[Any, tuple[str, str | None, str]] = {}  # ref -> (party, sender, event); start: no sender
        self._deliveries = 0  # deliveries submitted and not yet handled

    def load(self, runner: dict) -> None:
        self.events, self.started = int(runner["events"]), bool(runner["started"])
        self.pending = deque((s, r, e, bytes(b)) for s, r, e, b in runner["pending"])
        self.channel.load_state_dict(runner["channel"])
        self.failures = list(runner["failures"])

    def route(self, sender: str, outgoing: list[Wire]) -> None:
        """Log what ``sender`` sent (at the current event count) and queue it."""
        for receiver, event, data in outgoing:
            if receiver not in self.actors:
                raise KeyError(f"{sender} sent {event!r} to unknown party {receiver!r}")
            self.pending.append((sender, receiver, event, self.channel.relay(sender, receiver, event, data,
                                                                             self.events)))

    def submit(self) -> None:
        """Hand pending messages to their receivers, in send order, within the event budget."""
        while self.pending and self.events + self._deliveries < self.budget:
            sender, receiver, event, data = self.pending.popleft()
            self._flight[self.actors[receiver].deliver.remote(sender, event, data)] = (receiver, sender, event)
            self._deliveries += 1

    def run(self) -> None:
        """Start every peer (unless resumed after the start), then route until nothing is in
        flight: quiescence, or the budget's last delivery handled."""
        if not self.started:
            for name in sorted(self.actors):
                self._flight[self.actors[name].start.remote()] = (name, None, "start")
        self.submit()
        while self._flight:
            (ref,), _ = self.ray.wait(list(self._flight), num_returns=1)
            party, sender, event = self._flight.pop(ref)
            if sender is None:  # a peer's start(): Ray runs it before anything delivered to that peer
                self.route(party, self.ray.get(ref))
                self.started = all(s is not None for _, s, _ in self._flight.values())
            else:
                self._deliveries -= 1
                self.events += 1
                outgoing, error = self.ray.get(ref)
                if error is not None:
                    self.failures.append({"round": self.events, "stage": event, "party": party, "error": error})
                    log.warning("event %d: %s failed on %r from %s: %s", self.events, party, event, sender, error)
                else:
                    self.route(party, outgoing)
            self.submit()


def worker_pythonpath() -> str:
    """``PYTHONPATH`` for the actors: this project's root, then the driver's ``sys.path``
    entries outside the interpreter's own folders (a test folder, a user's plugin package),
    then any ``PYTHONPATH`` already set."""
    prefixes = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths = [str(Path(__file__).resolve().parents[2])]  # the folder that holds lightning_fedkg/
    for entry in sys.path:
        path = Path(entry or os.curdir).resolve()
        if path.is_dir() and not any(path.is_relative_to(p) for p in prefixes):
            paths.append(str(path))
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(dict.fromkeys(paths))


@contextlib.contextmanager
def ray_session(ray, num_cpus: int) -> Iterator[None]:
    """Ray as the caller left it: started here (and shut down after) only if not running."""
    if ray.is_initialized():
        yield
        return
    with warnings.catch_warnings():  # Ray's notice of a future change to GPU visibility defaults
        warnings.filterwarnings("ignore", message=".*RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO.*")
        # Ray starts its workers at niceness 15 to keep its own services responsive; ours
        # do the run's computing while the driver waits, and at 15 they lose the cores to
        # any other busy process (measured: side-by-side clients no faster than sequential
        # on a shared machine). 0 is the driver's own niceness.
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 _system_config={"worker_niceness": 0})
    try:
        yield
    finally:
        ray.shutdown()


def actor_options(ray, cfg: ExperimentConfig, parties: int) -> dict:
    """Ray options of every party's actor: the driver's import path; a share of the GPUs
    when the config asks for a GPU (or ``auto``) and the cluster has some."""
    options: dict[str, Any] = {"runtime_env": {"env_vars": {"PYTHONPATH": worker_pythonpath()}}}
    gpus = float(ray.cluster_resources().get("GPU", 0))
    if cfg.trainer.accelerator in ("auto", "gpu", "cuda") and gpus > 0:
        options["num_gpus"] = min(1.0, math.floor(gpus / parties * 1e4) / 1e4)
    return options


class RayEventLoop(Loop):
    """The event loop on Ray (see the module doc): one actor per party, the driver routes.

    Built by :meth:`open` (it starts Ray unless the caller did, and the actors); closing it
    kills the actors and stops a Ray it started. It commits once, at the end of the run,
    and only if the run handled anything.
    """

    version = CHECKPOINT_VERSION
    unit = "event"

    def __init__(self, ray, cfg: ExperimentConfig, run_dir: Path, purge_step: int | None = None) -> None:
        from lightning_fedkg.federated.peer import peer_strategy

        self.ray, self.cfg = ray, cfg
        self.strategy = peer_strategy(cfg)
        self.names = list(self.strategy.party_names(cfg))
        self.channel = Channel()
        self.actors: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()
        self.wall = 0.0
        try:
            self._stack.enter_context(ray_session(ray, num_cpus=len(self.names)))
            Actor = ray.remote(PartyActor).options(**actor_options(ray, cfg, len(self.names)))
            self.actors = {n: Actor.remote(cfg, n, self.names, str(run_dir), purge_step) for n in self.names}
            ray.get([a.pid.remote() for a in self.actors.values()])  # built: time the run, not the start-up
        except BaseException:
            self.close()
            raise
        self.router = Router(ray, self.actors, self.channel, cfg.federated.rounds)

    @classmethod
    def open(cls, cfg: ExperimentConfig, run_dir: Path, purge_step: int | None = None) -> "RayEventLoop":
        """The loop, or :class:`RayNotInstalledError` without Ray."""
        return cls(import_ray(), cfg, Path(run_dir), purge_step)

    def restore(self, load, manifest) -> None:
        from lightning_fedkg.federated.peer import RUNNER

        self.ray.get([self.actors[n].load_state.remote(load(n)) for n in self.names])
        self.router.load(load(RUNNER))

    def run(self, commit) -> None:
        from lightning_fedkg.federated.peer import RUNNER, runner_state

        router, ray = self.router, self.ray
        before = (router.events, router.started)
        began = time.perf_counter()
        router.run()
        self.wall = time.perf_counter() - began
        if (router.events, router.started) != before:  # as locally: commit only what this run did
            states = dict(zip(self.names, ray.get([self.actors[n].state.remote() for n in self.names])))
            states[RUNNER] = runner_state(router.events, router.started, list(router.pending), self.channel,
                                          router.failures)
            commit(router.events, states)

    def results(self) -> dict:
        from lightning_fedkg.federated.peer import peer_metrics
        from lightning_fedkg.federated.tasks import TASKS

        ordered = sorted(self.names)
        per_party = self.ray.get([self.actors[n].evaluate.remote("test") for n in ordered])
        reports = dict(zip(ordered, self.ray.get([self.actors[n].report.remote() for n in ordered])))
        self.ray.get([a.close.remote() for a in self.actors.values()])
        router = self.router
        metrics = peer_metrics(self.cfg, self.strategy, TASKS.get(self.cfg.federated.task)(), per_party,
                               events=router.events, pending=len(router.pending), channel=self.channel,
                               failures=router.failures, reports=reports, engine="ray")
        metrics["wall_seconds"] = round(self.wall, 3)
        return metrics

    def close(self) -> None:
        self.channel.close()
        for actor in self.actors.values():
            self.ray.kill(actor)
        self._stack.close()


def run_peer_to_peer_ray(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True) -> dict:
    """:func:`~lightning_fedkg.federated.peer.run_peer_to_peer` with one Ray actor per party (see the module doc).

    Returns the ``metrics.json`` dict: the local backend's keys with ``engine: "ray"``, plus
    ``wall_seconds``. Raises :class:`RayNotInstalledError` without Ray.
    """
    import_ray()  # before anything is written
    return run_loop(cfg, run_dir, RayEventLoop.open, RayEventLoop.version, resume)


class RayBackend:
    """The ``ray`` entry of :data:`~lightning_fedkg.registry.BACKENDS` (``federated.backend=ray``):
    a peer-to-peer strategy on :class:`RayEventLoop`, through the one run skeleton."""

    @staticmethod
    def run(cfg: ExperimentConfig, run_dir, resume: bool = True) -> dict:
        from lightning_fedkg.federated.peer import is_peer_strategy

        if not is_peer_strategy(cfg.federated.strategy):
            raise ConfigError(f"federated.backend=ray runs peer-to-peer strategies only; "
                              f"{cfg.federated.strategy!r} runs in rounds (federated.backend=local or flower)")
        return run_loop(cfg, run_dir, RayEventLoop.open, RayEventLoop.version, resume)
