"""The ``fedkg`` command: fit / test / data stats, run-directory contents, errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_fedkg.cli import format_metrics_table, main
from lightning_fedkg.config import ConfigError, DataConfig, ExperimentConfig, TrainerConfig, show_progress_bar
from lightning_fedkg.preflight import bundled_datasets, check_data_name

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


@pytest.mark.slow
def test_fit_writes_run_directory_and_test_reproduces_it(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["fit", "-c", KGE_CONFIG, "--out", str(run), *TINY]) == 0
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

    assert main(["test", "-c", str(run / "config.yaml"), "--ckpt", str(best), "--json"]) == 0
    tested = json.loads(capsys.readouterr().out)["test"]
    assert tested["mrr"] == pytest.approx(metrics["test"]["mrr"], abs=1e-9)
    assert tested["hits@10"] == pytest.approx(metrics["test"]["hits@10"], abs=1e-9)
    assert main(["test", "--from", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test"]["mrr"] == pytest.approx(metrics["test"]["mrr"], abs=1e-9)
    # Without --json: the table only.
    assert main(["test", "--from", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(" " * 10 + f"{'mrr':>10}") and out.count("\n") == 3 and "{" not in out


def test_misspelled_key_exits_with_valid_keys(capsys):
    assert main(["fit", "-c", KGE_CONFIG, "model.dimm=3"]) == 2
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


def run_fedkg(*args: str, code: str = "", timeout: int = 300) -> subprocess.CompletedProcess:
    """``fedkg ARGS`` in a fresh interpreter with stdout/stderr on pipes (not a terminal);
    ``code`` runs after ``main`` returns or exits, e.g. to inspect ``sys.modules``."""
    script = (
        "import sys\nfrom lightning_fedkg.cli import main\n"
        f"try:\n    status = main({list(args)!r})\nexcept SystemExit as exit:\n    status = exit.code\n"
        f"{code}\nsys.exit(status)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=timeout)


HEAVY = "print('HEAVY', sorted(m for m in ('torch', 'lightning', 'torch_geometric') if m in sys.modules))"


@pytest.mark.parametrize(
    "args", [("--help",), ("--version",), ("fit", "--help"), ("fit",), ("fit", "-c", KGE_CONFIG, "model.dim=-5")],
    ids=["help", "version", "fit-help", "missing-config", "bad-value"],
)
@pytest.mark.slow
def test_help_and_input_errors_do_not_import_torch(args):
    proc = run_fedkg(*args, code=HEAVY)
    assert proc.returncode in (0, 2), proc.stderr
    assert "HEAVY []" in proc.stdout


def test_config_option_is_required(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["fit"])
    assert exit.value.code == 2
    assert "the following arguments are required: -c/--config" in capsys.readouterr().err
    assert main(["test", "--ckpt", "x.ckpt"]) == 2
    assert "needs -c CONFIG and --ckpt PATH, or --from RUN_DIR" in capsys.readouterr().err


@pytest.mark.slow
def test_test_from_a_finished_federated_run_reproduces_it_and_writes_nothing(tmp_path, capsys, one_thread):
    import hashlib

    run = tmp_path / "run"
    args = ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
            "trainer.accelerator=cpu", "federated.strategy=fede", "federated.rounds=2",
            "federated.local_epochs=1", "federated.eval_every=1"]
    assert main(["fit", "-c", KGE_CONFIG, "--out", str(run), *args]) == 0
    metrics = json.loads((run / "metrics.json").read_text())

    def digest():
        return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run.rglob("*")) if p.is_file()}

    before = digest()
    capsys.readouterr()
    assert main(["test", "--from", str(run), "--json"]) == 0
    tested = json.loads(capsys.readouterr().out)
    assert tested["test"] == metrics["test"]
    # The default output is the table of the same metrics, and nothing else.
    assert main(["test", "--from", str(run)]) == 0
    assert capsys.readouterr().out == format_metrics_table(tested) + "\n"
    assert digest() == before


@pytest.mark.slow
def test_piped_single_kg_fit_prints_no_progress_bars_or_tips(tmp_path):
    proc = run_fedkg("fit", "-c", KGE_CONFIG, "model.dim=8", "train.max_epochs=2", "train.eval_every=1",
                     "train.num_negatives=8", "--out", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "it/s" not in output and "Epoch" not in output
    assert "Tip" not in output and "litlogger" not in output and "LeafSpec" not in output
    assert "hits@10" in proc.stdout and len(output) < 2000
    # The saved config keeps "auto", not this process's decision.
    assert "progress_bar: null" in (tmp_path / "run" / "config.yaml").read_text()


def test_progress_bar_auto_follows_the_terminal():
    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    assert show_progress_bar(TrainerConfig(), Stream(True)) is True
    assert show_progress_bar(TrainerConfig(), Stream(False)) is False
    assert show_progress_bar(TrainerConfig(progress_bar=True), Stream(False)) is True
    assert show_progress_bar(TrainerConfig(progress_bar=False), Stream(True)) is False


def test_federated_data_stats_prints_one_client_column(tmp_path, capsys):
    triples = {"train": "a\tr\tb\nb\tr\tc\nc\tr\ta\n", "valid": "a\tr\tc\n", "test": "b\tr\ta\n"}
    for k in range(2):
        (tmp_path / f"client_{k}").mkdir()
        for split, text in triples.items():
            (tmp_path / f"client_{k}" / f"{split}.tsv").write_text(text)
    assert main(["data", "stats", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[1].split()
    assert header == ["client", "entities", "relations", "train", "valid", "test"]
    assert [line.split() for line in lines[2:]] == [["0", "3", "1", "3", "1", "1"], ["1", "3", "1", "3", "1", "1"]]


def _client(mrr: float) -> dict:
    return {"mrr": mrr, "mr": 3.0, "hits@1": 0.1, "hits@3": 0.2, "hits@5": 0.3, "hits@10": 0.4,
            "count": 20, "triples": 10}


def test_federated_table_header_shows_only_present_keys():
    tested = {"test": _client(0.5), "clients": [_client(0.4), _client(0.6)], "strategy": "fede"}
    lines = format_metrics_table(tested).splitlines()
    assert lines[0] == "strategy=fede" and lines[1].split()[:2] == ["client", "#test"]
    assert "None" not in "\n".join(lines)

    fitted = {**tested, "rounds": 12, "best_round": 10, "bytes_sent": 4096}
    lines = format_metrics_table(fitted).splitlines()
    assert lines[0] == "strategy=fede  rounds=12  best_round=10  bytes_sent=4096"
    assert sum("strategy=" in line for line in lines) == 1


def test_single_kg_table_has_every_metric_column():
    table = format_metrics_table({"test": {**_client(0.5), "hits@3": None}})
    header, _, row = table.splitlines()
    assert header.split() == ["mrr", "mr", "hits@1", "hits@3", "hits@5", "hits@10"]
    assert row.split() == ["test", "0.5000", "3.0", "0.1000", "-", "0.3000", "0.4000"]


@pytest.mark.parametrize(
    "text, line, column, reason",
    [
        ("model: name: transe\n", 1, 12, "mapping values are not allowed here"),
        ("seed: 1\nmodel: {name: transe\ntrain:\n  lr: 0.1\n", 3, 6,
         "expected ',' or '}', but got ':' (while parsing a flow mapping that starts at line 2, column 8)"),
        ("model:\n\tname: transe\n", 2, 1,
         "found character '\\t' that cannot start any token (a tab: indent YAML with spaces)"),
        ("# a list, not sections\n- model\n- train\n", 2, 1,
         "the top level must be a mapping of sections (data:, model:, train:, ...), not a list"),
    ],
    ids=["stray-colon", "unclosed-brace", "tab-indent", "top-level-list"],
)
def test_yaml_syntax_error_is_one_line_with_file_line_and_column(tmp_path, capsys, text, line, column, reason):
    config = tmp_path / "bad.yaml"
    config.write_text(text)
    assert main(["fit", "-c", str(config), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err == f"fedkg: error: {config}:{line}:{column}: {reason}\n"
    assert not (tmp_path / "run").exists()


def test_missing_data_path_is_an_error_before_the_run_directory_exists(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["fit", "-c", KGE_CONFIG, "data.name=/no/such/dir", "--out", str(run)]) == 2
    assert capsys.readouterr().err == (
        "fedkg: error: data.name: /no/such/dir is neither a bundled dataset (kinship, nations, umls) "
        "nor an existing path\n")
    assert not run.exists()


def test_data_name_check_accepts_what_the_loaders_accept(tmp_path, monkeypatch):
    from lightning_fedkg.data.kg_io import BUNDLED_DATASETS

    assert bundled_datasets() == sorted(BUNDLED_DATASETS)
    for name in ("umls", "UMLS", str(tmp_path)):
        check_data_name(ExperimentConfig(data=DataConfig(name=name)))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        check_data_name(ExperimentConfig(data=DataConfig(name="umls_typo")))
    assert str(err.value) == (f"data.name: umls_typo is neither a bundled dataset (kinship, nations, umls) "
                              f"nor an existing path (looked in {tmp_path})")


def test_version_prints_the_distribution_version(capsys, monkeypatch):
    from importlib.metadata import PackageNotFoundError, version

    import lightning_fedkg

    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"fedkg {version('lightning-fedkg')}\n"

    # A source checkout that is not installed falls back to the package's __version__.
    def not_installed(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr("importlib.metadata.version", not_installed)
    with pytest.raises(SystemExit) as exit:
        main(["--version"])
    assert exit.value.code == 0
    assert capsys.readouterr().out == f"fedkg {lightning_fedkg.__version__}\n"


def test_fit_help_lists_the_sections_and_the_names_a_config_can_give(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["fit", "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    assert "  model      name, dim, gamma, epsilon, p_norm, relation_dim, orthogonality_margin\n" in out
    assert "federated.<strategy>" in out
    from lightning_fedkg.registry import MODELS, STRATEGIES

    strategies = next(line for line in out.splitlines() if line.startswith("federated.strategy:"))
    assert all(name in strategies for name in STRATEGIES.names()) and "fedlu" in strategies
    assert "transe" in next(line for line in out.splitlines() if line.startswith("model.name:"))
    assert set(MODELS.names()) >= {"transe", "rotate"}


FEDLU_CONFIG = str(REPO / "configs" / "fedlu" / "umls_fedlu.yaml")


@pytest.mark.parametrize("overrides, message", [
    (["data.name=/no/such/folder"], "data.name: /no/such/folder is neither"),
    (["model.name=transx"], "model.name: unknown KGE model 'transx'"),
    (["federated.strategy=fedx"], "federated.strategy: unknown federated strategy 'fedx'"),
    (["federated.roundz=3"], "unknown config key 'federated.roundz'"),
], ids=["data", "model", "strategy", "core-key"])
def test_a_federated_fit_reports_what_it_can_check_without_importing_torch(overrides, message):
    proc = run_fedkg("fit", "-c", FEDLU_CONFIG, *overrides, code=HEAVY)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "HEAVY []" in proc.stdout


def test_a_locked_run_directory_is_reported_before_torch_is_imported(tmp_path):
    import fcntl

    run = tmp_path / "run"
    run.mkdir()
    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another process's lock, as the child sees it
    try:
        proc = run_fedkg("fit", "-c", FEDLU_CONFIG, "--out", str(run), code=HEAVY)
    finally:
        os.close(fd)
    assert proc.returncode == 2 and "another fedkg process is using" in proc.stderr, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert sorted(p.name for p in run.iterdir()) == [".lock"]  # nothing written
