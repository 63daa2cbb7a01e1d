"""The client side: one organisation's ClientApp, with only its own data folder.

A SuperNode's node config names ``data-path``, ``key-file`` and ``work-dir``; beside its key
file the client reads its organisation's ``policy.yaml`` (what it reveals: a run config that
differs from it is refused) and, with secure aggregation, ``identities/``: never the
server's word.
Requests (:mod:`.wire`): ``hello`` (answered with the client's name and data digest),
``stage``, ``deliver`` and ``restore``. Since Flower starts a process per message, the
client saves its state after every message on its own disk and answers the state's number;
a client worker (:mod:`.worker`) can hold the party instead. One process at a time handles
a client's request (a lock in its folder). See docs/deployment.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import hmac
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from lightning_fedkg.backends.flower.data import data_digest, load_client_folder, read_key_file
from lightning_fedkg.backends.flower.wire import pack, unpack

__all__ = ["ClientRuntime", "DataMismatchError", "ClientBusyError", "WorkerError", "answer_request", "forward",
           "worker_key", "handle", "make_client_app", "client_app"]

log = logging.getLogger("lightning_fedkg")

#: ClientApp runtimes of this process, by (work folder, run id, data folder): a Ray worker of a
#: simulation serves many messages and keeps its party between them.
_RUNTIMES: dict[tuple[str, str], "ClientRuntime"] = {}

#: The file in a client's folder whose lock a process holds while it handles a request.
LOCK_FILE = "client.lock"
#: Seconds a request waits for another process of the same client to finish its own (which
#: may be a round of training) before it fails with :class:`ClientBusyError`.
LOCK_TIMEOUT = 3600.0


class DataMismatchError(RuntimeError):
    """The client's data is not the data it registered with."""


class ClientBusyError(RuntimeError):
    """Another process of this client held its lock for longer than :data:`LOCK_TIMEOUT`."""


