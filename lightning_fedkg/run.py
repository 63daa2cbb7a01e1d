"""The one entry of a run, whatever the method and the backend: what ``fedkg`` calls.

* :func:`fit` -- locks the run directory, saves its ``config.yaml``, sets this process's
  threads and seeds it, then runs a single-KG run (``federated.strategy: none``,
  :func:`~lightning_fedkg.training.run_kge`) or a federated one
  (:func:`~lightning_fedkg.federated.entry.run_federated`, which picks the loop, rounds or
  events, or the backend, Ray or Flower, and drives it through the one run skeleton
  :func:`~lightning_fedkg.federated.runner.run_loop`);
* :func:`evaluate` -- test a committed state of either kind;
* :func:`best_state` -- what ``--from RUN_DIR`` evaluates, with
  :func:`~lightning_fedkg.rundir.read_run_config` the loader of a finished run.
"""

from __future__ import annotations

from pathlib import Path

from lightning_fedkg.config import ExperimentConfig, resolve_auto_settings
from lightning_fedkg.rundir import RunDirectory, read_run_config
from lightning_fedkg.runtime import config_table_elements, configure_torch, seed_process

__all__ = ["fit", "evaluate", "best_state", "read_run_config"]


def fit(cfg: ExperimentConfig, run_dir: str | Path) -> dict:
    """Train what ``cfg`` describes in ``run_dir`` (or resume it); returns ``metrics.json``.

    The one place a run starts: it locks ``run_dir`` and saves ``cfg`` as its
    ``config.yaml`` (:meth:`~lightning_fedkg.rundir.RunDirectory.open`), sets this
    process's threads and determinism (:func:`~lightning_fedkg.runtime.configure_torch`) and
    seeds it (:func:`~lightning_fedkg.runtime.seed_process`), what
    :func:`~lightning_fedkg.runtime.prepare_process` does for the processes fit does not
    reach. Everything below assumes it has.
    ``trainer.progress_bar: null`` is saved as given and decided for this process's stdout
    for the run.
    """
    with RunDirectory.open(run_dir, cfg):
        # Thread pools are fixed once work starts: set before the runners (torch,
        # Lightning) are imported; the seed comes after those imports, right before the run.
        configure_torch(cfg.trainer, config_table_elements(cfg))
        if cfg.federated.strategy == "none":
            from lightning_fedkg.training import run_kge as run
        else:
            from lightning_fedkg.federated.entry import run_federated as run
        seed_process(cfg.seed)
        return run(resolve_auto_settings(cfg), run_dir)


def evaluate(cfg: ExperimentConfig, ckpt: str | Path) -> dict:
    """Test a committed state of a run of ``cfg`` (a single-KG ``.ckpt``, or a federated
    manifest or run folder); writes nothing. Sets threads and the seed as :func:`fit` does."""
    configure_torch(cfg.trainer, config_table_elements(cfg))
    if cfg.federated.strategy == "none":
        from lightning_fedkg.training import evaluate_kge_checkpoint as test
    else:
        from lightning_fedkg.federated.entry import evaluate_federated_checkpoint as test
    seed_process(cfg.seed)
    return test(cfg, ckpt)


def best_state(run_dir: str | Path, cfg: ExperimentConfig) -> Path:
    """The state ``--from RUN_DIR`` evaluates: a single-KG run's ``best.ckpt``, else the run
    folder (its best set, or a peer run's newest committed state)."""
    run_dir = Path(run_dir)
    return run_dir / "checkpoints" / "best.ckpt" if cfg.federated.strategy == "none" else run_dir
