"""Flower's output, made readable where it is redirected: colours off, known noise filtered.

Light at import (only the standard library); :func:`plain_logs_unless_terminal` imports flwr
when called.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import re
import sys
import threading
import warnings
from pathlib import Path
from typing import IO, Iterator, Mapping

__all__ = ["NOISY_WARNINGS", "copy_plain", "plain_logs_unless_terminal", "quiet_environment",
           "quiet_noisy_warnings", "simulation_environment", "strip_ansi"]

#: Third-party warnings a run on Flower printed that a user can do nothing about, as the
#: fields of a ``PYTHONWARNINGS`` entry: (message prefix, category, module or "").
#: The prefixes hold no ':', which separates the fields.
NOISY_WARNINGS = (
    # torch_geometric applies torch.jit.script when imported; torch 2.13 deprecates it.
    ("`torch.jit.script` is deprecated", "DeprecationWarning", ""),
    # ray.init (a simulation): "Tip: In future versions of Ray, Ray will no longer override
    # accelerator visible devices ...". Opting in to that behaviour would let the ClientApp
    # actors (num_gpus=0) see the GPUs: the warning is silenced, the behaviour kept.
    ("Tip", "FutureWarning", "ray._private.worker"),
)
#: Flower's notices (its own log, not Python warnings) about what this package calls on
#: purpose: ``run_simulation`` is how a simulation runs inside ``fedkg fit``.
NOISY_NOTICES = ("The `run_simulation` function is deprecated",)
#: A terminal's escape sequences (colours, cursor moves): junk in a file.
ANSI_ESCAPE = re.compile(rb"\x1b\[[0-?]*[ -/]*[@-~]")


def strip_ansi(data: bytes) -> bytes:
    """``data`` without terminal escape sequences (:data:`ANSI_ESCAPE`)."""
    return ANSI_ESCAPE.sub(b"", data)


def plain_logs_unless_terminal() -> None:
    """Turn off the colours of Flower's console log where its stream is not a terminal.

    Flower's ``ConsoleHandler`` wraps every level name in ANSI colour codes, terminal or
    not (flwr 1.x has no setting for it), so a redirected run's log (its deprecation
    warnings, say) holds escape codes. The handler reads ``colored`` at each record:
    setting it once flwr is imported is enough. Call after importing flwr.
    """
    from flwr.common.logger import ConsoleHandler

    for handler in logging.getLogger("flwr").handlers:
        if isinstance(handler, ConsoleHandler):
            isatty = getattr(handler.stream, "isatty", None)
            handler.colored = bool(isatty and isatty())


class _DropNotices(logging.Filter):
    """Drops Flower's records that :data:`NOISY_NOTICES` name."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(notice in message for notice in NOISY_NOTICES)


_DROP_NOTICES = _DropNotices()


def quiet_noisy_warnings() -> None:
    """Ignore :data:`NOISY_WARNINGS` in this process, and drop Flower's :data:`NOISY_NOTICES`.

    Other processes get them through their environment (:func:`quiet_environment`): a
    process reads ``PYTHONWARNINGS`` when it starts.
    """
    for message, category, module in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=re.escape(message), category=getattr(builtins, category),
                                module=re.escape(module) + r"\Z" if module else "")
    flwr = logging.getLogger("flwr")
    if _DROP_NOTICES not in flwr.filters:
        flwr.addFilter(_DROP_NOTICES)


def quiet_environment(env: Mapping[str, str], colour: bool = False) -> dict[str, str]:
    """``env`` for processes that run Flower (or Ray) with :data:`NOISY_WARNINGS` ignored
    and, unless ``colour``, without colours.

    ``PYTHONWARNINGS`` gets ours first, ``env``'s own after them (a later entry wins, so a
    user's choice stands). Colours: ``NO_COLOR=1`` (the convention; rich and typer, behind
    ``flwr``, follow it), ``RAY_COLOR_PREFIX=0`` (Ray's ``(ClientAppActor pid=...)``
    prefixes) and, unless set, ``RAY_DEDUP_LOGS=0`` (Ray's "[repeated 2x across cluster]"
    notes are green whatever the stream; without them each process's line is printed).
    Flower's own processes colour their log anyway: :func:`copy_plain` strips it.
    """
    ours = [f"ignore:{m}:{c}:{mod}" if mod else f"ignore:{m}:{c}" for m, c, mod in NOISY_WARNINGS]
    theirs = [entry for entry in env.get("PYTHONWARNINGS", "").split(",") if entry]
    out = {**env, "PYTHONWARNINGS": ",".join([*ours, *theirs])}
    if not colour:
        out.update({"NO_COLOR": "1", "RAY_COLOR_PREFIX": "0"})
        out.setdefault("RAY_DEDUP_LOGS", "0")
    return out


@contextlib.contextmanager
def simulation_environment(stream: IO | None = None) -> Iterator[None]:
    """While the block runs, this process's environment is :func:`quiet_environment`'s, with
    colours as ``stream`` (default: stderr) is a terminal or not; then it is restored.

    A simulation's Ray workers inherit the environment when ``ray.init`` starts them, and
    Ray reads ``RAY_DEDUP_LOGS`` when it is imported: enter the block before importing
    ``flwr.simulation`` (which imports Ray).
    """
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    changes = {k: v for k, v in quiet_environment(os.environ, colour=bool(isatty and isatty())).items()
               if os.environ.get(k) != v}
    saved = {k: os.environ.get(k) for k in changes}
    os.environ.update(changes)
    try:
        yield
    finally:  # only what was set here goes back: anything else set meanwhile stays
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def copy_plain(pipe: IO[bytes], path: Path) -> threading.Thread:
    """Append what a process writes to ``pipe`` to the file ``path``, line by line, without
    terminal escape sequences (:func:`strip_ansi`), in a thread that ends when every writer
    of the pipe has closed it (the process and any child it started); returns the thread.

    Flower's SuperLink, SuperNode and SuperExec colour their level names even into a file,
    and the SuperExec is started by the other two: its output can only be cleaned here.
    """

    def copy() -> None:
        with pipe, open(path, "ab") as out:
            for line in iter(pipe.readline, b""):
                out.write(strip_ansi(line))
                out.flush()  # the log is read while the process runs (tail -f, error messages)

    thread = threading.Thread(target=copy, name=f"fedkg log {path.name}", daemon=True)
    thread.start()
    return thread
