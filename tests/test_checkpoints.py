"""Per-party checkpoints: a corrupt file is named, the previous round stays resumable,
TensorBoard steps continue after a resume, one event file per party and process."""

import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from lightning_fedkg.config import load_config
from lightning_fedkg.federated.checkpoint import CheckpointError, latest_manifest
from lightning_fedkg.federated.round_loop import EarlyStopping
from lightning_fedkg.run import fit


def tiny(rounds: int):
    return load_config(None, [
        "data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
        "trainer.accelerator=cpu", "trainer.progress_bar=false", "federated.strategy=fede",
        f"federated.rounds={rounds}", "federated.local_epochs=1", "federated.eval_every=1",
        "federated.patience=50",
    ])


def steps(run_dir, party, tag):
    acc = EventAccumulator(str(run_dir / "tb" / party))
    acc.Reload()
    return [e.step for e in acc.Scalars(tag)]


@pytest.mark.slow
def test_corrupt_party_file_is_named_and_the_previous_round_resumes(tmp_path, one_thread):
    fit(tiny(3), tmp_path)
    assert [p.name for p in sorted((tmp_path / "checkpoints").glob("round_*.json"))] == [
        "round_0002.json", "round_0003.json"]  # the two newest rounds are kept
    assert len(list((tmp_path / "tb" / "client_0").iterdir())) == 1  # one event file per process
    broken = tmp_path / "checkpoints" / "client_1" / "round_0003.pt"
    broken.write_bytes(broken.read_bytes()[:100])
    with pytest.raises(CheckpointError) as err:
        fit(tiny(4), tmp_path)
    assert str(broken) in str(err.value) and "round_0003.json" in str(err.value)
    (tmp_path / "checkpoints" / "round_0003.json").unlink()
    assert latest_manifest(tmp_path / "checkpoints").name == "round_0002.json"
    # TensorBoard reads a run's event files in file-name order, and names carry the creation
    # second (then pid and a per-process counter): a resume within the same second of the
    # first run in this process could sort before it. A real resume is a later process.
    time.sleep(1.1)
    metrics = fit(tiny(4), tmp_path)
    assert metrics["rounds"] == 4
    # rounds 3 and 4 were (re)done after the resume; the server axis has each round once
    assert steps(tmp_path, "server", "comm/bytes") == [1, 2, 3, 4]
    assert steps(tmp_path, "client_0", "train/loss") == [1, 2, 3, 4]
    acc = EventAccumulator(str(tmp_path / "tb" / "server"))
    acc.Reload()
    # the server's running total ends at what metrics.json reports (test downloads included)
    assert acc.Scalars("comm/bytes_total")[-1].value == metrics["bytes_sent"]
    assert acc.Scalars("comm/alignment_bytes")[0].value == metrics["alignment_bytes"] > 0


def test_nan_is_never_a_new_best():
    stopper = EarlyStopping(patience=2)
    assert stopper.update(0.3, 1)
    assert not stopper.update(float("nan"), 2)
    assert stopper.best_round == 1 and stopper.bad_evaluations == 1
