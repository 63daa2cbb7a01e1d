"""Damaged checkpoints (single-KG and federated) end with a message naming the file, not a
pickle or zip-reader traceback."""

import shutil
from pathlib import Path
from typing import Callable

import pytest

from lightning_fedkg.cli import main

REPO = Path(__file__).resolve().parents[1]
KGE_CONFIG = str(REPO / "configs" / "kge" / "umls_transe.yaml")
TINY = ["model.dim=8", "train.max_epochs=2", "train.eval_every=1", "train.num_negatives=8",
        "trainer.progress_bar=false"]
FEDE_CONFIG = str(REPO / "configs" / "fede" / "umls_fede.yaml")
FEDE_TINY = ["federated.rounds=2", "federated.eval_every=1", "model.dim=8", "train.batch_size=512",
             "trainer.threads=1", "trainer.progress_bar=false"]

#: How a crash or a full disk leaves a file: the size it is cut to, from its full size. Each
#: fails in another layer of torch.load (unpickler, zip directory, zip records).
CUTS: dict[str, Callable[[int], int]] = {
    "empty": lambda n: 0,
    "100-bytes": lambda n: 100,
    "half": lambda n: n // 2,
    "10-bytes-short": lambda n: n - 10,
}
cuts = pytest.mark.parametrize("cut", list(CUTS.values()), ids=list(CUTS))


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("kge") / "run"
    assert main(["fit", "-c", KGE_CONFIG, *TINY, "--out", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def finished_federated_run(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("fede") / "run"
    assert main(["fit", "-c", FEDE_CONFIG, *FEDE_TINY, "--out", str(run)]) == 0
    return run


def damaged_copy(run: Path, tmp_path: Path, name: str, cut: Callable[[int], int]) -> tuple[Path, Path]:
    """A copy of ``run`` whose ``checkpoints/<name>`` keeps only its first ``cut(size)`` bytes."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    ckpt = copy / "checkpoints" / name
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: cut(len(data))])
    return copy, ckpt


def one_line_error(capsys) -> str:
    """stderr of the command just run, checked to be a single ``fedkg: error:`` line."""
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    return err


@cuts
@pytest.mark.slow
def test_fit_on_truncated_last_checkpoint_says_what_to_delete(finished_run, tmp_path, capsys, cut):
    run, ckpt = damaged_copy(finished_run, tmp_path, "last.ckpt", cut)
    capsys.readouterr()
    assert main(["fit", "-c", KGE_CONFIG, *TINY, "--out", str(run)]) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"fedkg: error: checkpoint {ckpt} cannot be read (")
    assert err.endswith("; the file is damaged, e.g. cut short by a crash or a full disk. "
                        "Delete it to start this run over (fedkg fit starts afresh without it).\n")


@pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty")
def test_fit_after_deleting_the_damaged_checkpoint_starts_over(finished_run, tmp_path, capsys):
    run, ckpt = damaged_copy(finished_run, tmp_path, "last.ckpt", CUTS["half"])
    ckpt.unlink()
    assert main(["fit", "-c", KGE_CONFIG, *TINY, "--out", str(run)]) == 0
    assert ckpt.is_file()


@cuts
def test_test_command_on_truncated_checkpoint_is_an_error(finished_run, tmp_path, capsys, cut):
    run, ckpt = damaged_copy(finished_run, tmp_path, "best.ckpt", cut)
    capsys.readouterr()
    assert main(["test", "-c", str(run / "config.yaml"), "--ckpt", str(ckpt)]) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"fedkg: error: checkpoint {ckpt} cannot be read (")
    assert err.endswith("Evaluate another checkpoint (e.g. the run's best.ckpt or last.ckpt).\n")


@cuts
@pytest.mark.slow
def test_federated_fit_on_truncated_round_file_names_it_and_the_manifest_to_delete(
        finished_federated_run, tmp_path, capsys, cut):
    run, ckpt = damaged_copy(finished_federated_run, tmp_path, "client_1/round_0002.pt", cut)
    capsys.readouterr()
    assert main(["fit", "-c", FEDE_CONFIG, *FEDE_TINY, "--out", str(run)]) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"fedkg: error: checkpoint file {ckpt} is truncated or corrupt (")
    assert err.endswith(f"); to resume from the previous round instead, delete {run / 'checkpoints' / 'round_0002.json'} "
                        "(then round_0001.json is the newest)\n")


@cuts
def test_federated_test_from_run_on_truncated_best_file_names_it(finished_federated_run, tmp_path, capsys, cut):
    run, ckpt = damaged_copy(finished_federated_run, tmp_path, "client_1/best.pt", cut)
    capsys.readouterr()
    assert main(["test", "--from", str(run)]) == 2
    err = one_line_error(capsys)
    assert err.startswith(f"fedkg: error: checkpoint file {ckpt} is truncated or corrupt (")
    assert err.endswith(")\n")
