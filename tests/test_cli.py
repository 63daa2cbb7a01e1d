"""The ``fedkg`` command: fit / test / data stats, run-directory contents, errors."""

import json
from pathlib import Path

import pytest

from lightning_fedkg.cli import main

REPO = Path(__file__).resolve().parents[1]
KGE_CONFIG = str(REPO / "configs" / "kge" / "umls_transe.yaml")
FEDE_CONFIG = str(REPO / "configs" / "fede" / "umls_fede.yaml")

TINY = [
    "data.name=umls",
    "model.dim=16",
    "train.batch_size=512",
    "train.num_negatives=16",
    "train.max_epochs=6",
    "train.lr=0.02",
    "train.eval_every=2",
    "trainer.progress_bar=false",
]


def test_fit_writes_run_directory_and_test_reproduces_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["fit", "--out", str(run), *TINY]) == 0
    out = capsys.readouterr().out
    assert "mrr" in out and "hits@10" in out
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics["test"]) >= {"mrr", "mr", "hits@1", "hits@3", "hits@5", "hits@10"}
    # UMLS has 135 entities: an untrained model's MRR is about 0.05; 6 epochs must beat it well.
    assert 0.3 < metrics["test"]["mrr"] <= 1.0
    assert (run / "config.yaml").is_file()
    assert list((run / "tb").rglob("events.out.tfevents.*"))
    best = run / "checkpoints" / "best.ckpt"
    assert best.is_file() and (run / "checkpoints" / "last.ckpt").is_file()

    assert main(["test", "-c", str(run / "config.yaml"), "--ckpt", str(best)]) == 0
    out = capsys.readouterr().out
    tested = json.loads(out[out.index("{") :])["test"]
    assert tested["mrr"] == pytest.approx(metrics["test"]["mrr"], abs=1e-9)
    assert tested["hits@10"] == pytest.approx(metrics["test"]["hits@10"], abs=1e-9)


def test_misspelled_key_exits_with_valid_keys(capsys):
    assert main(["fit", "model.dimm=3"]) == 2
    err = capsys.readouterr().err
    assert "model.dimm" in err and "Valid keys here: dim, epsilon, gamma, name" in err


def test_malformed_data_file_names_file_and_line(tmp_path, capsys):
    for split in ("train", "valid", "test"):
        (tmp_path / f"{split}.txt").write_text("a\tr\tb\nb\tr\ta\n")
    (tmp_path / "train.txt").write_text("a\tr\tb\nthis line is broken\n")
    assert main(["data", "stats", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "train.txt" in err and ":2" in err


def test_data_stats(capsys):
    assert main(["data", "stats", "umls"]) == 0
    out = capsys.readouterr().out
    assert "135" in out and "5216" in out


@pytest.mark.parametrize(
    "config, override",
    [
        (KGE_CONFIG, "model.dim=-5"),
        (KGE_CONFIG, "train.batch_size=0"),
        (KGE_CONFIG, "train.lr=-0.1"),
        (FEDE_CONFIG, "federated.fraction=1.5"),
        (FEDE_CONFIG, "data.num_clients=0"),
        (FEDE_CONFIG, "federated.rounds=0"),
    ],
)
def test_out_of_range_value_is_an_error_before_the_run_directory_exists(tmp_path, capsys, config, override):
    run = tmp_path / "run"
    assert main(["fit", "-c", config, override, "--out", str(run)]) == 2
    err = capsys.readouterr().err
    key = override.split("=")[0]
    assert err.startswith(f"fedkg: error: {key}: ") and "is out of range (must be" in err
    assert not run.exists()
