"""Phases: steps a method runs after training, or on a finished run (a command's work).

After the round loop has tested the best state, the runner asks the strategy which phases
run under the config (:meth:`~.strategies.base.Strategy.phases`) and runs each registered
:class:`Phase` with a :class:`PhaseContext`. A phase returns its ``metrics.json`` block
(stored under its name), logs TensorBoard scalars under ``<name>/...`` and is its own
resume point: its block is kept in ``<run_dir>/phases/<name>.json`` together with the
settings that produced it, and reused when a finished run is run again with the same
settings. A phase may start sub-runs in sub-folders (:meth:`PhaseContext.subrun_dir`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_fedkg.registry import PHASES

__all__ = ["Phase", "PhaseContext", "PHASES", "run_phases"]


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
        block = phase.run(ctx)
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({"settings": settings, "result": block}, indent=1))
        if ctx.writer is not None and isinstance(block.get("test"), dict):
            ctx.writer.log({f"{phase.name}/{k}": v for k, v in block["test"].items()
                            if isinstance(v, float)}, ctx.run.last_round)
        out[phase.name] = block
    return out