class ClientRuntime:
    """One client of one run: its config, its party and half, and its saved states."""

    def __init__(self, data_path: str | Path, key_file: str | Path, work_dir: str | Path, run_id: str) -> None:
        self.data_path, self.run_id = Path(data_path), run_id
        self.secret = read_key_file(key_file)
        # The client's policy, identity and roster sit beside its key file, on its own disk:
        # never from a command line or the server's messages.
        self.key_dir = Path(key_file).parent
        self.identities = self.key_dir / "identities"
        self.name, self.kg, self.names = load_client_folder(self.data_path)
        self.dir = Path(work_dir) / run_id / self.name
        self.state_dir = self.dir / "states"
        self.half = None
        self.counter = -1  # the state number the party in memory is at
        self.spent: dict[str, float] = {}  # seconds of this message's build / load / work / save

    # ------------------------------------------------------------------ identity
    @functools.cached_property
    def digest(self) -> str:
        """The keyed digest of the folder (read once per process, as the KG was)."""
        from lightning_fedkg.federated.alignment import federation_key

        return data_digest(self.data_path, federation_key(self.secret, 0))

    @property
    def config_path(self) -> Path:
        return self.dir / "config.yaml"

    @property
    def lock_path(self) -> Path:
        return self.dir / LOCK_FILE

    @contextlib.contextmanager
    def locked(self):
        """Hold the client's exclusive lock (``flock`` on :data:`LOCK_FILE` in its folder,
        created 0600) while the block runs, waiting for another process that holds it, at
        most :data:`LOCK_TIMEOUT` seconds. The kernel releases it when its holder exits, even
        by SIGKILL, so a lock left behind cannot exist."""
        self.dir.mkdir(parents=True, exist_ok=True)
        # flock belongs to an open file: another open of the same file, in this process or
        # another, waits like a second process
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline, pause = time.monotonic() + LOCK_TIMEOUT, 0.01
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise ClientBusyError(
                            f"{self.name}: another process of this client has held {self.lock_path} for "
                            f"{LOCK_TIMEOUT:g} s (a ClientApp or the client worker, handling another request of "
                            f"run {self.run_id}); refusing this one rather than answer from a state that process "
                            "is changing. The server may retry it") from None
                    time.sleep(pause)
                    pause = min(2 * pause, 0.5)
            yield
        finally:
            os.close(fd)  # releases the lock

    def store_config(self, text: str) -> None:
        from lightning_fedkg.atomic import write_atomic

        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.config_path, lambda f: f.write(text.encode("utf-8")))

    # ------------------------------------------------------------------ the party
    def _timed(self, what: str, start: float) -> None:
        self.spent[what] = self.spent.get(what, 0.0) + time.perf_counter() - start

    def build(self) -> None:
        """The party and half the in-process run builds for this client (same seeds)."""
        start = time.perf_counter()
        from lightning_fedkg.config import config_from_yaml_text
        from lightning_fedkg.federated.party import build_party
        from lightning_fedkg.privacy.policy import POLICY_FILE, read_policy
        from lightning_fedkg.federated.protections import protected_halves
        from lightning_fedkg.federated.strategy import STRATEGIES
        from lightning_fedkg.federated.tasks import TASKS
        from lightning_fedkg.runtime import prepare_process

        if not self.config_path.is_file():
            raise RuntimeError(f"{self.name} has no config for run {self.run_id} in {self.dir}: it missed the "
                               f"registration (restart the run's server)")
        cfg = config_from_yaml_text(self.config_path.read_text(), source=str(self.config_path))
        # What this client reveals is its organisation's policy, beside its key file: the
        # config is the server's word, so a setting on which the two differ is refused.
        read_policy(self.key_dir / POLICY_FILE).check(
            cfg, self.name, "the run's config (sent by the server at registration)")
        cfg.federated.federation_key = self.secret  # the clients' secret, from the key file only
        prepare_process(cfg)  # a client process of its own: fit's setup does not reach it
        self.cfg = cfg
        strategy = STRATEGIES.get(cfg.federated.strategy)
        task = TASKS.get(cfg.federated.task)()
        _, client_half = task.halves(*protected_halves(strategy, cfg))
        party = build_party(cfg, task, self.name, self.kg, self.names, run_dir=self.dir)
        party.identities = self.identities
        self.check_roster(cfg)
        self.half = client_half(party, strategy)
        self.counter = -1
        self._timed("build", start)

    def check_roster(self, cfg) -> None:
        """Refuse secure aggregation without a roster beside the key file: t is the roster's
        (:class:`~lightning_fedkg.privacy.secure.SecureClient` uses it), and the peers'
        identity keys are in it. Whether secure aggregation is on at all is the policy's."""
        from lightning_fedkg.config import ConfigError
        from lightning_fedkg.privacy.identities import ROSTER, has_roster

        if cfg.federated.secure_aggregation.enabled and not has_roster(self.identities):
            raise ConfigError(f"{self.name}: the run uses secure aggregation but there is no "
                              f"{self.identities / ROSTER} beside this client's key file; the threshold it checks "
                              "comes from that roster, never from the server's config (docs/deployment.md, "
                              "'What an organisation runs on its own machine')")

    def latest(self) -> int:
        """The newest saved state number, or -1."""
        numbers = [int(p.stem) for p in self.state_dir.glob("*.pt")] if self.state_dir.is_dir() else []
        return max(numbers, default=-1)

    def state_path(self, number: int) -> Path:
        pinned = self.dir / "pinned" / f"{number:08d}.pt"
        return pinned if pinned.is_file() else self.state_dir / f"{number:08d}.pt"

    def ready(self) -> None:
        """Bring the party to the newest saved state (nothing to do when memory holds it)."""
        latest = self.latest()
        if self.half is None:
            self.build()
            self.load_spent()
        if latest >= 0 and latest != self.counter:
            self.load(latest, weights_only=False)
            self.load_round_secrets()
        self.counter = latest

    @property
    def secrets_path(self) -> Path:
        """The secrets of the secure-aggregation round in progress (one file, never a
        numbered state: a ``restore`` cannot bring back a round already unmasked)."""
        return self.dir / "round_secrets.pt"

    def load_round_secrets(self) -> None:
        """Take back the round in progress that another process of this client saved."""
        from lightning_fedkg.federated.checkpoint import load_checkpoint

        if hasattr(self.half, "load_round_secrets"):
            path = self.secrets_path
            self.half.load_round_secrets(load_checkpoint(path) if path.is_file() else None)

    def save_round_secrets(self) -> None:
        """Write the round in progress for the next process, or delete the file once the
        unmasking has spent it (:meth:`~lightning_fedkg.privacy.secure.SecureClient.round_secrets`)."""
        from lightning_fedkg.federated.checkpoint import save_atomic

        secrets = self.half.round_secrets() if hasattr(self.half, "round_secrets") else None
        if secrets is None:
            self.secrets_path.unlink(missing_ok=True)
        else:
            save_atomic(secrets, self.secrets_path)

    def load(self, number: int, weights_only: bool) -> None:
        from lightning_fedkg.federated.checkpoint import load_checkpoint, restore_rng

        start = time.perf_counter()
        state = load_checkpoint(self.state_path(number))
        self.half.party.load_state_dict(state["party"], weights_only=weights_only)
        self.half.load_state_dict(state["half"])
        self.load_spent()  # an earlier state never takes back what was released since
        if not weights_only:
            restore_rng(state["rng"])
        self._timed("load", start)

    @property
    def spent_path(self) -> Path:
        """What the client released and never takes back
        (:meth:`~lightning_fedkg.federated.strategy.ClientHalf.spent_state`: DP's ledger, the
        attempts it keyed, the batches a querier revealed): one file that only grows, merged
        in after every state load, never part of a numbered state a ``restore`` can pick."""
        return self.dir / "spent.json"

    def load_spent(self) -> None:
        if self.spent_path.is_file():
            self.half.load_spent_state(json.loads(self.spent_path.read_text()))

    def save_spent(self) -> None:
        from lightning_fedkg.atomic import write_atomic

        spent = self.half.spent_state()
        if spent:
            write_atomic(self.spent_path, lambda f: f.write(json.dumps(spent).encode()), mode=0o600)

    def save(self) -> int:
        """Save the party as the next state number; drop the oldest beyond ``keep_states``."""
        from lightning_fedkg.federated.checkpoint import capture_rng, save_atomic

        start = time.perf_counter()
        number = max(self.latest(), self.counter) + 1
        self.state_dir.mkdir(parents=True, exist_ok=True)
        save_atomic({"party": self.half.party.state_dict(), "half": self.half.state_dict(), "rng": capture_rng()},
                    self.state_dir / f"{number:08d}.pt")
        self.save_spent()
        self.save_round_secrets()
        self.counter = number
        keep = self.cfg.federated.flower.keep_states
        for old in sorted(self.state_dir.glob("*.pt"))[:-keep]:
            old.unlink(missing_ok=True)
        self._timed("save", start)
        return number

    def pin(self, numbers: list[int]) -> None:
        """Keep these states for good (the server's ``best`` set points to them)."""
        pinned = self.dir / "pinned"
        pinned.mkdir(parents=True, exist_ok=True)
        for n in numbers:
            source = self.state_dir / f"{int(n):08d}.pt"
            if source.is_file() and not (pinned / source.name).is_file():
                shutil.copyfile(source, pinned / source.name)

    def record(self, head: dict, seconds: float, role: str) -> None:
        """Append where this message's time went to ``<client>/messages.jsonl`` (the
        process and its ``role``: ``clientapp`` or ``worker``, seconds since it started,
        build / load / work / save seconds and the total), so a run's overhead can be read
        apart from its training."""
        if not self.dir.is_dir():
            return
        row = {"kind": head["kind"], "stage": head.get("stage", ""), "round": head.get("round", 0), "pid": os.getpid(),
               "role": role, "process_age": round(time.time() - _process_start(), 3), "total": round(seconds, 4),
               **{k: round(v, 4) for k, v in self.spent.items()}}
        with open(self.dir / "messages.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------------ requests
    def handle(self, head: dict, payload: bytes) -> tuple[dict, bytes]:
        """Answer one request. Every request that reads or writes the client's states runs
        under :meth:`locked`: two processes serving one client folder (two ClientApps, or a
        ClientApp beside the worker) could otherwise both load the round's secrets and both
        answer an unmasking, one with each secret of a peer. ``hello`` only stores the
        config (atomically) and touches no state."""
        kind = head["kind"]
        if kind == "hello":
            self.store_config(head["config"])
            return {"name": self.name, "digest": self.digest}, b""
        if kind == "reject":
            raise DataMismatchError(head["reason"])
        if head.get("digest") != self.digest:
            raise DataMismatchError(
                f"{self.name}: the data in {self.data_path} is not the data this client registered with "
                f"(digest {self.digest[:16]}..., registered {str(head.get('digest'))[:16]}...); restart the "
                f"SuperNode with its original data folder or start a new run")
        with self.locked():
            return self._handle_locked(kind, head, payload)

    def _handle_locked(self, kind: str, head: dict, payload: bytes) -> tuple[dict, bytes]:
        from lightning_fedkg.federated.message import Message, decode, encode

        # The newest saved state, re-read now that no other process can be changing it: one
        # that handled a request since this process last did has saved a newer number, and
        # ready() loads it (with round_secrets.pt as that process left it, gone once spent).
        self.ready()
        self.pin(head.get("pin", []))
        if kind == "restore":
            self.load(int(head["state"]), weights_only=bool(head["weights_only"]))
            return {"state": self.save()}, b""
        message = decode(payload) if payload else Message()
        if kind == "deliver":
            self.half.receive(message.arrays)
            return {"state": self.save()}, b""
        if kind != "stage":
            raise ValueError(f"unknown request kind {kind!r}")
        start = time.perf_counter()
        reply = self.half.handle(head["stage"], message, int(head["round"]))
        self._timed("work", start)
        reply = reply if reply is not None else Message()
        number = self.save()
        return {"state": number}, (b"" if reply.is_empty() else encode(reply))


def _process_start() -> float:
    """When this process started (epoch seconds; Linux ``/proc``, else now)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def runtime(data_path: str, key_file: str, work_dir: str, run_id: str) -> ClientRuntime:
    """The process's runtime for this client folder and run (built on first use)."""
    key = (str(Path(work_dir).resolve()), run_id, str(Path(data_path).resolve()))
    if key not in _RUNTIMES:
        _RUNTIMES[key] = ClientRuntime(data_path, key_file, work_dir, run_id)
    return _RUNTIMES[key]


class WorkerError(RuntimeError):
    """The worker failed the request (its message says how)."""


def worker_key(secret: str) -> bytes:
    """The key of the socket's challenge: derived from the federation secret, never the secret."""
    return hmac.new(secret.encode("utf-8"), b"lightning_fedkg client worker", hashlib.sha256).digest()


def forward(socket_path: str, key_file: str, head: dict, payload: bytes) -> tuple[dict, bytes] | None:
    """The worker's ``(answer, reply)`` for one request, or ``None`` when no worker listens
    at ``socket_path`` (the caller then handles the request itself). A request the worker
    failed raises :class:`WorkerError`, or :class:`DataMismatchError` for other data (the
    worker's side is :func:`.worker.serve`)."""
    from multiprocessing.connection import Client

    try:
        connection = Client(socket_path, family="AF_UNIX", authkey=worker_key(read_key_file(key_file)))
    except (FileNotFoundError, ConnectionRefusedError) as err:
        log.warning("flower: no client worker at %s (%s); this process handles the message", socket_path, err)
        return None
    with connection:
        connection.send_bytes(json.dumps(head).encode("utf-8"))
        connection.send_bytes(payload)
        answer = json.loads(connection.recv_bytes())
        reply = connection.recv_bytes()
    if "error" in answer:
        kind = DataMismatchError if answer.get("type") == "DataMismatchError" else WorkerError
        raise kind(answer["error"])
    return answer["answer"], reply


def answer_request(head: dict, payload: bytes, paths: dict[str, str], role: str = "clientapp") -> tuple[dict, bytes]:
    """``(answer, reply)`` of one request for the client whose ``data-path``, ``key-file``
    and ``work-dir`` are ``paths``, in this process (``role``: a ClientApp's or a worker's)."""
    start = time.perf_counter()
    client = runtime(paths["data-path"], paths["key-file"], paths["work-dir"], head["run"])
    if head["kind"] == "hello":
        client.half = None  # a (re)registration: rebuild from the config it brings
    client.spent = {}
    answer, reply = client.handle(head, payload)
    client.record(head, time.perf_counter() - start, role)
    return answer, reply


def handle(message, paths: dict[str, str]):
    """Answer one Flower ``message``: through the client worker when ``paths`` names its
    ``worker-socket`` and it listens (:mod:`.worker`), else in this process."""
    from flwr.app import Message

    head, payload = unpack(message.content)
    result = None
    if paths.get("worker-socket"):
        result = forward(paths["worker-socket"], paths["key-file"], head, payload)
    if result is None:
        result = answer_request(head, payload, paths)
    return Message(content=pack(*result), reply_to=message)


def node_paths(context: Any) -> dict[str, str]:
    """The three paths of a SuperNode's ``--node-config``, checked, and its client worker's
    ``worker-socket`` when it has one (:mod:`.worker`)."""
    cfg = dict(context.node_config)
    missing = [k for k in ("data-path", "key-file", "work-dir") if not cfg.get(k)]
    if missing:
        raise ValueError(f"this SuperNode's --node-config lacks {missing}: start it with "
                         f"--node-config \"data-path='…' key-file='…' work-dir='…'\"")
    return {k: str(cfg[k]) for k in ("data-path", "key-file", "work-dir", "worker-socket") if cfg.get(k)}


def make_client_app(paths_of=node_paths):
    """A ``ClientApp`` answering every message type with :func:`handle`; ``paths_of(context)``
    gives the client's paths (default: the node config; a simulation maps partition ids)."""
    from flwr.clientapp import ClientApp

    from lightning_fedkg.backends.flower.logs import plain_logs_unless_terminal, quiet_noisy_warnings

    # Every process that runs our Flower code builds this app (a simulation, a deployment's
    # ServerApp and ClientApp processes, which import lightning_fedkg.backends.flower.apps).
    plain_logs_unless_terminal()
    app = ClientApp()

    def answer(message, context):
        # In a simulation's Ray actor (which never builds the app: it receives it), Flower's
        # actor module shows every DeprecationWarning once, ahead of PYTHONWARNINGS' filters;
        # ours, added after it, come first again.
        quiet_noisy_warnings()
        return handle(message, paths_of(context))

    app.train()(answer)
    app.evaluate()(answer)
    app.query()(answer)
    return app


def _default_app():
    try:
        return make_client_app()
    except ImportError:  # without flwr this module still imports (docs, tests of the runtime)
        return None


#: The ClientApp of a deployment (``lightning_fedkg.backends.flower.client:client_app``).
client_app = _default_app()
