"""Run directories: one process at a time, settings checked before anything is written.

``fedkg fit`` trains into a run directory and continues the run it finds there. Opening a
directory with :meth:`RunDirectory.open` does, in this order:

1. take an exclusive lock (``fcntl.flock`` on ``RUN_DIR/.lock``, released when the process
   exits, even by SIGKILL), so two processes never write the same checkpoints;
2. if ``RUN_DIR/config.yaml`` exists, compare its :func:`~lightning_fedkg.config.resume_fingerprint`
   with the new config's and refuse on any difference — the directory is left untouched —
   unless the directory holds nothing else (:func:`holds_run_output`): that is a run which
   failed before producing anything (bad data, say), and the corrected command may start there;
3. only then write the new ``config.yaml`` (temporary file + ``os.replace``).

The lock is POSIX-only (``fcntl``), like the rest of the run-directory handling.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from lightning_fedkg.config import (
    ConfigError,
    ExperimentConfig,
    config_from_yaml_text,
    resume_differences,
    resume_fingerprint,
    save_config,
)

__all__ = ["CONFIG_FILE", "LOCK_FILE", "RunDirectory", "RunLockedError", "check_resumable", "holds_run_output",
           "read_run_config", "check_unlocked"]

log = logging.getLogger("lightning_fedkg")

CONFIG_FILE = "config.yaml"
LOCK_FILE = ".lock"


class RunLockedError(ConfigError):
    """Another process holds the run directory's lock."""


