"""The parties of a federated run and the steps of a round, in this process.

:class:`FederatedRun` builds one :class:`~.party.Party` per client (module, datamodule,
persistent Trainer, TensorBoard writer), a client half per party and the server half, all
joined by a :class:`~.channel.Channel`; its steps are alignment (round 0), a round's
stages (``configure_<stage>`` → the clients' ``on_<stage>`` → ``aggregate_<stage>``, with
retries when fewer than ``federated.min_clients`` answer), an evaluation, and the parties'
states. :class:`~.round_loop.RoundLoop` drives them round after round.

Evaluation follows FedE's protocol (Chen et al., IJCKG 2021, §3.1): each client ranks among
its own entities with its own filter; the federation-wide number is the mean over clients
weighted by their evaluation triples. With ``federated.evaluate=before_aggregation`` each
client evaluates the state its own fit left (:attr:`FederatedRun.evaluation_download`).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from lightning_fedkg.config import ConfigError, ExperimentConfig
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.clients import ClientPool, LocalClients
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.party import (
    Party,
    RoundWriter,
    build_client_parties,
    build_party,
    load_federated_kg,
)
from lightning_fedkg.federated.protections import IDENTITIES, enabled_protections, protected_halves, provision
from lightning_fedkg.federated.strategy import SERVER, STRATEGIES, RetryRound, ServerContext
from lightning_fedkg.federated.tasks import TASKS, Task

__all__ = ["FederatedRun", "RoundFailed", "WIRE_NAMES", "local_identities", "round_bytes"]

log = logging.getLogger("lightning_fedkg")

#: Channel names of each stage's two directions (FedE's traffic keeps its first names).
WIRE_NAMES = {
    "align": ("align_request", "align"),
    "train": ("download", "upload"),
    ("evaluate", "val"): ("eval_download", "eval_result"),
    ("evaluate", "test"): ("test_download", "test_result"),
}


class RoundFailed(RuntimeError):
    """Too few clients answered a round, even after the retries."""


@contextlib.contextmanager
def local_identities(cfg: ExperimentConfig, run_dir: Path | None, parties: list[Party]) -> Iterator[None]:
    """While the block builds the client halves of ``parties`` (all in this process), what the
    enabled protections provision before a run (secure aggregation's identities in
    ``active`` mode) is on disk where they read it.

    The run is the provisioner here: ``<run_dir>/identities/`` is written at the start and
    reused on resume (:func:`~.protections.provision`). Without a run folder (tests, an
    evaluation) the keys go to a private temporary folder that the halves read as they are
    built and that is deleted after. The server half reads none of it.
    """
    if not any(p.provisions(cfg) for p in enabled_protections(cfg)):
        yield
        return
    names = [p.name for p in parties]
    if run_dir is not None:
        provision(cfg, run_dir / IDENTITIES, names)
        yield
        return
    with tempfile.TemporaryDirectory(prefix="fedkg-identities-") as folder:
        provision(cfg, folder, names)
        for p in parties:
            p.identities = Path(folder)
        try:
            yield
        finally:
            for p in parties:
                p.identities = None


class FederatedRun:
    """All parties of one federated experiment and the steps of the round loop.

    :class:`~.round_loop.RoundLoop` drives it; tests and notebooks call the steps directly
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
        if clients is not None and fc.clients != "local":
            raise ConfigError(f"federated.clients={fc.clients} places the clients of backend=local; "
                              f"this run's clients are placed by its backend")
        if clients is None and fc.clients != "local":
            from lightning_fedkg.registry import CLIENT_POOLS

            clients = CLIENT_POOLS.get(fc.clients)
        elif clients is not None and in_process:
            raise ConfigError(f"{fc.strategy!r} is a centralised reference that runs in one process only "
                              f"(federated.backend=local)")
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
        # evaluation (restore_finished_run, RoundLoop.results); cleared by the next exchange
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
        """Restore from ``load(party) -> state`` (reads one file per party)."""
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
