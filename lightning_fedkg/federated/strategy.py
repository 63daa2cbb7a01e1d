"""Strategies as two halves that only exchange messages.

A :class:`Strategy` pairs a :class:`ServerHalf` (selection, aggregation, server state) and
a :class:`ClientHalf` (what one client does with what it receives). The server half is
shaped like Flower's ``Strategy``. A round is a sequence of *stages* (default
``("train",)``): ``server.configure_<s>`` → ``client.on_<s>`` → ``server.aggregate_<s>``;
an aggregation that cannot complete raises :class:`RetryRound`. Round 0 is the ``align``
stage. Parties are addressed by name. See docs/DESIGN.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping

import torch
from torch import Tensor

from lightning_fedkg.federated.alignment import federation_key, hash_names
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.stances import ROWS, harmless
from lightning_fedkg.federated.tasks import weighted_average
from lightning_fedkg.registry import STRATEGIES
from lightning_fedkg.seeding import derive_seed

#: Under ``federated.aggregation=named_rows``, ``NAMED + group`` names the array of a message
#: that marks (uint8, one per row of the client's) the group's rows the client's batches named
#: (upload), or the rows the server averaged, which the client takes (download).
NAMED = "named:"
#: The stance of a download's ``NAMED`` marks.
NAMED_ROWS = harmless("which downloaded rows the client takes (named_rows): the others stay its own; secure "
                      "aggregation and DP refuse named_rows, whose uploads say which rows a client trained")

if TYPE_CHECKING:
    from lightning_fedkg.config import ExperimentConfig

__all__ = [
    "SERVER",
    "RetryRound",
    "ServerContext",
    "ServerHalf",
    "ClientHalf",
    "Strategy",
    "STRATEGIES",
    "client_name",
    "num_selected",
]

#: The party name of the central server on the transport.
SERVER = "server"


class RetryRound(RuntimeError):
    """Raised by a server half's ``aggregate_<stage>`` when the round cannot complete with
    the replies it got (secure aggregation: fewer than t clients answered a stage). The
    runner retries the round from its first stage, as when fewer than
    ``federated.min_clients`` answered, and records the reason among the failures."""


def client_name(k: int) -> str:
    """The transport name of client ``k``."""
    return f"client_{k}"


def num_selected(fraction: float, num_clients: int) -> int:
    """Clients sampled per round: ``max(round(F·C), 1)`` with halves rounded up, capped at ``C``."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"federated.fraction must be in (0, 1], got {fraction}")
    return min(num_clients, max(1, math.floor(fraction * num_clients + 0.5)))


@dataclass
class ServerContext:
    """What a server half is built with.

    ``fkg`` and ``make_party`` exist only in-process and only for centralised references
    (:class:`~.entire.Entire`); a real server half must not use them. ``evaluation_data``
    is the task's (cross-graph test queries as keyed hashes, never the clients' data).
    """

    cfg: "ExperimentConfig"
    clients: list[str]
    task: Any
    fkg: Any = None
    make_party: Callable[[str, Any], Any] | None = None
    #: What a trusted evaluator gives the server for evaluation (:meth:`~.tasks.Task.evaluation_data`).
    evaluation_data: Any = None


