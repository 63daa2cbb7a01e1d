"""Phases: steps a method runs after training, or on a finished run (a command's work).

After the round loop has tested the best state, the runner asks the strategy which phases
run under the config (:meth:`~.strategies.base.Strategy.phases`) and runs each registered
:class:`Phase` with a :class:`PhaseContext`. A phase returns its ``metrics.json`` block
(stored under its name), logs TensorBoard scalars under ``<name>/...`` and is its own
resume point: its block is kept in ``<run_dir>/phases/<name>.json`` together with the
settings that produced it, and reused when a finished run is run again with the same
settings. A phase may start sub-runs in sub-folders (:meth:`PhaseContext.subrun_dir`).
What the package logs while a phase runs starts with the phase's name, and a sub-run's
name after it (``unlearn/retrain: round 3/71 ...``: :func:`progress_label`).
"""

from __future__ import annotations

import json
import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from lightning_fedkg.registry import PHASES

__all__ = ["Phase", "PhaseContext", "PHASES", "run_phases", "progress_label"]

#: The labels :func:`progress_label` has open, outermost first (one process runs one phase
#: at a time; a module-level stack also labels what threads log meanwhile).
_LABELS: list[str] = []


class _Labelled(logging.Filter):
    """Prefixes the open labels (``unlearn/retrain: ``) to each record of the logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _LABELS:
            record.msg, record.args = f"{'/'.join(_LABELS)}: {record.getMessage()}", None
        return True


_LABELLED = _Labelled()


@contextmanager
def progress_label(label: str) -> Iterator[None]:
    """Within the block, each message of the ``lightning_fedkg`` logger (the round lines of
    a sub-run, a phase's own progress) starts with ``label: ``, after the labels of the
    blocks it is nested in (``unlearn/retrain: round 3/71 ...``): a user reading the log
    sees which phase and sub-run a line belongs to. Messages of its child loggers
    (``lightning_fedkg.runtime``) are not labelled: a logger's filter sees only its own.
    """
    logger = logging.getLogger("lightning_fedkg")
    if _LABELLED not in logger.filters:
        logger.addFilter(_LABELLED)
    _LABELS.append(label)
    try:
        yield
    finally:
        _LABELS.pop()


@dataclass
class PhaseContext:
    """What a phase runs with: the config, the tested run (parties at their best state),
    the run directory (where the phase writes) and the server's TensorBoard writer (may be None)."""

    cfg: Any
    run: Any
    run_dir: Path
    writer: Any = None
    #: Facts about the run the phase starts from (``fedkg unlearn``: its training ``seconds``).
    source: dict = field(default_factory=dict)

    def subrun_dir(self, name: str) -> Path:
        """A folder of the run directory for a sub-run started by the phase."""
        return self.run_dir / name


class Phase:
    """Base class: :meth:`settings` names what the result depends on, :meth:`run` computes it."""

    name = "phase"
    #: Dataclass of the phase's own top-level config section (``unlearn:``), or None.
    config_class: type | None = None

    def settings(self, cfg) -> dict:
        """JSON-able settings the block depends on beyond the run itself (for reuse)."""
        return {}

    def run(self, ctx: PhaseContext) -> dict:
        raise NotImplementedError

    def table_rows(self, block: dict) -> tuple[str, list[tuple[str, int, dict]]] | None:
        """``(title, [(label, #test, metrics)])`` that the results table shows for this
        phase's ``metrics.json`` block, or None (the default: nothing)."""
        return None

    @classmethod
    def format_report(cls, metrics: dict) -> str | None:
        """The whole table of a ``metrics.json`` whose layout is the phase's own (that of a
        command that runs it on a finished run), or None (the default: the generic table)."""
        return None


def run_phases(names: list[str], ctx: PhaseContext) -> dict:
    """Run (or reuse) each phase; returns ``{name: block}``."""
    out = {}
    for name in names:
        phase = PHASES.get(name)()
        saved = ctx.run_dir / "phases" / f"{phase.name}.json"
        settings = phase.settings(ctx.cfg)
        if saved.is_file():
            stored = json.loads(saved.read_text())
            if stored.get("settings") == settings:
                out[phase.name] = stored["result"]
                continue
        with progress_label(phase.name):
            block = phase.run(ctx)
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({"settings": settings, "result": block}, indent=1))
        if ctx.writer is not None and isinstance(block.get("test"), dict):
            ctx.writer.log({f"{phase.name}/{k}": v for k, v in block["test"].items()
                            if isinstance(v, float)}, ctx.run.last_round)
        out[phase.name] = block
    return out
