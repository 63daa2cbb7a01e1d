"""A federated run killed with SIGKILL mid-run and resumed ends exactly like an uninterrupted one."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lightning_fedkg.federated.checkpoint import latest_manifest, read_manifest

ROUNDS = 6

# Partial participation (2 of 3 clients: the selection RNG matters), a persistent Adam
# (its state must be restored) and per-triple negatives (the datamodule generator matters).
SCRIPT = textwrap.dedent(
    f"""
    import sys, torch
    EXTRA = sys.argv[2:]
    torch.set_num_threads(1)
    from lightning_fedkg.config import load_config
    from lightning_fedkg.run import fit
    cfg = load_config(None, [
        "seed=3", "data.name=umls", "data.num_clients=3", "model.name=transe", "model.dim=16",
        "train.lr=0.05", "train.batch_size=512", "train.num_negatives=16",
        "train.negative_mode=per_triple", "train.corruption=both", "train.reset_optimizer=false",
        "trainer.accelerator=cpu", "trainer.progress_bar=false",
        "federated.strategy=fede", "federated.rounds={ROUNDS}", "federated.local_epochs=1",
        "federated.fraction=0.67", "federated.eval_every=2", "federated.patience=20",
    ] + EXTRA)
    fit(cfg, sys.argv[1])
    """
)


def launch(script: Path, run_dir: Path, extra=()) -> subprocess.Popen:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen(
        [sys.executable, str(script), str(run_dir), *extra], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )


def finish(proc: subprocess.Popen) -> None:
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]


def completed_round(run_dir: Path) -> int:
    last = latest_manifest(run_dir / "checkpoints")
    return 0 if last is None else int(read_manifest(last)["round"])


def kill_after_first_round(proc: subprocess.Popen, run_dir: Path) -> int:
    """SIGKILL ``proc`` once a round is committed in ``run_dir``; returns the last committed round."""
    deadline = time.monotonic() + 240
    while completed_round(run_dir) < 1:
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "no round completed in time"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    return completed_round(run_dir)


#: Secure aggregation with a hidden aggregate: masks and keys come from the OS, fresh at
#: every attempt, yet cancel exactly, and the server's offset sums are resume state.
SECURE = ("federated.secure_aggregation.enabled=true", "federated.secure_aggregation.hide_aggregate=true",
          "federated.federation_key=resume-test-key")


@pytest.mark.parametrize("extra", [(), SECURE], ids=["plain", "secure_hidden"])
@pytest.mark.slow
def test_sigkill_and_resume_reproduces_uninterrupted_run(tmp_path, extra):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"

    # The reference and the run to interrupt are independent: they run side by side.
    uninterrupted = launch(script, reference, extra)
    killed_at = kill_after_first_round(launch(script, interrupted, extra), interrupted)
    assert 1 <= killed_at < ROUNDS and not (interrupted / "metrics.json").exists()
    finish(uninterrupted)

    finish(launch(script, interrupted, extra))

    expected = json.loads((reference / "metrics.json").read_text())
    resumed = json.loads((interrupted / "metrics.json").read_text())
    assert resumed["rounds"] == ROUNDS
    assert resumed.pop("seconds") > 0 and expected.pop("seconds") > 0  # wall time differs, of course
    assert resumed == expected  # every float identical, not merely close
    assert (interrupted / "channel_log.jsonl").read_text() == (reference / "channel_log.jsonl").read_text()
