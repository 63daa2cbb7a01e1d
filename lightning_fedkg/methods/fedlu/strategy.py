"""FedLU: mutual knowledge distillation between local and global entity embeddings.

Zhu et al., "Heterogeneous Federated Knowledge Graph Embedding Learning and Unlearning",
WWW 2023, §4. Each client trains a :class:`~lightning_fedkg.methods.fedlu.distillation.DistillationModule`;
only its avatar crosses, and the server holder-averages it as FedE averages entities.
``federated.fedlu.schedule``: ``gated`` (default, the official code's validation-driven
switches, :class:`DistillationGate`) or ``always`` (the paper's text). Early stopping
monitors the local validation MRR (``early_stopping=official``: the code's ``bad_iter``).
``metrics.json``: ``test`` (local), ``test_global`` (avatar), ``distillation``.
See docs/methods/fedlu.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .config import FedLUConfig
from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.stances import harmless
from lightning_fedkg.federated.strategy import ClientHalf, Strategy
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.tasks import weighted_average, with_count

__all__ = ["FedLU", "FedLUClient", "FedLUServer", "DistillationGate", "GLOBAL_PREFIX"]

#: Metric keys of the avatar's evaluation in a client's report (``global/mrr``).
GLOBAL_PREFIX = "global/"

#: An improvement of the weighted validation MRR below this counts as a plateau.
PLATEAU = 1e-3


@dataclass
class DistillationGate:
    """The official code's switches, from weighted local (``L``) and avatar (``G``) validation MRR.

    With ``ΔL = L − best_L`` and ``ΔG = G − best_G`` at an evaluation of round ``t``
    (flags only ever turn on):

    1. a plateau (``ΔL ≤ 1e-3`` or ``ΔG ≤ 1e-3``) at ``t ≥ wait_rounds`` turns on
       local→avatar distillation;
    2. both improved: both bests move;
    3. only the avatar improved: local→avatar on, ``best_G`` moves;
    4. only the local side improved: avatar→local on, ``best_L`` moves;
    5. neither improved: both on.

    Rule 1 of the official code assigns the local→avatar flag twice, probably meaning to
    set both; we keep what the code does, since the paper's numbers were produced by it
    (rule 5 turns on the other direction as soon as both sides stall).

    The bests move under both schedules (with ``always`` the flags are on from the start,
    so the rules change nothing else); ``global_improved`` says whether the last evaluation
    was a strict improvement of the avatar's MRR (``ΔG > 0``), which
    ``federated.fedlu.early_stopping=official`` reads.
    """

    schedule: str = "gated"
    wait_rounds: int = 20
    best_local: float = 0.0
    best_global: float = 0.0
    distill_local: bool = False
    distill_global: bool = False
    local_on_round: int | None = None
    global_on_round: int | None = None
    validation: list = field(default_factory=list)
    # False until the first evaluation: no improvement of the avatar seen yet.
    global_improved: bool = False

    def __post_init__(self) -> None:
        if self.schedule not in ("gated", "always"):
            raise ValueError(f"federated.fedlu.schedule must be 'gated' or 'always', got {self.schedule!r}")
        if self.schedule == "always" and not (self.distill_local and self.distill_global):
            self.distill_local = self.distill_global = True
            self.local_on_round = self.global_on_round = 0

    def _switch(self, round: int, local: bool = False, glob: bool = False) -> None:
        if local and not self.distill_local:
            self.distill_local, self.local_on_round = True, int(round)
        if glob and not self.distill_global:
            self.distill_global, self.global_on_round = True, int(round)

    def update(self, round: int, local_mrr: float, global_mrr: float) -> None:
        """Record one evaluation and apply the rules (a no-op on the flags for ``always``,
        whose flags are already on; the bests and :attr:`global_improved` move under both)."""
        self.validation.append({"round": int(round), "local": float(local_mrr), "global": float(global_mrr)})
        d_local, d_global = local_mrr - self.best_local, global_mrr - self.best_global
        self.global_improved = bool(d_global > 0)
        if (d_local <= PLATEAU or d_global <= PLATEAU) and round >= self.wait_rounds:
            self._switch(round, glob=True)
        if d_local > 0 and d_global > 0:
            self.best_local, self.best_global = float(local_mrr), float(global_mrr)
        elif d_global > 0:
            self._switch(round, glob=True)
            self.best_global = float(global_mrr)
        elif d_local > 0:
            self._switch(round, local=True)
            self.best_local = float(local_mrr)
        else:
            self._switch(round, local=True, glob=True)

    def flags(self) -> dict:
        return {"distill_local": self.distill_local, "distill_global": self.distill_global}


class FedLUServer(HolderMeanServer):
    """FedE's holder-mean over the avatar group, plus the distillation gate."""

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        self.gate = DistillationGate(schedule=self.settings.schedule, wait_rounds=self.settings.wait_rounds)
        self.test_global: dict | None = None

    def configure_train(self, round, selected):
        return {name: Message(arrays=self.rows(name), config=self.gate.flags()) for name in selected}

    def configure_evaluate(self, round, split):
        """The aggregated avatar rows, or nothing with ``avatar_eval=before_aggregation``:
        each client then evaluates the avatar it trained (it holds it until the next round's
        download), as the official code validates before aggregating."""
        if self.settings.avatar_eval == "before_aggregation":
            return {name: Message(config={"split": split}) for name in self.clients}
        return super().configure_evaluate(round, split)

    def aggregate_evaluate(self, round, split, replies, failures):
        """Local metrics as the result; the avatar's go to the gate (``val``) or to
        ``test_global`` (``test``)."""
        keys = self.task.metric_keys
        local_entries, global_entries = [], []
        for name in self.clients:
            if name not in replies:
                failed = {"name": name, "failed": failures.get(name, "no reply"), "triples": 0}
                local_entries.append(failed)
                global_entries.append(dict(failed))
                continue
            reported = replies[name].metrics
            local_entries.append({"name": name, **{k: v for k, v in reported.items()
                                                   if not k.startswith(GLOBAL_PREFIX)}})
            global_entries.append({"name": name, **{k[len(GLOBAL_PREFIX):]: v for k, v in reported.items()
                                                    if k.startswith(GLOBAL_PREFIX)},
                                   "count": reported.get("count", 0), "triples": reported.get("triples", 0)})
        local_avg = weighted_average(local_entries, keys)
        global_avg = weighted_average(global_entries, keys)
        if split == "val":
            self.gate.update(round, local_avg[self.task.monitor], global_avg[self.task.monitor])
        elif split == "test":
            self.test_global = {**with_count(global_avg, global_entries), "clients": global_entries}
        return local_avg, local_entries

    def stall_counts(self, round: int) -> bool:
        """``early_stopping=official``: a validation whose local MRR did not improve counts
        toward the patience only if the avatar's did not improve either (the official
        ``bad_iter`` is left as it is when only the avatar improved); ``local``: always."""
        if self.settings.early_stopping == "official":
            return not self.gate.global_improved
        return True

    def report(self) -> dict:
        gate = self.gate
        out = {"distillation": {
            "schedule": gate.schedule, "mu": float(self.settings.mu), "wait_rounds": gate.wait_rounds,
            "avatar_eval": self.settings.avatar_eval,
            "early_stopping": self.settings.early_stopping,
            "local_on_round": gate.local_on_round, "global_on_round": gate.global_on_round,
            "validation": list(gate.validation),
        }}
        if self.test_global is not None:
            out["test_global"] = self.test_global
        return out

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["gate"] = asdict(self.gate)
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        if "gate" in state:
            self.gate = DistillationGate(**state["gate"])