@contextlib.contextmanager
def _exclusive_lock(run_dir: Path) -> Iterator[None]:
    # flock locks belong to an open file: a second open of the same directory, even in this
    # process, is refused like another process's (only lightning_fedkg.run.fit opens one).
    fd = os.open(run_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _locked(run_dir) from None
    try:
        yield
    finally:
        # Closing the descriptor releases the flock. The file stays: deleting it would let a
        # waiting process lock an unlinked inode while a third creates a new one.
        os.close(fd)


def _locked(run_dir: Path) -> RunLockedError:
    return RunLockedError(f"another fedkg process is using {run_dir} (it holds {run_dir / LOCK_FILE}); wait for "
                          "it to finish or use another run directory (fedkg fit --out DIR)")


def check_folder_path(run_dir: str | Path) -> None:
    """Raise :class:`ConfigError` when ``run_dir`` (or the nearest part of it that exists)
    is a file: a run directory there cannot be created, and ``mkdir`` would otherwise end
    the command in a ``FileExistsError`` / ``NotADirectoryError`` traceback."""
    run_dir = Path(run_dir)
    for part in (run_dir, *run_dir.parents):
        if part.is_dir():
            return
        if part.exists():
            what = "is a file" if part == run_dir else f"cannot be created: {part} is a file"
            raise ConfigError(f"run directory {run_dir} {what}, not a folder; give --out a new folder "
                              f"or an existing run directory")


def check_unlocked(run_dir: str | Path) -> None:
    """Raise :class:`RunLockedError` now if another process holds ``run_dir``'s lock (a
    command's early check, before its slow imports; :meth:`RunDirectory.open` takes the
    lock itself later). Creates nothing."""
    run_dir = Path(run_dir)
    check_folder_path(run_dir)
    lock_path = run_dir / LOCK_FILE
    if not lock_path.is_file():
        return
    fd = os.open(lock_path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise _locked(run_dir) from None
    finally:
        os.close(fd)  # also releases the probe's lock


def read_run_config(run_dir: str | Path, sections=()) -> ExperimentConfig:
    """The config a run directory was run with (its ``config.yaml``): what every ``--from
    RUN_DIR`` command starts from. Reads only. ``sections`` as in
    :func:`~lightning_fedkg.config.load_config`. Raises :class:`ConfigError` when ``run_dir``
    is not a run directory or its config cannot be read."""
    config_path = Path(run_dir) / CONFIG_FILE
    if not config_path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    return config_from_yaml_text(config_path.read_text(), sections=sections, source=str(config_path))


def holds_run_output(run_dir: str | Path) -> bool:
    """Whether ``run_dir`` holds any file besides ``config.yaml`` and ``.lock``.

    Those two are written before a run loads its data; everything a run produces comes after
    (``checkpoints/``, ``tb/``, ``channel_log.jsonl``, ``payloads/``, ``phases/``,
    ``metrics.json``, ...). Empty folders do not count. Any other file does, even one fedkg
    does not know: its settings are then kept rather than guessed about.
    """
    run_dir = Path(run_dir)
    ignored = {run_dir / CONFIG_FILE, run_dir / LOCK_FILE}
    return any(p not in ignored and not p.is_dir() for p in run_dir.rglob("*"))


def check_resumable(run_dir: str | Path, cfg: ExperimentConfig) -> bool:
    """Whether ``run_dir`` already holds a run; raise if ``cfg`` may not continue it.

    Returns False when there is no ``config.yaml`` (a new run), True when there is one whose
    :func:`~lightning_fedkg.config.resume_fingerprint` equals ``cfg``'s. A ``config.yaml``
    with other settings in a directory without run output (:func:`holds_run_output`) is
    a failed start: False (logged at INFO), so that the caller saves ``cfg`` over it.
    Raises :class:`~lightning_fedkg.config.ConfigError` listing ``key: saved -> new`` for
    every difference, or when the saved config cannot be read. Reads only; writes nothing.
    """
    config_path = Path(run_dir) / CONFIG_FILE
    if not config_path.is_file():
        return False
    try:
        saved = config_from_yaml_text(config_path.read_text())
    except ConfigError as err:
        raise ConfigError(
            f"{config_path} cannot be read ({err}); use another run directory (fedkg fit --out DIR)"
        ) from None
    differences = resume_differences(resume_fingerprint(saved), cfg)
    if differences and not holds_run_output(run_dir):
        # A command that stopped early (a malformed data file, say) saved its settings and
        # nothing else; refusing the corrected one would lock the directory for no run.
        log.info("%s holds only the config.yaml of a run that stopped before producing anything; "
                 "replacing it with the new settings (%s)", run_dir, ", ".join(differences))
        return False
    if differences:
        raise ConfigError(
            f"{run_dir} holds a run with other settings ({', '.join(differences)}); "
            "nothing was changed. Use another run directory (fedkg fit --out DIR) for these "
            f"settings, or the saved ones ({config_path}) to continue that run."
        )
    return True


@dataclass(frozen=True)
class RunDirectory:
    """A run directory opened by this process: locked, and its ``config.yaml`` is ``cfg``.

    ``resumed`` is True when the directory already held a run (same settings) before.
    """

    path: Path
    cfg: ExperimentConfig
    resumed: bool

    @property
    def config_path(self) -> Path:
        """``path / "config.yaml"``."""
        return self.path / CONFIG_FILE

    @classmethod
    @contextlib.contextmanager
    def open(cls, run_dir: str | Path, cfg: ExperimentConfig) -> Iterator["RunDirectory"]:
        """Lock ``run_dir``, check ``cfg`` against the run it holds, then save ``cfg``.

        Creates the directory if needed. Raises :class:`RunLockedError` when another
        process has it open and :class:`~lightning_fedkg.config.ConfigError` when it holds
        a run with other settings (see :func:`check_resumable`; a ``config.yaml`` alone is
        replaced); in both cases no file in it is modified. The lock is held until the
        ``with`` block exits; opening the same directory again inside it is refused
        (:class:`RunLockedError`), as from another process.
        """
        path = Path(run_dir)
        check_folder_path(path)
        path.mkdir(parents=True, exist_ok=True)
        with _exclusive_lock(path):
            resumed = check_resumable(path, cfg)
            save_config(cfg, path / CONFIG_FILE)
            yield cls(path=path, cfg=cfg, resumed=resumed)
