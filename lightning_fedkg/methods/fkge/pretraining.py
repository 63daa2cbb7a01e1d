"""An FKGE party's pre-training alone, before any handshake, and its saved result.

The pre-trained model is saved as ``<run>/pretrained/<party>.pt`` so that variants and
controls can start from one converged pre-training (``federated.fkge.pretrained_from``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from lightning_fedkg.config import ConfigError

from .config import FKGEConfig

__all__ = ["Pretraining", "pretrain", "pretrained_file", "save_pretrained", "load_pretrained"]

log = logging.getLogger("lightning_fedkg")


@dataclass
class Pretraining:
    """How a party was pre-trained: epochs, why it stopped, its validation curve
    (``[epoch, MRR]`` pairs) and the file it was loaded from, if it was."""

    epochs: int
    stopped: str  # "epochs" or "patience"
    valid_curve: list
    source: str | None
    seconds: float

    def to_dict(self) -> dict:
        """The ``pretrain`` block of ``metrics.json`` (and of the saved file)."""
        return {"epochs": self.epochs, "stopped": self.stopped, "valid_curve": self.valid_curve,
                "from": self.source, "seconds": self.seconds}

    @classmethod
    def from_dict(cls, block: dict) -> "Pretraining":
        return cls(block["epochs"], block["stopped"], block["valid_curve"], block["from"], block["seconds"])


def pretrain(party, fk: FKGEConfig, score: Callable[[], float]) -> Pretraining:
    """Train ``party`` alone: ``pretrain_epochs``, or until ``pretrain_patience`` validation
    scores (``score()``, one every ``pretrain_eval_every`` epochs) bring no new best."""
    tic = time.perf_counter()
    curve, epochs, best, stale = [], 0, -math.inf, 0
    while epochs < fk.pretrain_epochs:
        chunk = fk.pretrain_epochs - epochs if fk.pretrain_patience is None else \
            min(fk.pretrain_eval_every, fk.pretrain_epochs - epochs)
        party.fit(chunk)
        epochs += chunk
        if fk.pretrain_patience is None:
            break
        value = score()
        curve.append([epochs, value])
        party.log({"pretrain/valid_mrr": value}, epochs)  # TensorBoard, step = epoch
        log.info("%s: pre-training epoch %d, validation MRR %.4f", party.name, epochs, value)
        best, stale = (value, 0) if value > best else (best, stale + 1)
        if stale >= fk.pretrain_patience:
            break
    stopped = "patience" if fk.pretrain_patience is not None and stale >= fk.pretrain_patience else "epochs"
    return Pretraining(epochs, stopped, curve, None, time.perf_counter() - tic)


def pretrained_file(run_dir: str | Path, name: str) -> Path:
    return Path(run_dir) / "pretrained" / f"{name}.pt"


def save_pretrained(party, record: Pretraining) -> None:
    """Save ``party``'s pre-trained model in its run directory (none: nothing is saved)."""
    if party.run_dir is None:
        return
    from lightning_fedkg.atomic import write_atomic

    state = {"model": party.model.state_dict(), "pretrain": record.to_dict(),
             "entities": party.kg.num_entities, "relations": party.kg.num_relations}
    file = pretrained_file(party.run_dir, party.name)
    file.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(file, lambda f: torch.save(state, f))


def load_pretrained(party, run_dir: str | Path) -> Pretraining:
    """Load ``party``'s model pre-trained by the run in ``run_dir``."""
    file = pretrained_file(run_dir, party.name)
    if not file.is_file():
        raise ConfigError(f"federated.fkge.pretrained_from: {file} does not exist (run the pre-training first, "
                          f"with the same data and party names)")
    saved = torch.load(file, map_location="cpu", weights_only=True)
    kg = party.kg
    if (saved["entities"], saved["relations"]) != (kg.num_entities, kg.num_relations):
        raise ConfigError(f"{file}: pre-trained on {saved['entities']} entities and {saved['relations']} relations, "
                          f"this party has {kg.num_entities} and {kg.num_relations}")
    party.model.load_state_dict(saved["model"])
    return Pretraining.from_dict({**saved["pretrain"], "from": str(file)})
