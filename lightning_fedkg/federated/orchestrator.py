"""The federated round loop: persistent clients, a Strategy, a Channel, checkpoints.

Every client is a plain :class:`~lightning_fedkg.models.kge_module.KGEModule` with its own
:class:`~lightning_fedkg.data.datamodule.KGDataModule` and its own persistent
``lightning.Trainer`` (counters persist on a reused Trainer, so Trainers are never shared;
each ``fit`` raises ``fit_loop.max_epochs`` by E, LIBRARIES §2b). The loop itself knows
nothing about any method::

    for round r = 1..R:
        S = strategy.select_clients(r)
        strategy.distribute(r, S, learners)        # downloads, through the Channel
        learners[k].fit(E) for k in S
        strategy.collect(r, S, learners)           # uploads + server aggregation
        every eval_every rounds (and at R): validate every client, early stopping on the
            triple-weighted mean validation MRR, best state → checkpoints/best.pt
        checkpoints/last.pt (atomic)
    reload best state; test every client; metrics.json, channel_log.jsonl

Evaluation follows FedE's protocol (Chen et al., IJCKG 2021, §3.1; REFERENCE §2.5): each
client ranks among its own entities with its own filter; the dataset number is the mean
over clients weighted by their number of evaluation triples; patience counts evaluations.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import warnings
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import lightning as L
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_fedkg.config import ConfigError, ExperimentConfig
from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.federated.checkpoint import (
    BEST,
    CHECKPOINT_DIR,
    LAST,
    capture_rng,
    load_checkpoint,
    restore_rng,
    save_atomic,
)
from lightning_fedkg.federated.strategies import build_strategy
from lightning_fedkg.federated.strategies.base import Strategy, client_name
from lightning_fedkg.training import METRIC_KEYS, build_datamodule, build_module

__all__ = [
    "METRIC_KEYS",
    "Client",
    "EarlyStopping",
    "FederatedRun",
    "run_federated",
    "evaluate_federated_checkpoint",
    "format_table",
    "load_federated_kg",
    "weighted_average",
]

log = logging.getLogger("lightning_fedkg")

CHECKPOINT_VERSION = 1


def derive_seed(base: int, name: str, purpose: str) -> int:
    """A per-party, per-purpose seed that does not depend on construction order."""
    return (int(base) * 1_000_003 + zlib.crc32(f"{purpose}:{name}".encode())) % (2**31 - 1)


@contextlib.contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-fit chatter (device banners, single-process loader hints).

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
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            warnings.filterwarnings("ignore", message=".*no `val_dataloader`.*")
            warnings.filterwarnings("ignore", message=".*smaller than the logging interval.*")
            warnings.filterwarnings("ignore", message=".*LeafSpec.*")
            warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# ---------------------------------------------------------------------------- clients
@dataclass(eq=False)
class Client:
    """One party that trains and/or evaluates: module + datamodule + its own Trainer.

    ``index`` is its position in the federation and ``name`` its Channel party name.
    """

    index: int
    name: str
    kg: Any
    module: Any
    datamodule: Any
    trainer: L.Trainer

    def fit(self, epochs: int) -> None:
        """Train ``epochs`` more epochs on the local train split (no validation inside)."""
        self.trainer.fit_loop.max_epochs = self.trainer.current_epoch + int(epochs)
        with _quiet_lightning():
            self.trainer.fit(self.module, train_dataloaders=self.datamodule.train_dataloader())

    def evaluate(self, split: str) -> dict:
        """Filtered link prediction on ``"val"`` or ``"test"``; the module's metric dict."""
        with _quiet_lightning():
            if split == "val":
                self.trainer.validate(self.module, dataloaders=self.datamodule.val_dataloader(), verbose=False)
            elif split == "test":
                self.trainer.test(self.module, dataloaders=self.datamodule.test_dataloader(), verbose=False)
            else:
                raise ValueError(f"split must be 'val' or 'test', got {split!r}")
        return dict(self.module.last_metrics[split])

    def state_dict(self) -> dict:
        """Module weights, persistent optimizer state (if any) and the datamodule's sampler state."""
        persistent = not self.module.hparams.reset_optimizer
        return {
            "module": {k: v.detach().cpu().clone() for k, v in self.module.state_dict().items()},
            "optimizer": self.module.optimizer_state_dict() if persistent else None,
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


# ---------------------------------------------------------------------------- early stopping
@dataclass
class EarlyStopping:
    """Patience counted in evaluations (FedE's code), on a higher-is-better score."""

    patience: int
    best_metric: float = -math.inf
    best_round: int = 0
    bad_evaluations: int = 0

    def update(self, value: float, round: int) -> bool:
        """Record an evaluation; True when it is a strict improvement (a new best)."""
        if value > self.best_metric:
            self.best_metric, self.best_round, self.bad_evaluations = float(value), int(round), 0
            return True
        self.bad_evaluations += 1
        return False

    @property
    def should_stop(self) -> bool:
        return self.bad_evaluations >= self.patience


# ---------------------------------------------------------------------------- helpers
def load_federated_kg(cfg: ExperimentConfig):
    """The :class:`~lightning_fedkg.data.federated.FederatedKG` that ``cfg.data`` describes."""
    from lightning_fedkg.data import load_federated, load_kg, partition_by_relation

    d = cfg.data
    if d.format == "auto":
        return load_federated(d.name, num_clients=d.num_clients, seed=d.partition_seed)
    return partition_by_relation(load_kg(d.name, fmt=d.format), d.num_clients, seed=d.partition_seed)


def weighted_average(per_client: list[dict], weights: list[int], keys=METRIC_KEYS) -> dict:
    """``Σ_k w_k m_k / Σ_k w_k`` per metric; clients with weight 0 are skipped."""
    total = sum(w for w in weights if w > 0)
    if total == 0:
        return {k: math.nan for k in keys}
    return {k: sum(w * float(m[k]) for m, w in zip(per_client, weights) if w > 0) / total for k in keys}


def format_table(metrics: dict) -> str:
    """A FedE-Table-3-style table: one row per client and the triple-weighted average.

    Columns: client, #test (test triples), MRR, H@1, H@5, H@10 (MR and H@3 stay in
    ``metrics.json``). With a ``fusion`` block (FedE model fusion, tail-only test) three
    more triple-weighted rows follow: ``single (fusion input)``, ``fede (fusion input)``
    and ``fusion``.
    """
    cols = (("MRR", "mrr"), ("H@1", "hits@1"), ("H@5", "hits@5"), ("H@10", "hits@10"))
    fusion = metrics.get("fusion")
    width = 23 if fusion else 10
    header = f"{'client':<{width}}{'#test':>8}" + "".join(f"{c:>9}" for c, _ in cols)
    lines = []
    if "strategy" in metrics:
        lines.append(
            f"strategy={metrics['strategy']}  rounds={metrics.get('rounds')}  "
            f"best_round={metrics.get('best_round')}  bytes_sent={metrics.get('bytes_sent')}"
        )
    lines += [header, "-" * len(header)]

    def row(label: str, n: Any, m: dict) -> str:
        return f"{label:<{width}}{n!s:>8}" + "".join(f"{float(m[k]):>9.4f}" for _, k in cols)

    clients = metrics.get("clients", [])
    for k, m in enumerate(clients):
        lines.append(row(str(k), m.get("triples", m.get("count", "")), m))
    total = sum(int(m.get("triples", 0)) for m in clients)
    lines.append("-" * len(header))
    lines.append(row("weighted", total or "", metrics["test"]))
    if fusion:
        lines.append("model fusion (FedE §2.2.3; tail-only test, fit on valid):")
        for label, block in (("single (fusion input)", fusion["single"]),
                             ("fede (fusion input)", fusion["federated"]), ("fusion", fusion)):
            lines.append(row(label, sum(int(m["triples"]) for m in block["clients"]), block["test"]))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the run
class FederatedRun:
    """All parties of one federated experiment and the operations of the round loop.

    :func:`run_federated` drives it; tests and notebooks can call the steps directly
    (``train_round``, ``validate``, ``test``). With ``run_dir=None`` nothing is logged
    to disk (used to evaluate a checkpoint).
    """

    def __init__(self, cfg: ExperimentConfig, run_dir: str | Path | None) -> None:
        fc = cfg.federated
        if fc.strategy == "none":
            raise ValueError("federated.strategy is 'none': use lightning_fedkg.training.run_kge")
        if fc.rounds < 1 or fc.local_epochs < 1 or fc.eval_every < 1 or fc.patience < 1:
            raise ValueError("federated.rounds, local_epochs, eval_every and patience must be >= 1")
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.fkg = load_federated_kg(cfg)
        self.channel = Channel()
        self.strategy: Strategy = build_strategy(fc.strategy)
        self.clients = [self._make_client(k, client_name(k), kg) for k, kg in enumerate(self.fkg.clients)]
        self.strategy.setup(
            self.fkg, self.clients, cfg, channel=self.channel,
            make_learner=lambda name, kg: self._make_client(-1, name, kg),
        )
        self.learners = self.strategy.learners(self.clients)
        self.parties: dict[str, Client] = {}
        for c in [*self.clients, *self.learners]:
            self.parties.setdefault(c.name, c)
        self.valid_triples = [kg.triples("valid").shape[0] for kg in self.fkg.clients]
        self.test_triples = [kg.triples("test").shape[0] for kg in self.fkg.clients]
        self.server_logger = (
            TensorBoardLogger(self.run_dir, name="tb", version="server", default_hp_metric=False)
            if self.run_dir is not None else None
        )

    def _make_client(self, index: int, name: str, kg) -> Client:
        cfg = self.cfg
        # Each party's init depends only on (seed, name), not on how many were built before.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(cfg.seed, name, "model"))
            module = build_module(cfg, kg.num_entities, kg.num_relations)
        datamodule = build_datamodule(kg, cfg, seed=derive_seed(cfg.seed, name, "data"))
        batches = max(1, math.ceil(kg.triples("train").shape[0] / cfg.train.batch_size))
        logger = (
            TensorBoardLogger(self.run_dir, name="tb", version=name, default_hp_metric=False)
            if self.run_dir is not None else False
        )
        with _quiet_lightning():
            trainer = L.Trainer(
                accelerator=cfg.trainer.accelerator,
                devices=cfg.trainer.devices,
                precision=cfg.trainer.precision,
                logger=logger,
                max_epochs=0,
                log_every_n_steps=min(50, batches),
                enable_progress_bar=False,
                enable_checkpointing=False,
                enable_model_summary=False,
                num_sanity_val_steps=0,
            )
        return Client(index=index, name=name, kg=kg, module=module, datamodule=datamodule, trainer=trainer)

    # ------------------------------------------------------------------ round steps
    def train_round(self, round: int) -> list[int]:
        """Select, download, train E local epochs, upload, aggregate. Returns the selection."""
        selected = self.strategy.select_clients(round)
        self.strategy.distribute(round, selected, self.learners)
        for k in selected:
            self.learners[k].fit(self.cfg.federated.local_epochs)
        self.strategy.collect(round, selected, self.learners)
        return selected

    def evaluate(self, split: str, round: int) -> tuple[dict, list[dict]]:
        """Evaluate every client on ``split`` with what the strategy provides.

        Returns ``(triple-weighted average, per-client metrics)``; per-client dicts carry
        the metric keys plus ``count`` (ranked queries) and ``triples`` (evaluation triples).
        """
        name = "eval_download" if split == "val" else "test_download"
        triples = self.valid_triples if split == "val" else self.test_triples
        per_client = []
        for k, client in enumerate(self.clients):
            self.strategy.prepare_evaluation(k, client, round, name=name)
            m = client.evaluate(split)
            entry = {key: float(m[key]) for key in METRIC_KEYS}
            entry["count"] = int(m["count"])
            entry["triples"] = int(triples[k])
            per_client.append(entry)
        return weighted_average(per_client, triples), per_client

    # ------------------------------------------------------------------ state
    def model_state(self) -> dict:
        """What evaluation needs: strategy/server state and every party's weights."""
        return {
            "strategy": self.strategy.state_dict(),
            "parties": {
                n: {"module": {k: v.detach().cpu().clone() for k, v in c.module.state_dict().items()}}
                for n, c in self.parties.items()
            },
        }

    def full_state(self) -> dict:
        """:meth:`model_state` plus optimizer and sampler states and the Channel log."""
        return {
            "strategy": self.strategy.state_dict(),
            "parties": {n: c.state_dict() for n, c in self.parties.items()},
            "channel": self.channel.state_dict(),
        }

    def load_state(self, state: dict, weights_only: bool = False) -> None:
        """Restore :meth:`model_state` or :meth:`full_state` output."""
        self.strategy.load_state_dict(state["strategy"])
        missing = set(self.parties) - set(state["parties"])
        if missing:
            raise KeyError(f"checkpoint lacks parties {sorted(missing)}")
        for n, c in self.parties.items():
            c.load_state_dict(state["parties"][n], weights_only=weights_only)
        if not weights_only and "channel" in state:
            self.channel.load_state_dict(state["channel"])

    def fingerprint(self) -> dict:
        """Settings a resumed run must share with the checkpoint it resumes.

        Everything that changes what a round computes; a resumed run may only change the
        round budget (``federated.rounds``, ``federated.patience``), the ``trainer``
        section (device, progress bar), the run's name/output folder and the model-fusion
        keys (``federated.fusion*``, a post-processing step).
        """
        cfg = asdict(self.cfg)
        for key in ("name", "out_dir", "trainer"):
            cfg.pop(key)
        for key in ("rounds", "patience", "fusion", "fusion_epochs", "fusion_lr", "fusion_margin",
                    "fusion_negatives"):
            cfg["federated"].pop(key)
        return cfg

    def log_server(self, metrics: dict, round: int) -> None:
        if self.server_logger is not None:
            self.server_logger.log_metrics(metrics, step=round)


def _differences(saved: dict, current: dict, prefix: str = "") -> str:
    """``key: saved -> current`` for every leaf that differs (for the resume error)."""
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            inner = _differences(a, b, f"{prefix}{key}.")
            if inner:
                out.append(inner)
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return ", ".join(out)


def _metrics_payload(run: FederatedRun, avg: dict, per_client: list[dict], last_round: int,
                     stopper: EarlyStopping, history: list[dict]) -> dict:
    test = dict(avg)
    test["count"] = int(sum(m["count"] for m in per_client))
    return {
        "test": test,
        "clients": per_client,
        "rounds": int(last_round),
        "best_round": int(stopper.best_round),
        "bytes_sent": int(run.channel.total_bytes),
        "strategy": run.cfg.federated.strategy,
        "validation": history,
    }


def run_federated(cfg: ExperimentConfig, run_dir: str | Path, resume: bool = True) -> dict:
    """Run the federated experiment ``cfg`` in ``run_dir``; resume it if a checkpoint exists.

    Writes ``checkpoints/last.pt`` after every round, ``checkpoints/best.pt`` at each new
    best validation score, TensorBoard sub-runs ``tb/client_k`` and ``tb/server``, and at
    the end ``metrics.json`` and ``channel_log.jsonl``.

    Returns the ``metrics.json`` dict: ``test`` (triple-weighted mean over clients of
    ``mrr, mr, hits@1, hits@3, hits@5, hits@10``, plus ``count``), ``clients`` (the same per
    client, plus ``count`` and ``triples``), ``rounds`` (rounds completed), ``best_round``,
    ``bytes_sent`` (Channel total, evaluation downloads included), ``strategy`` and
    ``validation`` (``[{round, mrr}]`` at each evaluation). With ``federated.fusion``
    (FedE only) also ``fusion``: FedE's model fusion, see
    :func:`~lightning_fedkg.federated.fusion_runner.run_fusion`.
    """
    run_dir = Path(run_dir)
    fc = cfg.federated
    if fc.fusion:
        from lightning_fedkg.federated.fusion_runner import check_fusion_config

        check_fusion_config(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    run = FederatedRun(cfg, run_dir)
    stopper = EarlyStopping(patience=fc.patience)
    history: list[dict] = []
    last_round, stopped = 0, False

    ckpt_dir = run_dir / CHECKPOINT_DIR
    last_path, best_path = ckpt_dir / LAST, ckpt_dir / BEST
    if resume and last_path.is_file():
        ckpt = load_checkpoint(last_path)
        if ckpt.get("version") != CHECKPOINT_VERSION or ckpt["fingerprint"] != run.fingerprint():
            raise ConfigError(
                f"{last_path} was written with different settings: "
                f"{_differences(ckpt.get('fingerprint') or {}, run.fingerprint())}; "
                "use another run directory or resume=False"
            )
        run.load_state(ckpt["state"])
        # The patience may be changed on resume; the counters carry over.
        stopper = EarlyStopping(**{**ckpt["early_stopping"], "patience": fc.patience})
        history = list(ckpt["history"])
        last_round, stopped = int(ckpt["round"]), stopper.should_stop
        restore_rng(ckpt["rng"])
        log.info("resuming %s after round %d", run_dir, last_round)

    from tqdm import tqdm

    bar = tqdm(total=fc.rounds, initial=min(last_round, fc.rounds), desc=f"{fc.strategy} rounds",
               unit="round", disable=not cfg.trainer.progress_bar, dynamic_ncols=True)
    try:
        for r in range(last_round + 1, fc.rounds + 1):
            if stopped:
                break
            run.train_round(r)
            server_log = {}
            if r % fc.eval_every == 0 or r == fc.rounds:
                avg, _ = run.evaluate("val", r)
                history.append({"round": r, "mrr": avg["mrr"]})
                if stopper.update(avg["mrr"], r):
                    save_atomic({"version": CHECKPOINT_VERSION, "round": r, **run.model_state()}, best_path)
                stopped = stopper.should_stop
                server_log.update({"val/mrr": avg["mrr"], "val/hits@10": avg["hits@10"]})
                bar.set_postfix(val_mrr=f"{avg['mrr']:.4f}", best=f"{stopper.best_metric:.4f}@{stopper.best_round}")
            # This round's traffic, evaluation downloads included.
            server_log["comm/bytes"] = float(sum(rec.bytes for rec in run.channel.records(round=r)))
            server_log["comm/bytes_total"] = float(run.channel.total_bytes)
            run.log_server(server_log, r)
            last_round = r
            save_atomic(
                {
                    "version": CHECKPOINT_VERSION,
                    "round": r,
                    "stopped": stopped,
                    "fingerprint": run.fingerprint(),
                    "state": run.full_state(),
                    "early_stopping": asdict(stopper),
                    "history": history,
                    "rng": capture_rng(),
                },
                last_path,
            )
            bar.update(1)
    finally:
        bar.close()

    if not best_path.is_file():
        raise RuntimeError(f"{best_path} is missing: no evaluation has completed")
    best = load_checkpoint(best_path)
    run.load_state(best, weights_only=True)
    avg, per_client = run.evaluate("test", last_round)
    metrics = _metrics_payload(run, avg, per_client, last_round, stopper, history)
    run.log_server({f"test/{k}": v for k, v in avg.items()}, last_round)
    if run.server_logger is not None:
        run.server_logger.save()
    if fc.fusion:
        from lightning_fedkg.federated.fusion_runner import run_fusion

        metrics["fusion"] = run_fusion(cfg, run, run_dir)
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    run.channel.to_jsonl(run_dir / "channel_log.jsonl")
    return metrics


def evaluate_federated_checkpoint(cfg: ExperimentConfig, ckpt_path: str | Path) -> dict:
    """Test every client with a saved ``best.pt`` or ``last.pt`` of a run of ``cfg``.

    Returns ``{"test", "clients"}`` as in ``metrics.json`` (nothing is written).
    """
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    run = FederatedRun(cfg, run_dir=None)
    ckpt = load_checkpoint(ckpt_path)
    run.load_state(ckpt.get("state", ckpt), weights_only=True)
    avg, per_client = run.evaluate("test", int(ckpt.get("round", 0)))
    test = dict(avg)
    test["count"] = int(sum(m["count"] for m in per_client))
    return {"test": test, "clients": per_client, "strategy": cfg.federated.strategy}
