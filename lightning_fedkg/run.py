"""The one entry of a run, whatever the method and the engine: what ``fedkg`` calls.

* :func:`fit` -- a single-KG run (``federated.strategy: none``,
  :func:`~lightning_fedkg.training.run_kge`) or a federated one
  (:func:`~lightning_fedkg.federated.orchestrator.run_federated`, which picks the runner,
  rounds or events, and the engine, in-process or Ray, and drives it through the one run
  skeleton :func:`~lightning_fedkg.federated.runner.run_engine`);
* :func:`evaluate` -- test a committed state of either kind;
* :func:`best_state` -- what ``--from RUN_DIR`` evaluates, with
  :func:`~lightning_fedkg.rundir.read_run_config` the loader of a finished run.
"""

from __future__ import annotations

from pathlib import Path

from lightning_fedkg.config import ExperimentConfig
from lightning_fedkg.rundir import RunDirectory, read_run_config

__all__ = ["fit", "evaluate", "best_state", "read_run_config"]


def fit(cfg: ExperimentConfig, run_dir: str | Path) -> dict:
    """Train what ``cfg`` describes in ``run_dir`` (or resume it); returns ``metrics.json``."""
    with RunDirectory.open(run_dir, cfg):
        if cfg.federated.strategy == "none":
            from lightning_fedkg.training import run_kge

            return run_kge(cfg, run_dir)
        from lightning_fedkg.federated.orchestrator import run_federated

        return run_federated(cfg, run_dir)


def evaluate(cfg: ExperimentConfig, ckpt: str | Path) -> dict:
    """Test a committed state of a run of ``cfg`` (a single-KG ``.ckpt``, or a federated
    manifest or run folder); writes nothing."""
    if cfg.federated.strategy == "none":
        from lightning_fedkg.training import evaluate_kge_checkpoint

        return evaluate_kge_checkpoint(cfg, ckpt)
    from lightning_fedkg.federated.orchestrator import evaluate_federated_checkpoint

    return evaluate_federated_checkpoint(cfg, ckpt)


def best_state(run_dir: str | Path, cfg: ExperimentConfig) -> Path:
    """The state ``--from RUN_DIR`` evaluates: a single-KG run's ``best.ckpt``, else the run
    folder (its best set, or a peer run's newest committed state)."""
    run_dir = Path(run_dir)
    return run_dir / "checkpoints" / "best.ckpt" if cfg.federated.strategy == "none" else run_dir
