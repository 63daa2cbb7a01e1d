"""What the scripts under ``scripts/`` share when they measure this library and write a result down.

The checkout a script belongs to (:func:`repo_root`), this process's peak memory
(:func:`peak_rss_mib`), the code that was measured (:func:`code_version`; :func:`git_blob_id`
for the files of an external checkout, such as an official code run beside ours), the machine
(:func:`machine`) and the results file (:func:`write_json`). The package itself does not use
it; scripts/README.md lists the scripts. It imports no torch at import time (:func:`machine`
does when called), so a script that only starts runs in child processes stays light.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import resource
import subprocess
from pathlib import Path

__all__ = ["code_version", "git", "git_blob_id", "machine", "peak_rss_mib", "repo_root", "write_json"]


def repo_root(start: str | Path | None = None) -> Path:
    """The checkout ``start`` (a script's ``__file__``; default this module) belongs to: the
    nearest folder at or above it that holds the ``lightning_fedkg`` package. That is the
    repository root of a clone, or of a tree unpacked with ``git archive`` (which has no
    ``pyproject.toml``), whatever the depth of the script in ``scripts/``."""
    here = Path(start if start is not None else __file__).resolve()
    for folder in (here, *here.parents):
        if (folder / "lightning_fedkg" / "__init__.py").is_file():
            return folder
    raise FileNotFoundError(f"no folder at or above {here} holds the lightning_fedkg package")


def peak_rss_mib() -> float:
    """Peak resident memory of this process in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def git(*args: str, repo: str | Path | None = None, check: bool = False) -> str:
    """``git ARGS`` run in ``repo`` (default: :func:`repo_root`), its stdout stripped; with
    ``check``, a failing git raises, else it gives what git printed (``""`` outside a clone)."""
    done = subprocess.run(["git", *args], cwd=repo or repo_root(), capture_output=True, text=True, check=check)
    return done.stdout.strip()


def code_version(repo: str | Path | None = None) -> dict:
    """The measured code: ``git rev-parse HEAD`` (None outside a clone) and whether tracked
    files differ from it (``dirty``)."""
    return {"commit": git("rev-parse", "HEAD", repo=repo) or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", repo=repo))}


def git_blob_id(path: str | Path) -> str:
    """The id git gives the file's content (``git hash-object``), computed without git: it
    tells whether a file is the one at a given commit of its repository."""
    data = Path(path).read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def machine() -> dict:
    """Where the numbers were made: platform, Python, torch, CPU count and the GPU, if any."""
    import torch

    return {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpus": os.cpu_count(), "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def write_json(path: str | Path, data, indent: int = 1, **dumps) -> Path:
    """Write ``data`` as JSON to ``path`` (its folder made if need be), ending in a newline;
    ``dumps``: more arguments of :func:`json.dumps` (``default=float``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, **dumps) + "\n")
    return path
