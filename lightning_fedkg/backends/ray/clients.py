"""Clients side by side: ``federated.clients=ray``, one long-lived Ray actor per client.

:class:`RayClients` is a :class:`~lightning_fedkg.federated.clients.ClientPool` whose clients each build their party
and client half once, in an actor process of their own with their own torch thread count
(:func:`~lightning_fedkg.runtime.worker_threads`). An exchange hands every addressed client
its message at once and reads the replies back in client order, so the wire log, the
failures and the aggregation are those of :class:`~lightning_fedkg.federated.clients.LocalClients`, and the results
equal its bit for bit when each client computes with the same thread count. Ray is imported
only when the pool is built (the ``ray`` extra).
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

from lightning_fedkg.config import ConfigError, ExperimentConfig
from lightning_fedkg.federated.clients import ClientPool
from lightning_fedkg.federated.message import Message, decode, encode
from lightning_fedkg.federated.strategy import SERVER
from lightning_fedkg.runtime import place_workers

__all__ = ["ClientActor", "RayClients"]

log = logging.getLogger("lightning_fedkg")


class ClientActor:
    """One client in its own process: its :class:`~lightning_fedkg.federated.party.Party` and client half.

    Wrapped by ``ray.remote`` in the driver (this module imports no Ray). Messages cross as
    :func:`~lightning_fedkg.federated.message.encode`'s bytes, the bytes the driver logged; checkpoint states go to
    and from the driver as Python objects.
    """

    def __init__(self, cfg: ExperimentConfig, name: str, threads: int, run_dir: str | None,
                 purge_step: int | None, cores: list[int] | None = None, host: str | None = None) -> None:
        from lightning_fedkg.federated.party import build_client_parties, load_federated_kg
        from lightning_fedkg.federated.protections import protected_halves
        from lightning_fedkg.federated.strategy import STRATEGIES
        from lightning_fedkg.federated.tasks import TASKS
        from lightning_fedkg.runtime import config_table_elements, configure_torch, seed_process

        # The cores the driver places this client on are its machine's: an actor that Ray
        # started on another node keeps the OS's scheduling.
        self.pinnable = host == socket.gethostname()
        self.cores: list[int] | None = None
        self.pin(cores)

        # The thread count the driver chose for every worker, not this process's own guess
        # (the load average lags while the workers start).
        trainer = copy.copy(cfg.trainer)
        trainer.threads = int(threads)
        configure_torch(trainer, config_table_elements(cfg))
        seed_process(cfg.seed)
        strategy = STRATEGIES.get(cfg.federated.strategy)
        task = TASKS.get(cfg.federated.task)()
        _, half = task.halves(*protected_halves(strategy, cfg))
        (self.party,) = build_client_parties(cfg, task, load_federated_kg(cfg), Path(run_dir) if run_dir else None,
                                             purge_step, only=name)
        self.half = half(self.party, strategy)

    def ready(self) -> tuple[int, int, list[int] | None]:
        """``(process id, intra-op threads, the cores it runs on if pinned, else None)``: built."""
        import torch

        return os.getpid(), torch.get_num_threads(), sorted(os.sched_getaffinity(0)) if self.cores else None

    def pin(self, cores: list[int] | None) -> None:
        """Run on ``cores`` from now on (None: stay where it is); only on the driver's machine."""
        from lightning_fedkg.runtime import pin_process

        if cores and self.pinnable and cores != self.cores and pin_process(cores):
            self.cores = list(cores)

    def handle(self, stage: str, data: bytes | None, round: int,
               cores: list[int] | None = None) -> tuple[bytes | None, str | None, float]:
        """``(reply bytes or None for an empty reply, error or None, seconds)`` of one stage,
        run on ``cores`` (see :meth:`pin`); ``data`` None is an empty message (nothing crossed)."""
        self.pin(cores)
        received = Message() if data is None else decode(data)
        start = time.perf_counter()
        try:
            reply = self.half.handle(stage, received, round)
        except Exception as err:  # a failing client must not take the federation down
            return None, f"{type(err).__name__}: {err}", time.perf_counter() - start
        elapsed = time.perf_counter() - start
        reply = reply if reply is not None else Message()
        return (None if reply.is_empty() else encode(reply)), None, elapsed

    def receive(self, data: bytes | None) -> None:
        self.half.receive((Message() if data is None else decode(data)).arrays)

    def state(self, weights_only: bool) -> dict:
        p = self.party
        state = {"module": p.state_dict()["module"]} if weights_only else p.state_dict()
        state["half"] = self.half.state_dict()
        return state

    def load_state(self, state: dict, weights_only: bool) -> None:
        self.party.load_state_dict(state, weights_only=weights_only)
        self.half.load_state_dict(state["half"])

    def mute(self) -> None:
        if self.party.writer is not None:
            self.party.writer.close()
            self.party.writer = None


def client_names(cfg: ExperimentConfig, fkg=None) -> list[str]:
    """The clients of ``cfg``'s federation, in client order (loads the KG unless given)."""
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.federated.strategy import client_name

    fkg = load_federated_kg(cfg) if fkg is None else fkg
    return [client_name(k) for k in range(len(fkg.clients))]


