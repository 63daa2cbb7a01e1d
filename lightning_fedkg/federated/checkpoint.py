"""Atomic round checkpoints and RNG capture for resumable federated runs.

A federated run writes ``run_dir/checkpoints/last.pt`` after every completed round and
``best.pt`` whenever the validation score improves. Files are written to a temporary name
and moved into place with ``os.replace``, which is atomic on POSIX and Windows: a run killed
mid-write leaves the previous checkpoint intact, never a truncated one.

The files hold plain Python containers of tensors, ints, strings and RNG states (Python's
``random`` state is a tuple, NumPy's holds an array), so they are read with
``weights_only=False``. Only load checkpoints you wrote yourself.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "CHECKPOINT_DIR",
    "LAST",
    "BEST",
    "save_atomic",
    "load_checkpoint",
    "capture_rng",
    "restore_rng",
]

CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
BEST = "best.pt"


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``path`` via a temporary file and ``os.replace`` (all or nothing)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by :func:`save_atomic`."""
    return torch.load(Path(path), map_location=map_location, weights_only=False)


def capture_rng() -> dict:
    """The global RNG states that any library code could draw from (torch, CUDA, Python, NumPy)."""
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    """Undo :func:`capture_rng` (CUDA states only when both sides have CUDA)."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