class FedLUClient(ClientHalf):
    """Receives the avatar rows and the flags, trains both sides, uploads the avatar only."""

    RECEIVES = {"train": {f"config.{flag}": harmless("FedLU's schedule: whether this round distils from the local "
                                                     "or the global side; it changes training, not what crosses")
                          for flag in ("distill_local", "distill_global")}}

    def before_fit(self, message: Message) -> None:
        module = self.party.module
        if self.settings.init_local_from_global and not bool(module.local_initialized):
            module.copy_avatar_to_local()
        module.distill_local = bool(message.config.get("distill_local", module.distill_local))
        module.distill_global = bool(message.config.get("distill_global", module.distill_global))

    def on_evaluate(self, message: Message, round: int) -> Message:
        """Evaluate the local side (the result) and the avatar (``global/<metric>``)."""
        self.receive(message.arrays)
        split = message.config["split"]
        module, keys = self.party.module, self.party.task.metric_keys
        entry = self.party.evaluate(split)
        module.eval_side = "global"
        try:
            avatar = self.party.evaluate(split)
        finally:
            module.eval_side = "local"
        scalars = {f"{split}/{k}": entry[k] for k in keys}
        scalars.update({f"{split}_global/{k}": avatar[k] for k in keys})
        self.party.log(scalars, round)
        return Message(metrics={**entry, **{GLOBAL_PREFIX + k: avatar[k] for k in keys}})


class FedLU(Strategy):
    """FedLU (Zhu et al., WWW 2023): holder-mean of avatars, mutual distillation on clients."""

    name = "fedlu"
    Server = FedLUServer
    Client = FedLUClient
    groups = ("avatar",)
    config_class = FedLUConfig

    @classmethod
    def prepare_datamodule(cls, cfg, datamodule):
        """The official validation filter under ``train.valid_filter: without_unlearn``
        (:func:`~lightning_fedkg.methods.fedlu.data.apply_valid_filter`)."""
        from lightning_fedkg.methods.fedlu.data import apply_valid_filter

        return apply_valid_filter(cfg.train.valid_filter, datamodule)

    @classmethod
    def learner(cls, cfg):
        from lightning_fedkg.methods.fedlu.distillation import DistillationModule

        if cfg.train.optimizer != "adam":
            raise ConfigError(f"train.optimizer={cfg.train.optimizer}: FedLU's learner trains its two sides with "
                              f"Adam (its code's); the row-sparse optimizer is for KGE learners (fede, fedr, "
                              f"fedprox, fedec, single, entire)")
        settings = cls.section(cfg)
        gated = settings.schedule == "gated"
        return DistillationModule, {"distill_mu": settings.mu,
                                    "distill_local": not gated, "distill_global": not gated}
