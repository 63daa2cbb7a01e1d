"""lightning_fedkg.run.fit is the one entry of a run: it opens the run directory and seeds
the process, so the layers below need not (and must not open the directory again)."""

import json

import torch

from lightning_fedkg.config import load_config
from lightning_fedkg.rundir import RunDirectory

TINY_KGE = ["data.name=umls", "model.dim=8", "train.max_epochs=1", "train.eval_every=1", "train.num_negatives=8",
            "train.batch_size=512", "trainer.threads=1", "trainer.progress_bar=false"]


def test_fit_seeds_the_process_whatever_ran_before(tmp_path):
    """Two fits of one config in one process give the same numbers even when the global
    generators were drawn from in between (the model's initial weights come from them):
    fit seeds right before the run."""
    from lightning_fedkg.run import fit

    cfg = load_config(None, TINY_KGE)
    first = fit(cfg, tmp_path / "a")
    torch.rand(1000)  # what a caller may do between runs
    second = fit(cfg, tmp_path / "b")
    assert first == second


def test_fit_opens_the_directory_once_and_saves_the_config_as_given(tmp_path):
    """The config is saved as given (``trainer.progress_bar: null`` stays null; the run
    decides it for its own stdout), and the directory is free again after the run."""
    from lightning_fedkg.run import fit

    cfg = load_config(None, [*TINY_KGE[:-1]])  # progress_bar left at its default (null: auto)
    assert cfg.trainer.progress_bar is None
    metrics = fit(cfg, tmp_path / "run")
    assert load_config(tmp_path / "run" / "config.yaml") == cfg
    assert json.loads((tmp_path / "run" / "metrics.json").read_text()) == metrics
    with RunDirectory.open(tmp_path / "run", cfg) as opened:  # released by fit
        assert opened.resumed