class ServerHalf:
    """Server side of a strategy; the defaults select clients and exchange nothing else."""

    #: The exchange stages of one training round, in order.
    stages: tuple[str, ...] = ("train",)
    #: The exchange stages of one evaluation, in order: each ``configure_<stage>(round,
    #: split)`` / ``aggregate_<stage>(round, split, replies, failures)``; the first carries
    #: what clients evaluate with, the last returns ``(weighted average, per-client entries)``.
    #: A method whose answers need several exchanges (retrieval: anchors, projections,
    #: scores, ranking on the server) adds stages here.
    eval_stages: tuple[str, ...] = ("evaluate",)

    def __init__(self, ctx: ServerContext, strategy: type["Strategy"]) -> None:
        self.cfg = ctx.cfg
        #: The method's own ``federated.<name>`` section (None without one): what a method's
        #: half reads, rather than reaching into ``cfg``.
        self.settings = strategy.section(ctx.cfg)
        self.clients = list(ctx.clients)
        self.task = ctx.task
        self.groups = strategy.groups
        self.fraction = ctx.cfg.federated.fraction
        self.generator = torch.Generator().manual_seed(derive_seed(ctx.cfg.seed, SERVER, "selection"))

    def protocol(self, stage: str) -> tuple[str, ...]:
        """The exchanges that carry out the logical stage ``stage`` outside a round's
        schedule (:meth:`~..federation.FederatedRun.stage`, e.g. a phase's ``upload``):
        ``(stage,)`` by default; secure aggregation wraps a masked upload in its key, share
        and unmask exchanges."""
        return (stage,)

    # ---------------------------------------------------------------- round 0
    def configure_align(self) -> dict[str, Message]:
        """Alignment requests (round 0); none by default."""
        return {}

    def aggregate_align(self, replies: dict[str, Message], failures: dict[str, str]) -> None:
        """Build the server state from the clients' alignment replies."""

    # ---------------------------------------------------------------- training
    def select_clients(self, round: int) -> list[str]:
        """``max(round(F·C), 1)`` clients drawn without replacement (seeded, resumable)."""
        m = num_selected(self.fraction, len(self.clients))
        perm = torch.randperm(len(self.clients), generator=self.generator)
        return [self.clients[i] for i in sorted(int(i) for i in perm[:m])]

    def configure_train(self, round: int, selected: list[str]) -> dict[str, Message]:
        """One message per selected client (default: an empty one, nothing crosses)."""
        return {name: Message() for name in selected}

    def aggregate_train(self, round: int, replies: dict[str, Message], failures: dict[str, str]) -> None:
        """Combine the replies of the clients that answered into the server state."""

    def configure_upload(self, round: int, selected: list[str]) -> dict[str, Message]:
        """The ``upload`` stage (outside the round schedule): clients send their shared
        groups as they are, without a download or training; nothing crosses downwards."""
        return {name: Message() for name in selected}

    def aggregate_upload(self, round: int, replies: dict[str, Message], failures: dict[str, str]) -> None:
        """The uploads are aggregated as a training round's are."""
        self.aggregate_train(round, replies, failures)

    # ---------------------------------------------------------------- evaluation
    def configure_evaluate(self, round: int, split: str) -> dict[str, Message]:
        """Every client evaluates ``split`` with what it holds (default: nothing sent but the split)."""
        return {name: Message(config={"split": split}) for name in self.clients}

    def report(self) -> dict:
        """Extra ``metrics.json`` blocks of the method, read after the final test (default none)."""
        return {}

    def test_scalars(self) -> dict[str, float]:
        """Scalars of the final test the server's TensorBoard logs under ``test/`` at the best
        round, beside the federation's average (default none; retrieval's cross-graph metrics)."""
        return {}

    def round_scalars(self, round: int) -> dict[str, float]:
        """Scalars the server's TensorBoard logs after round ``round`` (default none; DP's ε)."""
        return {}

    def stall_counts(self, round: int) -> bool:
        """Whether this round's validation, if its monitored metric did not improve, counts
        toward ``federated.patience`` (default: always, FedE's rule).

        Read after the round's validation has been aggregated (:meth:`aggregate_evaluate`),
        so a method may decide from what it saw there, e.g. that another quality it tracks
        still improved. An improvement of the monitor always resets the count.
        """
        return True

    def aggregate_evaluate(
        self, round: int, split: str, replies: dict[str, Message], failures: dict[str, str]
    ) -> tuple[dict, list[dict]]:
        """``(weighted average, per-client entries in client order)`` from the reported metrics.

        A client that failed gets ``{"name", "failed", "triples": 0}``: no weight.
        """
        per_client = []
        for name in self.clients:
            if name in replies:
                per_client.append({"name": name, **replies[name].metrics})
            else:
                per_client.append({"name": name, "failed": failures.get(name, "no reply"), "triples": 0})
        avg = weighted_average(per_client, self.task.metric_keys)
        return avg, per_client

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Server state needed to resume; subclasses extend the dict."""
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])


class ClientHalf:
    """Client side of a strategy: acts on its own :class:`~..party.Party` only.

    It may keep state of its own between rounds (:meth:`state_dict`), which the runner
    checkpoints with its party. ``RECEIVES`` declares the stance of every field it reads from
    a server's message (:mod:`~lightning_fedkg.federated.stances`); a subclass adds its own.
    """

    RECEIVES = {
        "align": {"config.groups": harmless("read by no client: each describes the groups its own strategy "
                                            "declares")},
        "train": {"arrays.{tensor}": ROWS, f"arrays.{NAMED}{{group}}": NAMED_ROWS},
        "evaluate": {"arrays.{tensor}": ROWS, f"arrays.{NAMED}{{group}}": NAMED_ROWS,
                     "config.split": harmless("which split the client evaluates: its metrics cross unprotected "
                                              "whichever it is (privacy.unprotected)")},
        "deliver": {"arrays.{tensor}": ROWS, f"arrays.{NAMED}{{group}}": NAMED_ROWS,
                    "config.split": harmless("not read: a delivery only writes arrays")},
    }

    def __init__(self, party: Any, strategy: type["Strategy"]) -> None:
        self.party = party
        self.cfg = party.cfg
        #: The method's own ``federated.<name>`` section (None without one), and the run
        #: settings a client half reads.
        self.settings = strategy.section(party.cfg)
        self.local_epochs = party.cfg.federated.local_epochs
        self.groups = strategy.groups
        self._key = federation_key(party.cfg.federated.federation_key, party.cfg.seed)
        self._loss_terms: list[Callable] = []
        if party.cfg.federated.aggregation == "named_rows" and not hasattr(party.module, "named_rows"):
            from lightning_fedkg.config import ConfigError

            raise ConfigError(f"federated.aggregation=named_rows needs a module that records the rows its batches "
                              f"name (the query-answering task's); {type(party.module).__name__} does not")

    def handle(self, stage: str, message: Message, round: int) -> Message | None:
        """Dispatch ``stage`` to ``on_<stage>``."""
        handler = getattr(self, f"on_{stage}", None)
        if handler is None:
            raise NotImplementedError(f"{type(self).__name__} has no handler for stage {stage!r}")
        return handler(message, round)

    # ---------------------------------------------------------------- shared groups
    def shared(self) -> dict:
        """This method's declared groups of the party's module (``{name: SharedGroup}``)."""
        groups = self.party.module.shareable_groups()
        missing = [g for g in self.groups if g not in groups]
        if missing:
            raise KeyError(f"{self.party.name}: the module declares no shareable group {missing}; "
                           f"it has {sorted(groups)}")
        return {g: groups[g] for g in self.groups}

    def receive(self, arrays: Mapping[str, Tensor]) -> None:
        """Write received tensors into the groups that own them (in place); of a group sent
        with a ``named:<group>`` mask (``federated.aggregation=named_rows``), only the rows
        it marks."""
        if not arrays:
            return
        left = dict(arrays)
        for name, group in self.shared().items():
            mine = {n: left.pop(n) for n in list(left) if n in group.tensors}
            take = left.pop(NAMED + name, None)
            if take is not None:
                rows = take.bool()
                current = group.read()
                mine = {n: torch.where(rows.view(-1, *[1] * (v.dim() - 1)), v, current[n].cpu())
                        for n, v in mine.items()}
            group.write(mine)
        if left:
            raise KeyError(f"{self.party.name} received tensors outside its shared groups: {sorted(left)}")

    def upload(self) -> dict[str, Tensor]:
        """The current values of every shared group's tensors, on the host: what leaves a
        client is masked, clipped, noised or serialized there, whatever device the module
        trains on (on a CPU these are the tensors' own views, not copies). Under
        ``federated.aggregation=named_rows`` also, per row-indexed group, a ``named:<group>``
        mask of the rows this client's batches named since its last fit began."""
        out: dict[str, Tensor] = {}
        for group in self.shared().values():
            out.update({n: t.cpu() for n, t in group.read().items()})
        if self.cfg.federated.aggregation == "named_rows":
            named = self.party.module.named_rows()
            for name, group in self.shared().items():
                if group.index is not None:
                    out[NAMED + name] = named[group.index].cpu().to(torch.uint8)
        return out

    # ---------------------------------------------------------------- stages
    def on_align(self, message: Message, round: int) -> Message:
        """Keyed hashes of the names of every row index the shared groups use, plus their specs."""
        groups = self.shared()
        indexes = sorted({g.index for g in groups.values() if g.index is not None})
        arrays = {f"{index}_digests": hash_names(self.party.names[index], self._key) for index in indexes}
        return Message(arrays=arrays, config={"groups": {n: g.spec() for n, g in groups.items()}})

    def before_fit(self, message: Message) -> None:
        """Hook after the download is applied and before local training (default: nothing).

        ``message`` is the round's download (its ``config`` may carry instructions, e.g.
        FedLU's distillation flags). Extra loss terms go in with :meth:`add_loss_term`.
        """

    def add_loss_term(self, term: Callable[[], Tensor]) -> None:
        """Add ``term()`` to every training batch's loss until the end of this local fit
        (FedProx's proximal term, FedEC's contrastive term)."""
        self.party.module.regularizers.append(term)
        self._loss_terms.append(term)

    def after_fit(self) -> None:
        """Hook after local training, before the upload is read; the default removes the
        terms added by :meth:`add_loss_term` (subclasses that override it call super)."""
        for term in self._loss_terms:
            self.party.module.regularizers.remove(term)
        self._loss_terms.clear()

    def on_train(self, message: Message, round: int) -> Message:
        """Apply the download, train E local epochs, send back the shared groups."""
        self.receive(message.arrays)
        if self.cfg.federated.aggregation == "named_rows":
            self.party.module.track_named_rows()
        self.before_fit(message)
        try:
            stats = self.party.fit(self.local_epochs)
        finally:
            self.after_fit()
        self.party.log({"train/loss": stats["loss"]}, round)
        return Message(arrays=self.upload(), metrics=stats)

    def on_upload(self, message: Message, round: int) -> Message:
        """The shared groups as they are (the ``upload`` stage; no training)."""
        return Message(arrays=self.upload())

    def on_evaluate(self, message: Message, round: int) -> Message:
        """Apply what the server sent, evaluate the requested split, report the metrics."""
        self.receive(message.arrays)
        split = message.config["split"]
        entry = self.party.evaluate(split)
        self.party.log({f"{split}/{k}": v for k, v in entry.items() if k in self.party.task.metric_keys}, round)
        return Message(metrics=entry)

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """The half's own state, saved in its party's checkpoint next to the party's
        (default: none). What a client remembers between rounds that is not the module's
        (FedEC's rows after the last local fit) lives here, not as buffers attached to the
        module from outside. Return tensors on the CPU, as copies: the checkpoint is a
        snapshot and must not follow later rounds.
        """
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (default: nothing to restore)."""

    # ---------------------------------------------------------------- what never goes back
    def spent_state(self) -> dict:
        """What this client has released and must never take back (default: nothing):
        differential privacy's ledger, the retrieval batches a querier revealed. Unlike
        :meth:`state_dict` it is never rolled back: a server may ask a client to restore an
        earlier state (a Flower ``restore``), and a ledger restored with it would let the
        client release again what it already spent. A runtime that keeps a client across
        processes stores it in a file of its own that only grows. JSON-able; mixins merge
        their part into ``super().spent_state()``."""
        return {}

    def load_spent_state(self, state: dict) -> None:
        """Take back :meth:`spent_state` saved by an earlier process of this client; what
        this object already holds is never replaced by less (default: nothing)."""


class Strategy:
    """A federated method: which server and client halves, which groups they move.

    Attributes:
        name: the ``federated.strategy`` value.
        Server, Client: the halves.
        groups: names of the module's shareable groups this method exchanges.
        in_process_only: True for centralised references that cannot be split into halves.
        clients_train: whether the clients train the model they are evaluated with (False
            for a centralised reference whose clients only evaluate what the server sends);
            ``federated.evaluate=before_aggregation`` needs it.
        config_class: dataclass of the method's own ``federated.<name>`` section, or None.
    """

    name = "base"
    Server: type[ServerHalf] = ServerHalf
    Client: type[ClientHalf] = ClientHalf
    groups: tuple[str, ...] = ()
    in_process_only: bool = False
    clients_train: bool = True
    config_class: type | None = None

    @classmethod
    def section(cls, cfg: "ExperimentConfig") -> Any:
        """The method's own settings in ``cfg``: its ``federated.<name>`` section (an instance
        of :attr:`config_class`), or None for a method without one. A config built in code
        (``ExperimentConfig()``) has no method sections; it gets the section's defaults, as
        :func:`~lightning_fedkg.config.load_config` would give it."""
        if cls.config_class is None:
            return None
        section = getattr(cfg.federated, cls.name, None)
        return cls.config_class() if section is None else section

    @classmethod
    def learner(cls, cfg: "ExperimentConfig") -> tuple[type, dict] | None:
        """``(LightningModule class, extra keyword arguments)`` the method's parties train,
        or None for the task's default module (:class:`~lightning_fedkg.models.KGEModule`)."""
        return None

    @classmethod
    def prepare_datamodule(cls, cfg: "ExperimentConfig", datamodule: Any) -> Any:
        """The party's datamodule as the method trains and validates on it (default: as the
        task built it). ``train.valid_filter`` other than ``all`` names a method's own rule
        (FedLU's ``without_unlearn``), which the method that has it applies here; any other
        method refuses it rather than ignore it."""
        if cfg.train.valid_filter != "all":
            from lightning_fedkg.config import ConfigError

            raise ConfigError(f"train.valid_filter={cfg.train.valid_filter} is a rule of the method that defines "
                              f"it; {cls.name!r} has none: use train.valid_filter=all")
        return datamodule

    @classmethod
    def phases(cls, cfg: "ExperimentConfig") -> list[str]:
        """Post-training phases this method runs under ``cfg`` (names in :data:`~..phases.PHASES`)."""
        return []

    @classmethod
    def format_report(cls, metrics: dict) -> str | None:
        """The whole table of a ``metrics.json`` whose layout is the method's own (a peer
        method's per-party results), or None (the default: the generic per-client table)."""
        return None
