"""A party's own objects: its KG, LightningModule, DataModule, persistent Trainer, logger.

A :class:`Party` is what one organisation runs. Client halves of strategies
(:mod:`.strategies.base`) act on their own party only; nothing here knows about other
parties or the server. Each party keeps one ``lightning.Trainer`` for the whole run
(Lightning keeps a reused Trainer's counters: its ``fit_loop`` resumes from
``max_epochs``): every :meth:`Party.fit` raises ``fit_loop.max_epochs`` by E
(:func:`fit_epochs`), and a phase fits its own modules with the same Trainer (FedE's
fusion layer, FedLU's unlearning). Per-round scalars go to the party's own TensorBoard
sub-run with the *round* as step, so clients overlay round by round, a resumed run
continues the same axis, and one event file serves the whole process.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from pathlib import Path
from typing import Any, Iterator

import lightning as L
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_fedkg.config import party_config
from lightning_fedkg.runtime import EXPECTED_WARNINGS
from lightning_fedkg.seeding import derive_seed
from lightning_fedkg.builders import trainer_kwargs

__all__ = [
    "Party",
    "build_party",
    "build_client_parties",
    "device_trainer",
    "fit_epochs",
    "load_federated_kg",
    "party_config",
    "quiet_lightning",
    "RoundWriter",
]

log = logging.getLogger("lightning_fedkg")


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-call chatter (device banners, single-process loader hints).

    A federated run calls ``fit``/``validate`` thousands of times; these messages would
    repeat on every call and say nothing the run does not already know.
    """
    names = ("lightning.pytorch.utilities.rank_zero", "lightning.pytorch.accelerators.cuda",
             "lightning.fabric.utilities.seed")
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            for message in EXPECTED_WARNINGS:
                warnings.filterwarnings("ignore", message=message)
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


class ResidentSingleDeviceStrategy(SingleDeviceStrategy):
    """Lightning's single-device strategy without the move back to CPU at teardown.

    Lightning moves the module and the optimizer state to CPU after every ``fit``,
    ``validate`` and ``test`` (``Strategy.teardown``). A federated client calls those
    several times per round, so on a GPU each call would copy its tables there and back;
    with this strategy they stay on the device for the whole run.
    """

    def teardown(self) -> None:
        self.precision_plugin.teardown()
        assert self.accelerator is not None
        self.accelerator.teardown()
        self.checkpoint_io.teardown()


def resident_strategy(trainer_cfg) -> ResidentSingleDeviceStrategy | None:
    """The strategy that keeps a client on its GPU, or None (CPU, several devices, or
    ``trainer.keep_on_device=false``: Lightning's default then applies)."""
    if not trainer_cfg.keep_on_device or trainer_cfg.devices != 1:
        return None
    if trainer_cfg.accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available():
        return ResidentSingleDeviceStrategy(device=torch.device("cuda", 0))
    return None


#: What every Trainer of the library's own loops leaves out: logger, checkpoints, progress
#: bar, sanity validation (a party's Trainer, :func:`device_trainer`). Runs log per round
#: through :class:`RoundWriter` and checkpoint through the round loop instead.
QUIET_TRAINER = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False,
                     enable_model_summary=False, num_sanity_val_steps=0)


def device_trainer(device: torch.device | str) -> L.Trainer:
    """A Trainer with a party's settings on ``device`` at full precision, ``max_epochs=0``:
    for a module fit outside a party (a phase's module over bare models, a unit test).
    Modules stay on the device after a fit, as a party's do on its GPU."""
    device = torch.device(device)
    placement = dict(accelerator=device.type, devices=1)
    if device.type == "cuda":  # as a party's (resident_strategy), on the given card
        placement.update(strategy=ResidentSingleDeviceStrategy(device=device))
    with quiet_lightning():
        return L.Trainer(max_epochs=0, **QUIET_TRAINER, **placement)


