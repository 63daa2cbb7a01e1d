"""Run directories: locked against a second process, checked before any file is written."""

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_fedkg.cli import main
from lightning_fedkg.config import ConfigError, load_config, save_config
from lightning_fedkg.rundir import RunDirectory, RunLockedError, check_resumable, holds_run_output

REPO = Path(__file__).resolve().parents[1]
FEDE_CONFIG = REPO / "configs" / "fede" / "umls_fede.yaml"

# Opens the run directory given as argv[1], says so, and holds it until stdin closes.
HOLDER = textwrap.dedent(
    """
    import sys
    from lightning_fedkg.config import load_config
    from lightning_fedkg.rundir import RunDirectory
    with RunDirectory.open(sys.argv[1], load_config(None, [])):
        print("locked", flush=True)
        sys.stdin.readline()
    """
)


def start_holder(run_dir: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run_dir)], env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    line = proc.stdout.readline()
    assert line.strip() == "locked", proc.stderr.read()
    return proc


def release(proc: subprocess.Popen) -> str:
    _, err = proc.communicate(input="\n", timeout=60)
    return err


def snapshot(run_dir: Path) -> dict[str, str]:
    """Every file under ``run_dir`` with the SHA-256 of its bytes."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(run_dir.rglob("*")) if p.is_file()
    }


def fake_federated_run(run_dir: Path) -> None:
    """A run directory as a finished FedE run leaves it (the CLI only looks at config.yaml)."""
    with RunDirectory.open(run_dir, load_config(FEDE_CONFIG)):
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "last.pt").write_bytes(os.urandom(256))
        (run_dir / "metrics.json").write_text('{"test": {"mrr": 0.5}}')


@pytest.mark.slow
def test_rejected_single_kg_fit_leaves_every_file_byte_identical(tmp_path, capsys):
    run = tmp_path / "run"
    tiny = ["model.dim=8", "train.max_epochs=2", "train.eval_every=1", "train.num_negatives=8",
            "trainer.progress_bar=false"]
    config = str(REPO / "configs" / "kge" / "umls_transe.yaml")
    assert main(["fit", "-c", config, *tiny, "--out", str(run)]) == 0
    before = snapshot(run)
    assert {"config.yaml", "metrics.json", "checkpoints/last.ckpt"} <= set(before)
    capsys.readouterr()

    assert main(["fit", "-c", config, *tiny, "model.dim=32", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fedkg: error: {run} holds a run with other settings (model.dim: 8 -> 32)")
    assert "--out" in err and "resume=False" not in err
    assert snapshot(run) == before


def test_rejected_federated_fit_leaves_every_file_byte_identical(tmp_path, capsys):
    run = tmp_path / "fede"
    fake_federated_run(run)
    before = snapshot(run)
    assert main(["fit", "-c", str(FEDE_CONFIG), "model.dim=32", "train.lr=0.5", "--out", str(run)]) == 2
    err = capsys.readouterr().err
    assert "model.dim: 64 -> 32, train.lr: 0.01 -> 0.5" in err
    assert snapshot(run) == before


def test_resume_free_change_is_accepted_and_saved(tmp_path):
    run = tmp_path / "fede"
    fake_federated_run(run)
    cfg = load_config(FEDE_CONFIG, ["federated.rounds=7", "federated.patience=2", "name=renamed"])
    with RunDirectory.open(run, cfg) as opened:
        assert opened.resumed and opened.config_path == run / "config.yaml"
    saved = load_config(run / "config.yaml")
    assert (saved.federated.rounds, saved.federated.patience, saved.name) == (7, 2, "renamed")
    assert not list(run.glob(".config.yaml.tmp*"))


def test_new_directory_is_created_and_not_resumed(tmp_path):
    cfg = load_config(FEDE_CONFIG)
    with RunDirectory.open(tmp_path / "a" / "b", cfg) as opened:
        assert not opened.resumed
    assert load_config(tmp_path / "a" / "b" / "config.yaml") == cfg


@pytest.mark.slow
def test_second_process_gets_a_clear_error(tmp_path, capsys):
    run = tmp_path / "run"
    holder = start_holder(run)
    try:
        before = snapshot(run)
        assert main(["fit", "-c", str(FEDE_CONFIG), "--out", str(run)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fedkg: error: another fedkg process is using {run}")
        with pytest.raises(RunLockedError):
            with RunDirectory.open(run, load_config(None)):
                pass
        assert snapshot(run) == before
    finally:
        assert release(holder) == ""
    # The holder has exited: its lock went with it.
    with RunDirectory.open(run, load_config(None)) as opened:
        assert opened.resumed


def test_a_second_open_in_the_same_process_is_refused_and_writes_nothing(tmp_path):
    """Only run.fit opens a run directory: an open inside an open of the same folder (in
    this process) is refused as another process's would be, and changes no file."""
    run = tmp_path / "run"
    with RunDirectory.open(run, load_config(None)):
        before = snapshot(run)
        with pytest.raises(RunLockedError, match="another fedkg process is using"):
            with RunDirectory.open(run, load_config(None, ["model.dim=8"])):
                pass
        assert snapshot(run) == before
    with RunDirectory.open(run, load_config(None)) as opened:  # released by the outer block
        assert opened.resumed


