"""The round runner: parties, a strategy's two halves, a transport, checkpoints, phases.

:class:`FederatedRun` builds one :class:`~.party.Party` per client (module, datamodule,
persistent Trainer, TensorBoard writer), a client half per party and the server half, all
joined by a :class:`~.channel.Channel`. :func:`run_federated` drives it::

    round 0: alignment (keyed hashes of names, see .alignment)
    for round r = 1..R:
        selected = server.select_clients(r)
        for stage in server.stages:            # ("train",) for FedE
            messages = server.configure_<stage>(r, selected)
            replies  = client.on_<stage>(message) for each, through the Channel
            server.aggregate_<stage>(r, replies, failures)
        every eval_every rounds (and at R): configure_evaluate → clients evaluate →
            aggregate_evaluate; early stopping on the task's weighted monitor
        commit the round's per-party checkpoints (manifest last)
    reload the best state; test; phases (FedE fusion); metrics.json

A client that raises, or answers after ``federated.client_timeout``, is a *failure*: the
stage goes on when ``federated.min_clients`` answered, else the round is retried.
Evaluation follows FedE's protocol (Chen et al., IJCKG 2021, §3.1, and FedE's fede.py): each
client ranks among its own entities with its own filter; the federation-wide number is
the mean over clients weighted by their evaluation triples; patience counts evaluations
(those the server half's :meth:`~.strategy.ServerHalf.stall_counts` lets count).
With ``federated.evaluate=before_aggregation`` the evaluation stage sends no arrays: each
client evaluates the state its own fit left, as the official FedLU code validates
(:attr:`FederatedRun.evaluation_download`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import lightning as L

from lightning_fedkg.config import (
    ConfigError,
    ExperimentConfig,
    show_progress_bar,
)
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.clients import ClientPool, LocalClients
from lightning_fedkg.federated.checkpoint import (
    CHECKPOINT_DIR,
    capture_rng,
    check_format,
    load_party,
    read_manifest,
    resolve_manifest,
    restore_rng,
)
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.party import (
    Party,
    RoundWriter,
    build_client_parties,
    build_party,
    load_federated_kg,
)
from lightning_fedkg.federated.phases import PhaseContext, run_phases
from lightning_fedkg.federated.runner import Commit, Engine, run_engine
from lightning_fedkg.federated.protections import protected_halves
from lightning_fedkg.federated.strategy import SERVER, STRATEGIES, RetryRound, ServerContext
from lightning_fedkg.federated.tasks import METRIC_KEYS, TASKS, Task, with_count

__all__ = [
    "METRIC_KEYS",
    "EarlyStopping",
    "FederatedRun",
    "RoundEngine",
    "RoundFailed",
    "run_federated",
    "evaluate_federated_checkpoint",
    "restore_finished_run",
    "format_table",
]

log = logging.getLogger("lightning_fedkg")

CHECKPOINT_VERSION = 3
RUNNER = "runner"

#: Channel names of each stage's two directions (FedE's traffic keeps its first names).
WIRE_NAMES = {
    "align": ("align_request", "align"),
    "train": ("download", "upload"),
    ("evaluate", "val"): ("eval_download", "eval_result"),
    ("evaluate", "test"): ("test_download", "test_result"),
}


class RoundFailed(RuntimeError):
    """Too few clients answered a round, even after the retries."""


@dataclass
class EarlyStopping:
    """Patience counted in evaluations (FedE's code), on a higher-is-better score."""

    patience: int
    best_metric: float = -math.inf
    best_round: int = 0
    bad_evaluations: int = 0

    def update(self, value: float, round: int, count_stall: bool = True) -> bool:
        """Record an evaluation; True when it is a strict improvement (a new best).

        An evaluation that is no improvement counts toward the patience only with
        ``count_stall`` (the strategy's :meth:`~.strategy.ServerHalf.stall_counts`); an
        improvement always resets the count. NaN is never an improvement (a diverged
        federation must not become the best state).
        """
        if value > self.best_metric:
            self.best_metric, self.best_round, self.bad_evaluations = float(value), int(round), 0
            return True
        if count_stall:
            self.bad_evaluations += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.bad_evaluations >= self.patience


@contextlib.contextmanager
def local_identities(cfg: ExperimentConfig, run_dir: Path | None, parties: list[Party]) -> Iterator[None]:
    """While the block builds the client halves of ``parties`` (all in this process), the
    identities of secure aggregation's ``active`` mode are on disk where they read them.

    The run is the provisioner here: ``<run_dir>/identities/`` is written at the start and
    reused on resume (:func:`~.identities.provision`). Without a run folder (tests, an
    evaluation) the keys go to a private temporary folder that the halves read as they are
    built and that is deleted after. The server half reads none of it.
    """
    from lightning_fedkg.federated.identities import IDENTITIES
    from lightning_fedkg.federated.secure import provision_identities as provision

    sa = cfg.federated.secure_aggregation
    if not (sa.enabled and sa.active):
        yield
        return
    names = [p.name for p in parties]
    if run_dir is not None:
        provision(run_dir / IDENTITIES, cfg, names)
        yield
        return
    with tempfile.TemporaryDirectory(prefix="fedkg-identities-") as folder:
        provision(folder, cfg, names)
        for p in parties:
            p.identities = Path(folder)
        try:
            yield
        finally:
            for p in parties:
                p.identities = None


class FederatedRun:
    """All parties of one federated experiment and the steps of the round loop.

    :func:`run_federated` drives it; tests and notebooks call the steps directly
    (:meth:`align`, :meth:`train_round`, :meth:`evaluate`). With ``run_dir=None`` nothing
    is written (used to evaluate a checkpoint). ``transport`` replaces the in-process
    :class:`~.channel.Channel` by any object with its interface (``send``, ``records``,
    ``open_log``, ``state_dict``, ...), e.g. one that hands messages to other processes.
    """

    def __init__(self, cfg: ExperimentConfig, run_dir: str | Path | None, purge_step: int | None = None,
                 transport: Channel | None = None, clients: Callable[["FederatedRun"], ClientPool] | None = None) -> None:
        fc = cfg.federated
        if fc.strategy == "none":
            raise ValueError("federated.strategy is 'none': use lightning_fedkg.training.run_kge")
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.strategy = STRATEGIES.get(fc.strategy)
        self.task = TASKS.get(fc.task)()
        in_process = self.strategy.in_process_only
        if clients is not None and in_process:
            raise ConfigError(f"{fc.strategy!r} is a centralised reference that runs in one process only "
                              f"(federated.engine=local)")
        # A server whose clients live elsewhere reads no client data; only a trusted evaluator's
        # data (the task's evaluation_data, e.g. FedCQA's cross-graph test queries) needs it.
        own_evaluation_data = type(self.task).evaluation_data is not Task.evaluation_data
        self.fkg = load_federated_kg(cfg) if clients is None or own_evaluation_data else None
        # The transport: the in-process Channel unless another one (same interface) is given.
        self.channel = transport if transport is not None else Channel()
        self._purge = purge_step
        if fc.evaluate == "before_aggregation" and not self.strategy.clients_train:
            raise ConfigError(f"federated.evaluate=before_aggregation evaluates the model each client trained, "
                              f"but the clients of {fc.strategy!r} train none (they evaluate what the server "
                              f"sends); use federated.evaluate=aggregated")
        server_half, self.client_half_class = self.task.halves(*protected_halves(self.strategy, cfg))
        if clients is None:
            parties = build_client_parties(cfg, self.task, self.fkg, self.run_dir, purge_step)
            with local_identities(cfg, self.run_dir, parties):
                self.pool: ClientPool = LocalClients(
                    parties, {p.name: self.client_half_class(p, self.strategy) for p in parties})
        else:
            self.pool = clients(self)
        unknown = set(fc.parties or {}) - set(self.pool.names)
        if unknown:
            raise ConfigError(f"federated.parties names {sorted(unknown)}, which are not clients of this "
                              f"federation ({', '.join(self.pool.names)})")
        ctx = ServerContext(
            cfg, list(self.pool.names), self.task,
            fkg=self.fkg if in_process else None,
            make_party=(lambda name, kg: self._make_party(name, kg, {})) if in_process else None,
            evaluation_data=self.task.evaluation_data(cfg, self.fkg) if self.fkg is not None else None,
        )
        self.server = server_half(ctx, self.strategy)
        self.writer = RoundWriter(self.run_dir, SERVER, purge_step) if self.run_dir is not None else None
        self.failures: list[dict] = []
        self.last_round = 0
        # The clients hold a federated.best=client set, each state saved after its own
        # evaluation (restore_finished_run, RoundEngine.results); cleared by the next exchange
        # of training, after which the federation's state is the server's again.
        self.own_states = False
        self.aligned = False

    @property
    def clients(self) -> list[Party]:
        """The clients' parties (in this process only: :class:`~.clients.LocalClients`)."""
        return self.pool.parties

    @property
    def client_halves(self) -> dict:
        """``{client: client half}`` (in this process only)."""
        if not isinstance(self.pool, LocalClients):
            raise RuntimeError(f"the client halves of this run live outside this process ({type(self.pool).__name__})")
        return self.pool.halves

    def _make_party(self, name: str, kg, names) -> Party:
        return build_party(self.cfg, self.task, name, kg, names, run_dir=self.run_dir, purge_step=self._purge)

    # ------------------------------------------------------------------ who is who
    @property
    def parties(self) -> dict[str, Party]:
        """Every party with weights: the clients, and a central one for in-process references."""
        out = {p.name: p for p in self.clients}
        central = getattr(self.server, "central", None)
        if central is not None:
            out[central.name] = central
        return out

    @property
    def learners(self) -> list[Party]:
        """The parties that train (the central party alone for *Entire*)."""
        central = getattr(self.server, "central", None)
        return [central] if central is not None else list(self.clients)

    @property
    def evaluation_download(self) -> bool:
        """Whether an evaluation sends the clients what they are evaluated with (the arrays
        of the first evaluation stage: FedE's aggregated rows).

        False with ``federated.evaluate=before_aggregation``: each client evaluates the state
        its own fit left, as the official FedLU/FedE controllers validate each client after
        its local training, before the server aggregates. False as well while the clients
        hold their own evaluated states (:attr:`own_states`, a ``federated.best=client`` set).
        The one place that decides it: :meth:`evaluate` and :meth:`load_evaluation_state`
        follow it.
        """
        return self.cfg.federated.evaluate == "aggregated" and not self.own_states

    # ------------------------------------------------------------------ exchanges
    def exchange(self, round: int, stage: str, messages: dict[str, Message], split: str | None = None):
        """Send each message, let its client half answer, send the replies back.

        Returns ``(replies, failures)``: ``{client: reply}`` of those that answered and
        ``{client: reason}`` of those that raised or timed out. Empty messages are handed
        over without touching the transport (nothing crosses).
        """
        wire = WIRE_NAMES.get((stage, split) if split else stage, (f"{stage}_request", stage))
        replies, failures = self.pool.exchange(round, stage, messages, wire, self.channel,
                                               self.cfg.federated.client_timeout)
        for name, reason in failures.items():
            self.failures.append({"round": int(round), "stage": stage, "party": name, "error": reason})
        return replies, failures

    def align(self) -> None:
        """Round 0: the server learns the holders of each item from keyed hashes."""
        messages = self.server.configure_align()
        if messages:
            replies, failures = self.exchange(0, "align", messages)
            self.server.aggregate_align(replies, failures)
        self.aligned = True

    def train_round(self, round: int) -> list[str]:
        """Select, run every stage of the round, retry when too few answer. Returns the selection."""
        fc = self.cfg.federated
        if not self.aligned:
            self.align()
        selected = self.server.select_clients(round)
        needed = min(fc.min_clients, len(selected))
        self.own_states = False
        for attempt in range(fc.max_retries + 1):
            ok = True
            for stage in self.server.stages:
                messages = getattr(self.server, f"configure_{stage}")(round, selected)
                replies, failures = self.exchange(round, stage, messages)
                if len(replies) < needed:
                    ok = False
                    break
                try:
                    getattr(self.server, f"aggregate_{stage}")(round, replies, failures)
                except RetryRound as err:
                    self.failures.append({"round": int(round), "stage": stage, "party": SERVER, "error": str(err)})
                    log.warning("round %d, %s: %s", round, stage, err)
                    ok = False
                    break
            if ok:
                self.last_round = round
                return selected
            log.warning("round %d: %d of %d clients answered (federated.min_clients=%d); retry %d of %d",
                        round, len(replies), len(selected), fc.min_clients, attempt + 1, fc.max_retries)
        raise RoundFailed(f"round {round}: fewer than federated.min_clients={fc.min_clients} clients answered "
                          f"after {fc.max_retries} retries; failures: {self.failures[-len(selected):]}")

    def stage(self, round: int, stage: str, selected: list[str] | None = None):
        """A training-side stage outside a round's schedule (a phase's step, e.g.
        unlearning's propagation): for each exchange of ``server.protocol(stage)`` (the
        stage alone, or secure aggregation's four), ``server.configure_<step>(round,
        selected)`` → the client halves' ``on_<step>`` → ``server.aggregate_<step>(round,
        replies, failures)``; the last result is returned. ``selected``: every client by
        default. A :class:`~.strategy.RetryRound` here fails with :class:`RoundFailed`."""
        selected = list(self.server.clients) if selected is None else list(selected)
        self.own_states = False
        result = None
        for step in self.server.protocol(stage):
            messages = getattr(self.server, f"configure_{step}")(round, selected)
            replies, failures = self.exchange(round, step, messages)
            try:
                result = getattr(self.server, f"aggregate_{step}")(round, replies, failures)
            except RetryRound as err:
                raise RoundFailed(f"round {round}, {step}: {err}") from err
        return result

    def load_evaluation_state(self, round: int, split: str = "test") -> None:
        """Put into every client's module what it is evaluated with (FedE: the aggregated
        rows; the first evaluation stage's download), through the Channel, without evaluating.
        Nothing is sent where no evaluation downloads (:attr:`evaluation_download`): the
        clients already hold what they are evaluated with."""
        if not self.evaluation_download:
            return
        first = self.server.eval_stages[0]
        down = WIRE_NAMES.get((first, split), (f"{first}_request", first))[0]
        for name, message in getattr(self.server, f"configure_{first}")(round, split).items():
            self.pool.deliver(round, name, message, down, self.channel)

    def evaluate(self, split: str, round: int, download: bool | None = None) -> tuple[dict, list[dict]]:
        """Every client evaluates ``split`` through the server's evaluation stages
        (:attr:`~.strategy.ServerHalf.eval_stages`: ``configure_<stage>(round, split)`` →
        ``on_<stage>`` → ``aggregate_<stage>(round, split, replies, failures)``, in order);
        returns the last aggregation's ``(weighted average, per-client entries)``.

        ``download=False`` withholds the arrays of the first stage (what clients evaluate
        with: FedE's aggregated rows), so that each client evaluates the state it holds; the
        message itself (the split) still crosses. ``None`` (default): as
        :attr:`evaluation_download` says.
        """
        if download is None:
            download = self.evaluation_download
        if not self.aligned:
            self.align()
        result = None
        for i, stage in enumerate(self.server.eval_stages):
            messages = getattr(self.server, f"configure_{stage}")(round, split)
            if i == 0 and not download:
                messages = {name: Message(config=m.config) for name, m in messages.items()}
            replies, failures = self.exchange(round, stage, messages, split=split)
            result = getattr(self.server, f"aggregate_{stage}")(round, split, replies, failures)
        return result

    # ------------------------------------------------------------------ state
    def party_states(self, weights_only: bool = False) -> dict[str, Any]:
        """``{party: state}`` for a checkpoint: the server half and every client.

        A client's state is its party's (:meth:`~.party.Party.state_dict`; only
        ``"module"`` with ``weights_only``) plus ``"half"``, its client half's own state
        (:meth:`~.strategy.ClientHalf.state_dict`), in both kinds of state: a half's state
        belongs to the model a client continues from (FedEC's rows after the last local
        fit), and a ``best`` state is continued from (``fedkg unlearn --from``), so it
        needs the state of the same round as the weights.
        """
        clients = self.pool.states(weights_only)
        return {SERVER: self.server.state_dict(), **clients}

    def load_party_states(self, load, weights_only: bool = False) -> None:
        """Restore from ``load(party) -> state`` (reads one file per party).

        A client state without ``"half"`` (written before client halves had state)
        leaves its half as built.
        """
        self.server.load_state_dict(load(SERVER))
        self.pool.load_states(load, weights_only)
        self.aligned = True

    def log_server(self, scalars: dict, round: int) -> None:
        if self.writer is not None:
            self.writer.log(scalars, round)

    def mute_writers(self) -> None:
        """Log nothing more to TensorBoard (a finished run tested again has logged it all)."""
        central = getattr(self.server, "central", None)
        for holder in [self, *([central] if central is not None else [])]:
            if holder.writer is not None:
                holder.writer.close()
                holder.writer = None
        self.pool.mute()

    def close(self) -> None:
        self.channel.close()
        self.mute_writers()
        self.pool.close()


def round_bytes(channel: Channel) -> int:
    """Tensor bytes of rounds >= 1 (``bytes_sent``; round 0 is alignment)."""
    return int(sum(r.bytes for r in channel.records() if r.round >= 1))


class RoundEngine(Engine):
    """The round loop of a server-client method in this process (see the module doc).

    State beyond the parties': early stopping, the validation history, each client's best
    round (``federated.best=client``), the seconds spent, the RNG, the wire log and the
    failures; all of it is committed with every round.
    """

    version = CHECKPOINT_VERSION
    unit = "round"

    def __init__(self, cfg: ExperimentConfig, run_dir: Path, purge_step: int | None = None,
                 clients: Callable[[FederatedRun], ClientPool] | None = None) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.federation = FederatedRun(cfg, run_dir, purge_step=purge_step, clients=clients)
        self.channel = self.federation.channel
        self.stopper = EarlyStopping(patience=cfg.federated.patience)
        self.history: list[dict] = []
        self.client_best: dict[str, dict] = {}  # federated.best=client: {party: {"round", "value"}}
        self.seconds = 0.0  # wall time of the round loop, summed over the processes of a resumed run
        self.last_round = 0
        self.trained = 0  # rounds trained by this process

    def resumed(self, run_dir: Path, manifest: dict) -> str:
        if self.stopper.should_stop or self.last_round >= self.cfg.federated.rounds:
            return f"{run_dir} finished after round {self.last_round}"
        return super().resumed(run_dir, manifest)

    def restore(self, load, manifest) -> None:
        runner = load(RUNNER)
        self.federation.load_party_states(load)
        self.federation.channel.load_state_dict(runner["channel"])
        self.federation.failures = list(runner["failures"])
        # The patience may be changed on resume; the counters carry over.
        self.stopper = EarlyStopping(**{**runner["early_stopping"], "patience": self.cfg.federated.patience})
        self.history = list(runner["history"])
        self.client_best = dict(runner.get("client_best", {}))
        self.seconds = float(runner.get("seconds", 0.0))
        restore_rng(runner["rng"])
        self.last_round = self.federation.last_round = int(manifest["round"])

    def run(self, commit: Commit) -> None:
        fc, run = self.cfg.federated, self.federation
        if not run.aligned:
            run.align()
            run.log_server({"comm/alignment_bytes": float(sum(r.bytes for r in run.channel.records(round=0)))}, 0)
        from tqdm import tqdm

        show = show_progress_bar(self.cfg.trainer)
        bar = tqdm(total=fc.rounds, initial=min(self.last_round, fc.rounds), desc=f"{fc.strategy} rounds",
                   unit="round", disable=not show, dynamic_ncols=True)
        try:
            for r in range(self.last_round + 1, fc.rounds + 1):
                if self.stopper.should_stop:
                    break
                started = time.perf_counter()
                self.train_and_validate(r, commit)
                self.seconds += time.perf_counter() - started
                self.last_round, self.trained = r, self.trained + 1
                commit(r, {**run.party_states(), RUNNER: self.state()}, stopped=self.stopper.should_stop)
                bar.update(1)
                if not show:  # a log file gets one line per round instead of a bar
                    log.info("%s", self.progress_line(r, time.perf_counter() - started))
        finally:
            bar.close()

    def train_and_validate(self, r: int, commit: Commit) -> None:
        """Round ``r``'s stages, then (every ``eval_every`` rounds and at the last) validation,
        early stopping and the ``best`` set; its server scalars."""
        fc, run = self.cfg.federated, self.federation
        run.train_round(r)
        scalars = {}
        if r % fc.eval_every == 0 or r == fc.rounds:
            avg, per_client = run.evaluate("val", r)
            monitor = avg[run.task.monitor]
            self.history.append({"round": r, run.task.monitor: monitor,
                                 "clients": {e["name"]: e.get(run.task.monitor) for e in per_client}})
            # Read after the evaluation: the server half has aggregated it.
            improved = self.stopper.update(monitor, r, count_stall=run.server.stall_counts(r))
            if fc.best == "client":
                self.commit_client_bests(commit, per_client, r)
            elif improved:
                commit.best(run.party_states(weights_only=True), round=r)
            scalars.update({f"val/{k}": v for k, v in avg.items()})
        scalars.update(run.server.round_scalars(r))
        scalars["comm/bytes"] = float(sum(rec.bytes for rec in run.channel.records(round=r)))
        scalars["comm/bytes_total"] = float(round_bytes(run.channel))
        run.log_server(scalars, r)

    def progress_line(self, r: int, seconds: float) -> str:
        line = f"round {r}/{self.cfg.federated.rounds} ({seconds:.1f} s)"
        if self.history and self.history[-1]["round"] == r:
            key = self.federation.task.monitor
            line += (f": val {key} {self.history[-1][key]:.4f}, best {self.stopper.best_metric:.4f} "
                     f"at round {self.stopper.best_round}")
        return line

    def commit_client_bests(self, commit: Commit, per_client: list[dict], round: int) -> None:
        """``federated.best=client``: commit the ``best`` set with each client at its own best round.

        A client whose validation monitor is a strict new best of its own (a failed client
        never is) contributes its current state; the others keep the state of their earlier
        best, read back from the previous ``best`` set.
        """
        monitor, best = self.federation.task.monitor, self.client_best
        improved = {e["name"] for e in per_client
                    if "failed" not in e and e[monitor] > best.get(e["name"], {}).get("value", -math.inf)}
        if not improved:
            return
        states = self.federation.party_states(weights_only=True)
        best_path = commit.ckpt_dir / "best.json"
        if best_path.is_file():
            previous = read_manifest(best_path)
            for name in best.keys() - improved:
                states[name] = load_party(best_path, previous, name)
        for e in per_client:
            if e["name"] in improved:
                best[e["name"]] = {"round": int(round), "value": float(e[monitor])}
        commit.best(states, round=int(round), client_rounds={n: b["round"] for n, b in best.items()})

    def state(self) -> dict:
        """The ``runner`` file of a committed round."""
        return {
            "seconds": self.seconds,
            "early_stopping": asdict(self.stopper),
            "history": self.history,
            "client_best": self.client_best,
            "rng": capture_rng(),
            "channel": self.federation.channel.state_dict(),
            "failures": self.federation.failures,
        }

    def results(self) -> dict:
        """Test the best state; the strategy's report and every phase's block."""
        fc, run, run_dir = self.cfg.federated, self.federation, self.run_dir
        best_path = run_dir / CHECKPOINT_DIR / "best.json"
        if not best_path.is_file():
            raise RuntimeError(f"{best_path} is missing: no evaluation has completed")
        if self.trained == 0:
            # A finished run run again: the test is repeated (same state, same result, same
            # wire log), but not logged a second time.
            log.info("%s finished after round %d: nothing to train; testing its best state again",
                     run_dir, self.last_round)
            run.mute_writers()
        best = read_manifest(best_path)
        run.load_party_states(lambda party: load_party(best_path, best, party), weights_only=True)
        run.last_round = self.last_round
        run.own_states = fc.best == "client"
        avg, per_client = run.evaluate("test", self.last_round)
        records = run.channel.records()
        metrics = {
            "test": with_count(avg, per_client),
            "clients": per_client,
            "rounds": int(self.last_round),
            "best_round": int(self.stopper.best_round),
            "best": fc.best,
            **({"client_best_rounds": {n: b["round"] for n, b in self.client_best.items()}}
               if fc.best == "client" else {}),
            "bytes_sent": round_bytes(run.channel),
            "alignment_bytes": int(sum(r.bytes for r in records if r.round == 0)),
            "wire_bytes": int(run.channel.total_wire_bytes),
            "strategy": fc.strategy,
            "validation": self.history,
            "failures": run.failures,
            "seconds": round(self.seconds, 3),
        }
        metrics.update(run.server.report())
        # The federation's test belongs to the state it tested: the best round's step.
        run.log_server({f"test/{k}": v for k, v in {**avg, **run.server.test_scalars()}.items()}, self.stopper.best_round)
        run.log_server({"comm/bytes_total": float(metrics["bytes_sent"])}, self.last_round)
        run.last_round = self.last_round
        metrics.update(run_phases(run.strategy.phases(self.cfg), PhaseContext(self.cfg, run, run_dir, run.writer)))
        return metrics

    def close(self) -> None:
        self.federation.close()


def run_federated(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True) -> dict:
    """Run the federated experiment ``cfg`` in ``run_dir``; resume it from its last committed round.

    With ``federated.engine=local`` a peer-to-peer strategy runs on :class:`~.peer.EventEngine`,
    any other in rounds (:class:`RoundEngine`), both through the one skeleton
    :func:`~.runner.run_engine`. Any other ``federated.engine`` is the entry registered under
    that name (:data:`~lightning_fedkg.registry.ENGINES`): ``ray`` runs a peer-to-peer
    strategy on :class:`~.peer_ray.RayEngine`, ``flower`` the same :class:`RoundEngine` with
    its clients elsewhere (a :class:`~.clients.ClientPool` of its own).

    Writes per-party checkpoints every round (``checkpoints/``), the best validation state,
    TensorBoard sub-runs ``tb/<party>`` with the round as step, ``channel_log.jsonl`` as
    transfers happen (and ``payloads/`` with ``federated.record_payloads``), and at the end
    ``metrics.json``.

    Returns the ``metrics.json`` dict: ``test`` (triple-weighted mean over clients of
    ``mrr, mr, hits@1, hits@3, hits@5, hits@10``, plus ``count``), ``clients`` (the same per
    client, plus ``count``, ``triples`` and ``name``), ``rounds`` (rounds completed),
    ``best_round``, ``best`` (and with ``federated.best=client``
    ``client_best_rounds``), ``bytes_sent`` (tensor bytes of rounds >= 1, evaluation downloads
    included), ``alignment_bytes`` (round 0), ``wire_bytes`` (serialized, all rounds),
    ``strategy``, ``validation`` (``[{round, mrr, clients: {name: mrr}}]``), ``failures`` (``[{round, stage, party,
    error}]``), ``seconds`` (wall time of the rounds, validation included, summed over
    resumes), the strategy's own blocks (FedLU's ``test_global``, ``distillation``) and one
    block per phase.
    """
    from lightning_fedkg.federated.peer import EventEngine, is_peer_strategy

    fc = cfg.federated
    if fc.engine != "local":
        # An engine of its own package (Ray: federated/peer_ray.py; Flower: lightning_fedkg.flower),
        # found by entry point; each refuses the strategies it does not run.
        from lightning_fedkg.registry import ENGINES

        return ENGINES.get(fc.engine).run(cfg, run_dir, resume)
    if is_peer_strategy(fc.strategy):
        return run_engine(cfg, run_dir, EventEngine, EventEngine.version, resume)
    return run_engine(cfg, run_dir, RoundEngine, RoundEngine.version, resume)


def restore_finished_run(cfg: ExperimentConfig, ckpt: str | Path) -> tuple[FederatedRun, int]:
    """The parties of ``cfg`` with the weights of a committed checkpoint (a manifest, or a run
    folder's best state) of this checkpoint format. Writes nothing. Returns ``(run, round)``."""
    manifest_path = resolve_manifest(ckpt)
    manifest = read_manifest(manifest_path)
    check_format(manifest_path, manifest, CHECKPOINT_VERSION)
    run = FederatedRun(cfg, run_dir=None)
    run.load_party_states(lambda party: load_party(manifest_path, manifest, party), weights_only=True)
    run.last_round = int(manifest.get("round", 0))
    # A federated.best=client set, or a set committed with own_states (an unlearned run),
    # holds each client's own evaluated state: nothing to download.
    run.own_states = "client_rounds" in manifest or bool(manifest.get("own_states", False))
    run.load_evaluation_state(run.last_round)  # a no-op then, and with federated.evaluate=before_aggregation
    return run, run.last_round


def load_run_from(run_dir: str | Path, sections=()) -> tuple[ExperimentConfig, FederatedRun]:
    """``--from RUN_DIR``: a finished run's config and its parties at the best state.

    The source folder is only read, never written (commands such as unlearn or audit write
    into their own ``--out``).
    """
    from lightning_fedkg.rundir import read_run_config

    cfg = read_run_config(run_dir, sections)
    run, _ = restore_finished_run(cfg, run_dir)
    return cfg, run


def evaluate_federated_checkpoint(cfg: ExperimentConfig, ckpt_path: str | Path) -> dict:
    """Test every client with a committed checkpoint of a run of ``cfg``.

    Returns ``{"test", "clients", "strategy", "round"}`` as in ``metrics.json``, with the
    blocks the server half reports after a test (:meth:`~.strategy.ServerHalf.report`: the
    query task's ``in_graph`` and ``cross_graph``, DP's ``privacy``); nothing is written.
    A peer-to-peer run's: :func:`~.peer.evaluate_peer_checkpoint`.
    """
    from lightning_fedkg.federated.peer import evaluate_peer_checkpoint, is_peer_strategy

    if is_peer_strategy(cfg.federated.strategy):
        return evaluate_peer_checkpoint(cfg, ckpt_path)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    run, round_ = restore_finished_run(cfg, ckpt_path)
    avg, per_client = run.evaluate("test", round_)
    return {"test": with_count(avg, per_client), "clients": per_client, "strategy": cfg.federated.strategy,
            "round": round_, **run.server.report()}


def format_table(metrics: dict, sections=(), columns=()) -> str:
    """A FedE-Table-3-style table: one row per client and the weighted average.

    ``columns``: ``(label, metric key)`` pairs (a task's :attr:`~.tasks.Task.table_columns`;
    link prediction: MRR, H@1, H@5, H@10, with MR and H@3 left in ``metrics.json``); by
    default the link-prediction columns the test block has, else every metric it has.
    ``sections`` adds ``(title, [(label, #test, metrics)])`` blocks below (a phase's rows,
    :meth:`~.phases.Phase.table_rows`). The header names only the run facts present in
    ``metrics``.
    """
    test = metrics["test"]
    cols = tuple(columns) or (
        tuple((label, key) for label, key in TASKS.get("link_prediction").table_columns if key in test)
        or tuple((key, key) for key in test if key != "count"))
    width = max([10, *(len(label) + 2 for _, rows in sections for label, _, _ in rows)])
    header = f"{'client':<{width}}{'#test':>8}" + "".join(f"{c:>9}" for c, _ in cols)
    lines = []
    facts = [f"{k}={metrics[k]}" for k in ("strategy", "rounds", "best_round", "bytes_sent", "round")
             if metrics.get(k) is not None]
    if facts:
        lines.append("  ".join(facts))
    lines += [header, "-" * len(header)]

    def row(label: str, n: Any, m: dict) -> str:
        return f"{label:<{width}}{n!s:>8}" + "".join(f"{float(m[k]):>9.4f}" for _, k in cols)

    clients = metrics.get("clients", [])
    for k, m in enumerate(clients):
        if "failed" in m:
            lines.append(f"{str(k):<{width}}  failed: {m['failed']}")
        else:
            lines.append(row(str(k), m.get("triples", m.get("count", "")), m))
    total = sum(int(m.get("triples", 0)) for m in clients)
    lines.append("-" * len(header))
    lines.append(row("weighted", total or "", metrics["test"]))
    for title, rows in sections:
        lines.append(title)
        lines += [row(label, n, m) for label, n, m in rows]
    return "\n".join(lines)