def fit_epochs(trainer: L.Trainer, module: L.LightningModule, epochs: int, train_dataloaders=None) -> None:
    """``trainer.fit(module, train_dataloaders)`` for ``epochs`` more epochs.

    A Trainer counts epochs across its fits, of one module or of several (a party's fits
    its learner every round, then a phase's module): the limit is raised from where the
    count stands. Lightning's per-call chatter is silenced (:func:`quiet_lightning`).
    """
    trainer.fit_loop.max_epochs = trainer.current_epoch + int(epochs)
    with quiet_lightning():
        trainer.fit(module, train_dataloaders=train_dataloaders)


class RoundWriter:
    """Per-round scalars of one party in ``<run_dir>/tb/<party>/``, step = round.

    The event file is opened on the first scalar (a run that fails before logging leaves
    none), and ``purge_step`` drops events a crashed run wrote after the round it resumes from.
    """

    def __init__(self, run_dir: str | Path, party: str, purge_step: int | None = None) -> None:
        self.logdir = str(Path(run_dir) / "tb" / party)
        self.purge_step = purge_step
        self.writer = None

    def log(self, scalars: dict[str, float], round: int) -> None:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(self.logdir, purge_step=self.purge_step)
        for key, value in scalars.items():
            self.writer.add_scalar(key, float(value), global_step=int(round))
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Party:
    """One party's module + datamodule + Trainer, built by a :class:`~.tasks.Task`.

    Attributes:
        name: the party's address on the transport (``"client_0"``, ``"central"``).
        kg: its :class:`~lightning_fedkg.data.kg.KnowledgeGraph` (local ids).
        names: ``{"entity": [...], "relation": [...]}`` item names used for alignment.
        cfg: its config (the experiment config with its per-party overrides).
        run_dir: the run's folder (``None`` for a party built without one); a method may keep
            party-private files under ``run_dir / <its own sub-folder>``.
        identities: the folder of the party's secure-aggregation identity (its own private
            key and the roster, :mod:`~lightning_fedkg.privacy.identities`): ``run_dir / "identities"`` by default;
            a Flower client points it beside its federation-key file.
    """

    def __init__(self, name: str, kg: Any, task: Any, cfg: Any, names: dict[str, list[str]],
                 writer: RoundWriter | None = None, run_dir: str | Path | None = None) -> None:
        self.name, self.kg, self.task, self.cfg, self.names = name, kg, task, cfg, names
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.identities = self.run_dir / "identities" if self.run_dir is not None else None
        # Each party's init depends only on (seed, name), not on how many were built before.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(cfg.seed, name, "model"))
            self.module = task.build_module(cfg, kg)
        self.datamodule = task.build_datamodule(cfg, kg, seed=derive_seed(cfg.seed, name, "data"), party=name)
        self.writer = writer
        batches = max(1, int(getattr(self.datamodule, "num_train_batches", 50)))
        with quiet_lightning():
            kwargs = {**trainer_kwargs(cfg.trainer), **QUIET_TRAINER}
            strategy = resident_strategy(cfg.trainer)
            if strategy is not None:
                kwargs.update(accelerator="cuda", strategy=strategy)
            self.trainer = L.Trainer(max_epochs=0, log_every_n_steps=min(50, batches), **kwargs)
        move = getattr(self.datamodule, "to_device", None)
        if move is not None:  # batches are made where the module trains
            move(self.trainer.strategy.root_device)

    @property
    def model(self):
        return self.module.model

    def fit(self, epochs: int) -> dict:
        """Train ``epochs`` more epochs on the local train split; returns ``{"loss", "examples"}``
        (``examples``: the task's :meth:`~.tasks.Task.train_size`)."""
        fit_epochs(self.trainer, self.module, epochs, self.datamodule.train_dataloader())
        loss = self.trainer.callback_metrics.get("train/loss")
        return {"loss": float(loss) if loss is not None else math.nan,
                "examples": int(self.task.train_size(self.kg))}

    def run_evaluation(self, split: str) -> dict:
        """Validate (``"val"``) or test (``"test"``) the module on the datamodule's loader of
        that split; returns what the module logged (Lightning's result dict)."""
        with quiet_lightning():
            if split == "val":
                results = self.trainer.validate(self.module, dataloaders=self.datamodule.val_dataloader(),
                                                verbose=False)
            elif split == "test":
                results = self.trainer.test(self.module, dataloaders=self.datamodule.test_dataloader(), verbose=False)
            else:
                raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        return dict(results[0]) if results else {}

    def evaluate(self, split: str) -> dict:
        """The task's per-party entry for ``split`` (metric keys, ``count``, ``triples``)."""
        return self.task.evaluate(self, split)

    def log(self, scalars: dict[str, float], round: int) -> None:
        if self.writer is not None:
            self.writer.log(scalars, round)

    def state_dict(self) -> dict:
        """Module weights, persistent optimizer state (if any) and the datamodule's sampler state."""
        # A module with optimizers that outlive a round (KGEModule with reset_optimizer=False,
        # a FedLU local side, a GAN) exposes their state (None when there is none worth saving).
        save_optimizer = getattr(self.module, "optimizer_state_dict", None)
        return {
            "module": {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()},
            "optimizer": save_optimizer() if save_optimizer is not None else None,
            "datamodule": self.datamodule.state_dict(),
        }

    def load_state_dict(self, state: dict, weights_only: bool = False) -> None:
        """Restore :meth:`state_dict` in place (the same Parameter objects keep living)."""
        self.module.load_state_dict(state["module"])
        if weights_only:
            return
        if state.get("optimizer") is not None:
            self.module.load_optimizer_state_dict(state["optimizer"])
        self.datamodule.load_state_dict(state["datamodule"])


