"""All-or-nothing file writes: a temporary file beside the target, then ``os.replace``.

``os.replace`` is atomic on POSIX and Windows, so a process killed mid-write leaves the
previous file (or none), never half of one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Callable

__all__ = ["write_atomic"]


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], object]) -> None:
    """Call ``write(f)`` on a binary temporary file, sync it, and move it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