def test_unreadable_saved_config_is_refused(tmp_path):
    (tmp_path / "config.yaml").write_text("model:\n  dimm: 3\n")
    with pytest.raises(ConfigError, match=r"config\.yaml cannot be read .*dimm"):
        check_resumable(tmp_path, load_config(None))
    assert (tmp_path / "config.yaml").read_text() == "model:\n  dimm: 3\n"


def test_save_config_replaces_the_file_whole(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("old")
    save_config(load_config(None, ["model.dim=3"]), path)
    assert load_config(path).model.dim == 3
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]


def test_config_yaml_alone_is_a_failed_start_replaced_by_other_settings(tmp_path, caplog):
    run = tmp_path / "run"
    with RunDirectory.open(run, load_config(FEDE_CONFIG)):
        (run / "checkpoints").mkdir()  # an empty folder holds nothing to keep
    assert not holds_run_output(run)
    cfg = load_config(FEDE_CONFIG, ["model.dim=32"])
    with caplog.at_level("INFO", logger="lightning_fedkg"):
        with RunDirectory.open(run, cfg) as opened:
            assert not opened.resumed
    assert load_config(run / "config.yaml") == cfg
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", f"{run} holds only the config.yaml of a run that stopped before producing anything; "
                 "replacing it with the new settings (model.dim: 64 -> 32)")]


@pytest.mark.parametrize("output", ["checkpoints/client_0/round_0001.pt", "metrics.json",
                                    "tb/server/events.out.tfevents.1", "channel_log.jsonl"])
def test_any_run_output_keeps_the_saved_settings(tmp_path, output):
    run = tmp_path / "run"
    with RunDirectory.open(run, load_config(FEDE_CONFIG)):
        (run / output).parent.mkdir(parents=True, exist_ok=True)
        (run / output).write_bytes(b"x")
    assert holds_run_output(run)
    before = snapshot(run)
    with pytest.raises(ConfigError, match=r"holds a run with other settings \(model\.dim: 64 -> 32\)"):
        with RunDirectory.open(run, load_config(FEDE_CONFIG, ["model.dim=32"])):
            pass
    assert snapshot(run) == before


@pytest.mark.slow
def test_corrected_fit_runs_where_a_start_failed_on_bad_data(tmp_path, capsys, caplog):
    bad = tmp_path / "kg"
    bad.mkdir()
    for split in ("train", "valid", "test"):
        (bad / f"{split}.txt").write_text("a\tr\tb\nthis line is broken\n")
    run = tmp_path / "run"
    config = str(REPO / "configs" / "kge" / "umls_transe.yaml")
    tiny = ["model.dim=8", "train.max_epochs=1", "train.eval_every=1", "train.num_negatives=8",
            "trainer.progress_bar=false", "--out", str(run)]
    assert main(["fit", "-c", config, f"data.name={bad}", *tiny]) == 2
    assert "train.txt" in capsys.readouterr().err
    assert (run / "config.yaml").is_file()
    with caplog.at_level("INFO", logger="lightning_fedkg"):
        assert main(["fit", "-c", config, "data.name=umls", *tiny]) == 0
    assert f"{run} holds only the config.yaml of a run that stopped before producing anything" in caplog.text
    assert f"data.name: '{bad}' -> 'umls'" in caplog.text
    assert load_config(run / "config.yaml").data.name == "umls" and (run / "metrics.json").is_file()