def build_party(cfg, task, name: str, kg, names: dict[str, list[str]], run_dir=None, purge_step=None) -> Party:
    """A :class:`Party` for ``kg`` with ``name``'s per-party config and, with ``run_dir``, a writer."""
    writer = RoundWriter(run_dir, name, purge_step) if run_dir is not None else None
    return Party(name, kg, task, party_config(cfg, name), names, writer, run_dir=run_dir)


def load_federated_kg(cfg):
    """The :class:`~lightning_fedkg.data.federated.FederatedKG` that ``cfg.data`` describes."""
    from lightning_fedkg.data import load_federated, load_kg
    from lightning_fedkg.data.partition import PARTITIONERS

    d = cfg.data
    if d.format == "auto":
        fkg = load_federated(d.name, num_clients=d.num_clients, seed=d.partition_seed, partition=d.partition)
    else:
        fkg = PARTITIONERS[d.partition](load_kg(d.name, fmt=d.format), d.num_clients, seed=d.partition_seed)
    return fkg.with_all_entities() if d.client_entities == "all" else fkg


def _item_names(kg, fkg, k: int) -> dict[str, list[str]]:
    """The names a client aligns by: its vocabulary, or (unnamed test KGs) the loader's ids."""
    entities = kg.entity_names or [f"entity:{int(g)}" for g in fkg.entity_index[k]]
    relations = kg.relation_names or [f"relation:{int(g)}" for g in fkg.relation_index[k]]
    return {"entity": list(entities), "relation": list(relations)}


def build_client_parties(cfg, task, fkg, run_dir=None, purge_step=None, only: str | None = None) -> list[Party]:
    """One :class:`Party` per client KG of ``fkg``, named ``client_<k>``; with ``only``, just
    that client's (a process that runs one party, e.g. a Ray actor)."""
    from lightning_fedkg.federated.strategy import client_name

    return [
        build_party(cfg, task, client_name(k), kg, _item_names(kg, fkg, k), run_dir=run_dir, purge_step=purge_step)
        for k, kg in enumerate(fkg.clients)
        if only is None or client_name(k) == only
    ]
