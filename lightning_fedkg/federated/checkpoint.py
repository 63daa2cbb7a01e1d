"""Per-party round checkpoints committed by a manifest, and RNG capture.

Under ``run_dir/checkpoints/``: ``<party>/round_<r>.pt`` per party and ``round_<r>.json``,
the manifest written last, which commits the round (likewise ``best``). Files are written
to a temporary name and moved with ``os.replace``; the two newest rounds are kept. Files
hold tensors and RNG states read with ``weights_only=False``: only load checkpoints you
wrote. Resuming is described in docs/usage.md.
"""

from __future__ import annotations

import json
import pickle
import random
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_fedkg.atomic import write_atomic
from lightning_fedkg.config import ConfigError, ExperimentConfig, resume_differences

__all__ = [
    "CHECKPOINT_DIR",
    "CheckpointError",
    "resume_manifest",
    "save_atomic",
    "load_checkpoint",
    "commit_round",
    "latest_manifest",
    "read_manifest",
    "load_party",
    "resolve_manifest",
    "capture_rng",
    "restore_rng",
    "check_format",
]

CHECKPOINT_DIR = "checkpoints"
_ROUND = re.compile(r"round_(\d+)\.json$")
KEEP_ROUNDS = 2


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated or corrupt; the message names it."""


def save_atomic(obj: Any, path: str | Path) -> None:
    """``torch.save`` to ``path`` via a temporary file and ``os.replace`` (all or nothing)."""
    write_atomic(Path(path), lambda f: torch.save(obj, f))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """Read a file written by :func:`save_atomic`; :class:`CheckpointError` names a bad file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    try:
        return torch.load(path, map_location=map_location, weights_only=False)
    except PermissionError as err:
        raise CheckpointError(f"checkpoint file {path} cannot be read ({err})") from None
    # A damaged file fails in whichever layer notices first: the unpickler (EOFError on an
    # empty file), the zip reader (RuntimeError without a central directory; a bare OSError
    # "Invalid argument", naming no file, when the cut falls inside the archive's records).
    except (pickle.UnpicklingError, EOFError, RuntimeError, zipfile.BadZipFile, ValueError, OSError) as err:
        # torch's zip-reader message goes on for four sentences of advice; the first says it.
        reason = str(err).split(". ")[0]
        raise CheckpointError(f"checkpoint file {path} is truncated or corrupt ({type(err).__name__}: {reason})") from None


def commit_round(ckpt_dir: str | Path, tag: str, parts: dict[str, Any], meta: dict) -> Path:
    """Write every party's state as ``<party>/<tag>.pt``, then the manifest ``<tag>.json``.

    ``tag`` is ``round_0007`` or ``best``. Older ``round_*`` sets beyond the last
    :data:`KEEP_ROUNDS` are deleted after the commit. Returns the manifest path.
    """
    ckpt_dir = Path(ckpt_dir)
    files = {}
    for party, state in parts.items():
        save_atomic(state, ckpt_dir / party / f"{tag}.pt")
        files[party] = f"{party}/{tag}.pt"
    manifest = ckpt_dir / f"{tag}.json"
    text = json.dumps({**meta, "files": files}, indent=1).encode()
    write_atomic(manifest, lambda f: f.write(text))
    if tag.startswith("round_"):
        _prune(ckpt_dir)
    return manifest


def _committed_rounds(ckpt_dir: Path) -> list[tuple[int, Path]]:
    found = [(int(m.group(1)), p) for p in ckpt_dir.glob("round_*.json") if (m := _ROUND.search(p.name))]
    return sorted(found)


def _prune(ckpt_dir: Path) -> None:
    for _, manifest in _committed_rounds(ckpt_dir)[:-KEEP_ROUNDS]:
        tag = manifest.stem
        manifest.unlink()
        for f in ckpt_dir.glob(f"*/{tag}.pt"):
            f.unlink()


def latest_manifest(ckpt_dir: str | Path) -> Path | None:
    """The newest committed ``round_*.json``, or None."""
    rounds = _committed_rounds(Path(ckpt_dir))
    return rounds[-1][1] if rounds else None


def read_manifest(path: str | Path) -> dict:
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint manifest {path} is unreadable ({err})") from None


def load_party(manifest_path: str | Path, manifest: dict, party: str) -> Any:
    """One party's state from a committed set; a bad file names the manifest to delete."""
    manifest_path = Path(manifest_path)
    if party not in manifest["files"]:
        raise CheckpointError(f"{manifest_path} has no state for party {party!r}")
    path = manifest_path.parent / manifest["files"][party]
    try:
        return load_checkpoint(path)
    except CheckpointError as err:
        hint = ""
        if manifest_path.name.startswith("round_"):
            earlier = [p for _, p in _committed_rounds(manifest_path.parent) if p != manifest_path]
            if earlier:
                hint = (f"; to resume from the previous round instead, delete {manifest_path} "
                        f"(then {earlier[-1].name} is the newest)")
        raise CheckpointError(f"{err}{hint}") from None


def resolve_manifest(path: str | Path) -> Path:
    """A manifest from what a user may pass: a manifest, or a run or checkpoints folder
    (its best state)."""
    path = Path(path)
    if path.suffix == ".json" and path.is_file():
        return path
    if path.is_dir():
        ckpt = path / CHECKPOINT_DIR if (path / CHECKPOINT_DIR).is_dir() else path
        if (ckpt / "best.json").is_file():
            return ckpt / "best.json"
    raise CheckpointError(f"no federated checkpoint at {path} (expected a checkpoints/*.json manifest)")


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


def check_format(path: str | Path, manifest: dict, version: int) -> None:
    """Refuse a manifest of another checkpoint format than ``version`` (an earlier release's
    states are not read: their layout may differ in ways no reader checks)."""
    if manifest.get("version") != version:
        raise ConfigError(f"{path} holds checkpoint format {manifest.get('version')!r}, written by another version "
                          f"of lightning_fedkg; this version reads format {version} only. Run the experiment "
                          "again with this version (in another run directory) to resume or evaluate it")


def resume_manifest(ckpt_dir: Path, cfg: ExperimentConfig, version: int, resume: bool = True):
    """``(path, manifest)`` of the newest committed round in ``ckpt_dir``, or ``(None, None)``.

    Raises :class:`ConfigError` for another checkpoint format (:func:`check_format`), or
    listing ``key: saved -> new`` when it was written with other settings than ``cfg``.
    """
    path = latest_manifest(ckpt_dir) if resume else None
    if path is None:
        return None, None
    manifest = read_manifest(path)
    check_format(path, manifest, version)
    differences = resume_differences(manifest.get("fingerprint") or {}, cfg)
    if differences:
        raise ConfigError(f"{path} was written with different settings: {', '.join(differences)}; "
                          "use another run directory")
    return path, manifest
