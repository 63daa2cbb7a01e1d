"""Train and test one KGE model on one knowledge graph with a plain Lightning ``Trainer``.

This is what ``fedkg fit`` runs when ``federated.strategy`` is ``none``. It is also the
simplest example of the library's building blocks used outside federation.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_fedkg.builders import build_datamodule, build_module, trainer_kwargs
from lightning_fedkg.config import ConfigError, ExperimentConfig, show_progress_bar
from lightning_fedkg.data import load_kg
from lightning_fedkg.evaluation.ranking import METRIC_KEYS
from lightning_fedkg.models import KGEModule

log = logging.getLogger("lightning_fedkg")



def _first_sentence(err: Exception) -> str:
    # torch's zip-reader message goes on for four sentences of advice; the first says it.
    return str(err).split(". ")[0]


class CheckpointReadError(ConfigError):
    """A checkpoint file that cannot be read, e.g. truncated by a crash or a full disk."""


def check_checkpoint(path: str | Path, hint: str) -> None:
    """Read ``path`` once so that a damaged file is reported as such, not as a pickle error.

    Raises :class:`CheckpointReadError` naming the file, the underlying error and ``hint``
    (what the user can do about it).
    """
    try:
        torch.load(Path(path), map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise
    # A damaged file fails in whichever layer notices first (zip reader, unpickler, tensor
    # storage): all of them mean the same thing to the user.
    except Exception as err:
        raise CheckpointReadError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {_first_sentence(err)}); the file is damaged, "
            f"e.g. cut short by a crash or a full disk. {hint}"
        ) from None


def format_test_result(metrics: dict) -> dict:
    """``{"test": {...}}`` as ``metrics.json`` reports it: the metric keys as plain floats
    and the number of ranked queries as ``count``."""
    selected = {k: float(metrics[k]) for k in METRIC_KEYS}
    selected["count"] = int(metrics["count"])
    return {"test": selected}


def run_kge(cfg: ExperimentConfig, run_dir: str | Path) -> dict:
    """Fit ``cfg.model`` on ``cfg.data`` with early stopping, test the best checkpoint.

    Writes TensorBoard events, checkpoints and ``metrics.json`` into ``run_dir``. A run
    directory that already holds ``checkpoints/last.ckpt`` is resumed from it; a damaged
    checkpoint raises :class:`CheckpointReadError` (a :class:`ConfigError`) saying so.
    Returns ``{"test": {mrr, mr, hits@1, hits@3, hits@5, hits@10}}``. ``run_dir`` is open
    and the process seeded (:func:`lightning_fedkg.run.fit`, the entry to call).
    """
    run_dir = Path(run_dir)
    kg = load_kg(cfg.data.name, fmt=cfg.data.format)
    if kg.triples("valid").shape[0] == 0:
        # Early stopping and the best checkpoint are chosen on validation MRR.
        raise ConfigError(
            f"{kg.name or cfg.data.name}: the valid split is empty after the input policy (its triples "
            "were missing or mention entities/relations unseen in train); a single-KG run needs "
            "validation triples to early-stop and pick its best checkpoint"
        )
    datamodule = build_datamodule(kg, cfg, seed=cfg.seed)
    module = build_module(cfg, kg.num_entities, kg.num_relations)

    ckpt_dir = run_dir / "checkpoints"
    checkpoint = ModelCheckpoint(
        dirpath=ckpt_dir, filename="best", monitor="val/mrr", mode="max", save_last=True
    )
    # Lightning counts EarlyStopping patience in validation checks, as FedE counts evaluations.
    early_stopping = EarlyStopping(monitor="val/mrr", mode="max", patience=cfg.train.patience)
    trainer = L.Trainer(
        max_epochs=cfg.train.max_epochs,
        check_val_every_n_epoch=cfg.train.eval_every,
        logger=TensorBoardLogger(run_dir, name="tb", version="kge", default_hp_metric=False),
        callbacks=[checkpoint, early_stopping],
        enable_progress_bar=show_progress_bar(cfg.trainer),
        num_sanity_val_steps=0,
        **trainer_kwargs(cfg.trainer),
    )
    last = ckpt_dir / "last.ckpt"
    resume_from = str(last) if last.is_file() else None
    if resume_from:
        check_checkpoint(last, "Delete it to start this run over (fedkg fit starts afresh without it).")
        log.info("resuming from %s", resume_from)
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)
    best = checkpoint.best_model_path or None
    if best:
        # A resumed run that has finished tests the saved best.ckpt without rewriting it.
        check_checkpoint(best, f"Delete {ckpt_dir} to start this run over.")
    trainer.test(module, datamodule=datamodule, ckpt_path=best, verbose=False)
    result = format_test_result(module.last_metrics["test"])
    (run_dir / "metrics.json").write_text(json.dumps(result, indent=2))
    return result


def evaluate_kge_checkpoint(cfg: ExperimentConfig, ckpt_path: str | Path) -> dict:
    """Evaluate a saved single-KG checkpoint on the test split of ``cfg.data``.

    Raises :class:`CheckpointReadError` if the file is damaged.
    """
    check_checkpoint(ckpt_path, "Evaluate another checkpoint (e.g. the run's best.ckpt or last.ckpt).")
    kg = load_kg(cfg.data.name, fmt=cfg.data.format)
    datamodule = build_datamodule(kg, cfg, seed=cfg.seed)
    module = KGEModule.load_from_checkpoint(str(ckpt_path), map_location="cpu")
    trainer = L.Trainer(logger=False, enable_progress_bar=show_progress_bar(cfg.trainer),
                        **trainer_kwargs(cfg.trainer))
    trainer.test(module, datamodule=datamodule, verbose=False)
    return format_test_result(module.last_metrics["test"])
