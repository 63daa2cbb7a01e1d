"""Damaged single-KG checkpoints end with a message naming the file, not a pickle traceback."""

import shutil
from pathlib import Path

import pytest

from lightning_fedkg.cli import main

REPO = Path(__file__).resolve().parents[1]
KGE_CONFIG = str(REPO / "configs" / "kge" / "umls_transe.yaml")
TINY = ["model.dim=8", "train.max_epochs=2", "train.eval_every=1", "train.num_negatives=8",
        "trainer.progress_bar=false"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("kge") / "run"
    assert main(["fit", "-c", KGE_CONFIG, *TINY, "--out", str(run)]) == 0
    return run


def damaged_copy(run: Path, tmp_path: Path, name: str, keep: float) -> tuple[Path, Path]:
    """A copy of ``run`` whose ``checkpoints/<name>`` keeps only its first ``keep`` fraction."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    ckpt = copy / "checkpoints" / name
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: int(len(data) * keep)])
    return copy, ckpt


@pytest.mark.parametrize("keep", [0.0, 0.5, 0.99], ids=["empty", "half", "tail-missing"])
def test_fit_on_truncated_last_checkpoint_says_what_to_delete(finished_run, tmp_path, capsys, keep):
    run, ckpt = damaged_copy(finished_run, tmp_path, "last.ckpt", keep)
    capsys.readouterr()
    assert main(["fit", "-c", KGE_CONFIG, *TINY, "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedkg: error: checkpoint {ckpt} cannot be read (")
    assert "Delete it to start this run over" in err
    assert "Traceback" not in err


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_fit_after_deleting_the_damaged_checkpoint_starts_over(finished_run, tmp_path, capsys):
    run, ckpt = damaged_copy(finished_run, tmp_path, "last.ckpt", 0.5)
    ckpt.unlink()
    assert main(["fit", "-c", KGE_CONFIG, *TINY, "--out", str(run)]) == 0
    assert ckpt.is_file()


def test_test_command_on_truncated_checkpoint_is_an_error(finished_run, tmp_path, capsys):
    run, ckpt = damaged_copy(finished_run, tmp_path, "best.ckpt", 0.5)
    capsys.readouterr()
    assert main(["test", "-c", str(run / "config.yaml"), "--ckpt", str(ckpt)]) == 2
    assert capsys.readouterr().err.startswith(f"fedkg: error: checkpoint {ckpt} cannot be read")
