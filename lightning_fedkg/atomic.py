"""All-or-nothing file writes: a temporary file beside the target, then ``os.replace``.

``os.replace`` is atomic on POSIX and Windows, so a process killed mid-write leaves the
previous file (or none), never half of one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Callable

__all__ = ["write_atomic"]


def write_atomic(path: str | Path, write: Callable[[IO[bytes]], object], mode: int = 0o666) -> None:
    """Call ``write(f)`` on a binary temporary file, sync it, and move it to ``path``.

    ``mode``: the permissions the file is created with (less the umask); a private key's
    ``0o600`` holds from the first byte, as the temporary file already has it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