class RayClients(ClientPool):
    """The clients of ``run`` in Ray actors, trained side by side (see the module doc).

    Starts Ray unless the caller did (and stops it on :meth:`close`), and one
    :class:`ClientActor` per client. A client's time is measured in its actor, as
    :class:`~lightning_fedkg.federated.clients.LocalClients` measures it, so ``federated.client_timeout`` discards
    a late answer in the same way.
    """

    def __init__(self, run) -> None:
        import contextlib

        from lightning_fedkg.federated.party import load_federated_kg
        from lightning_fedkg.backends.ray.peer import actor_options, import_ray, ray_session
        from lightning_fedkg.runtime import config_table_elements, machine_core_ids, worker_threads

        cfg, fc = run.cfg, run.cfg.federated
        if run.strategy.in_process_only:
            raise ConfigError(f"{fc.strategy!r} is a centralised reference that runs in one process only "
                              f"(federated.clients=local)")
        phases = run.strategy.phases(cfg)
        if phases:
            raise ConfigError(f"{fc.strategy!r} runs the phase(s) {phases} after training, which need the "
                              f"clients' parties in this process: use federated.clients=local")
        ray = import_ray("federated.clients=ray")
        self.ray = ray
        fkg = run.fkg if run.fkg is not None else load_federated_kg(cfg)
        self.names = client_names(cfg, fkg)
        sa = fc.secure_aggregation
        if sa.enabled and sa.active:
            if run.run_dir is None:
                raise ConfigError("secure aggregation's active mode with federated.clients=ray needs a run "
                                  "folder for the clients' identities")
            from lightning_fedkg.privacy.identities import IDENTITIES
            from lightning_fedkg.privacy.secure import provision_identities

            provision_identities(run.run_dir / IDENTITIES, cfg, self.names)
        self.threads, self.why = worker_threads(cfg.trainer, len(self.names), config_table_elements(cfg))
        # Cores for each client from its work (training triples stand for a client's work
        # per round): a client that would bound the round alone on a core, clients of about
        # equal work left to the OS; see place_workers. Placed again for each stage's
        # addressed clients, so that a round that samples some clients (fraction < 1)
        # spreads them; self.cores (logged, in metrics.json) is the placement of all of them.
        self.core_ids = machine_core_ids()
        self.work = {n: float(len(kg.triples("train"))) for n, kg in zip(self.names, fkg.clients)}
        placed = self.placement(self.names)
        self.actors: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()
        try:
            self._stack.enter_context(ray_session(ray, num_cpus=len(self.names)))
            Actor = ray.remote(ClientActor).options(**actor_options(ray, cfg, len(self.names)))
            run_dir = str(run.run_dir) if run.run_dir is not None else None
            host = socket.gethostname()
            self.actors = {n: Actor.remote(cfg, n, self.threads, run_dir, run._purge, c, host)
                           for n, c in zip(self.names, placed)}
            ready = ray.get([self.actors[n].ready.remote() for n in self.names])
        except BaseException:
            self.close()
            raise
        self.pids = [pid for pid, _, _ in ready]
        self.cores = {n: c for n, (_, _, c) in zip(self.names, ready)}
        pinned = "; cores " + ", ".join(f"{n}: {','.join(map(str, c))}" for n, c in self.cores.items() if c) \
            if any(self.cores.values()) else "; not pinned to cores"
        log.info("clients side by side: %d Ray workers, %d thread%s each (%s%s)", len(self.names), self.threads,
                 "s" if self.threads != 1 else "", self.why, pinned)

    def exchange(self, round, stage, messages, wire, channel, timeout):
        sent = {name: None if m.is_empty() else encode(m) for name, m in messages.items()}
        cores = self.placement(list(sent))
        refs = {name: self.actors[name].handle.remote(stage, data, round, c) for (name, data), c in
                zip(sent.items(), cores)}
        answers = dict(zip(refs, self.ray.get(list(refs.values()))))
        return self.replies(round, stage, sent, answers, wire, channel, timeout)

    def replies(self, round, stage, sent, answers, wire, channel, timeout):
        """``(replies, failures)`` from each client's ``(reply bytes, error, seconds)`` in
        ``answers``, read in client order whatever order they came in: the wire log in
        LocalClients' order (each client's download, then its upload)."""
        down, up = wire
        replies, failures = {}, {}
        for name, data in sent.items():
            if data is not None:
                channel.relay(SERVER, name, down, data, round)
            reply, error, elapsed = answers[name]
            if error is not None:
                failures[name] = error
                log.warning("round %d, %s: %s failed: %s", round, stage, name, error)
                continue
            if timeout is not None and elapsed > timeout:
                failures[name] = f"timeout after {elapsed:.3f} s (federated.client_timeout={timeout})"
                log.warning("round %d, %s: %s %s", round, stage, name, failures[name])
                continue
            replies[name] = Message() if reply is None else decode(channel.relay(name, SERVER, up, reply, round))
        return replies, failures

    def placement(self, names: list[str]) -> list[list[int] | None]:
        """The cores each of ``names`` runs on while they work at once (None: not pinned)."""
        if not self.core_ids:
            return [None] * len(names)
        return place_workers([self.work[n] for n in names], self.threads, self.core_ids)

    def deliver(self, round, name, message, down, channel):
        data = None if message.is_empty() else channel.relay(SERVER, name, down, encode(message), round)
        self.ray.get(self.actors[name].receive.remote(data))

    def states(self, weights_only=False):
        return dict(zip(self.names, self.ray.get([self.actors[n].state.remote(weights_only) for n in self.names])))

    def load_states(self, load, weights_only=False):
        self.ray.get([self.actors[n].load_state.remote(load(n), weights_only) for n in self.names])

    def report(self) -> dict:
        return {"client_workers": {"clients": "ray", "workers": len(self.names), "threads": self.threads,
                                   "why": self.why, "cores": self.cores}}

    def mute(self):
        self.ray.get([a.mute.remote() for a in self.actors.values()])

    def close(self):
        if self.actors:
            try:
                self.mute()  # flush the clients' TensorBoard files before their processes go
            finally:
                for actor in self.actors.values():
                    self.ray.kill(actor)
                self.actors = {}
        self._stack.close()
