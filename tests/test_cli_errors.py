"""A new user's list (issue 34, item 6): bad inputs end in one clear line and exit 2, Ctrl-C
says how to resume, the documented commands work as written, an unfinished run says so."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_fedkg.cli import main
from lightning_fedkg.config import load_config, save_config

REPO = Path(__file__).resolve().parents[1]
KGE_CONFIG = str(REPO / "configs" / "kge" / "umls_transe.yaml")
FEDE_CONFIG = str(REPO / "configs" / "fede" / "umls_fede.yaml")
FKGE_CONFIG = str(REPO / "configs" / "fkge" / "umls_fkge.yaml")
#: Keeps a run that should not have started (on code without the checks) short.
TINY_KGE = ["model.dim=8", "train.max_epochs=1", "train.num_negatives=8", "trainer.threads=1",
            "trainer.progress_bar=false"]
#: The smallest federated run that trains and evaluates every round.
TINY_FED = ["model.dim=16", "train.num_negatives=8", "train.batch_size=512", "trainer.threads=1",
            "trainer.progress_bar=false", "federated.eval_every=1", "federated.patience=1000"]


def error_line(capsys) -> str:
    """The one error line of the command just run (INFO log lines may come before it)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if not line.startswith("INFO ")]
    assert len(lines) == 1 and lines[0].startswith("fedkg: error: "), err
    return lines[0]


def test_out_naming_a_file_is_an_error_and_leaves_it_alone(tmp_path, capsys):
    afile = tmp_path / "notes.txt"
    afile.write_text("mine")
    assert main(["fit", "-c", KGE_CONFIG, "--out", str(afile)]) == 2
    assert f"run directory {afile} is a file, not a folder" in error_line(capsys)
    assert main(["fit", "-c", KGE_CONFIG, "--out", str(afile / "run")]) == 2
    assert f"{afile} is a file" in error_line(capsys)
    assert afile.read_text() == "mine" and sorted(tmp_path.iterdir()) == [afile]


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank", "comment"])
def test_an_empty_config_file_is_an_error_naming_it(tmp_path, capsys, text):
    config = tmp_path / "exp.yaml"
    config.write_text(text)
    assert main(["fit", "-c", str(config), "--out", str(tmp_path / "run"), *TINY_KGE]) == 2
    assert f"{config}: the config file is empty" in error_line(capsys)
    assert not (tmp_path / "run").exists()
    # An explicit empty mapping is a deliberate "every default": accepted.
    config.write_text("{}\n")
    assert load_config(config, core_only=True).data.name == "umls"


def test_a_config_directory_is_named_as_one_with_its_yaml_files(capsys):
    assert main(["fit", "-c", str(REPO / "configs" / "fkge")]) == 2
    line = error_line(capsys)
    assert "configs/fkge is a directory, not a YAML file" in line and "umls_fkge.yaml" in line
    assert "not found" not in line


def test_openke_format_on_a_bundled_kg_is_refused_not_ignored(tmp_path, capsys):
    from lightning_fedkg.data import KGFormatError, load_kg

    run = tmp_path / "run"
    assert main(["fit", "-c", KGE_CONFIG, "--out", str(run), "data.format=openke", *TINY_KGE]) == 2
    line = error_line(capsys)
    assert "data.format=openke" in line and "'umls' is stored as named triples" in line and "auto or triples" in line
    assert not run.exists()
    with pytest.raises(KGFormatError, match="stored as named triples"):
        load_kg("umls", fmt="openke")
    assert load_kg("umls", fmt="triples").num_entities == 135  # what the bundled files are


@pytest.mark.parametrize("top", ["0", "-3"])
def test_query_top_below_one_is_an_error_with_the_valid_range(tmp_path, capsys, top):
    assert main(["query", "--from", str(tmp_path), "(e:a, (r:x))", "--top", top]) == 2
    assert f"--top: {top} answers; give a whole number of at least 1" in error_line(capsys)


@pytest.mark.parametrize("query, expected", [
    ("(aspirin, (r:treats))", "expected an entity 'e:NAME' or a sub-query"),
    ("e:aspirin", "expected a query ('(e:NAME, (r:REL, ...))', 'i(Q, Q, ...)' or 'u(Q, Q, ...)')"),
])
def test_a_query_without_its_entity_says_what_is_expected(query, expected):
    from lightning_fedkg.methods.fedcqa.query_text import QuerySyntaxError, parse_query

    with pytest.raises(QuerySyntaxError) as err:
        parse_query(query)
    assert expected in str(err.value) and "expected '('" not in str(err.value)
    # The module docstring's example of each structure parses as that structure.
    assert parse_query("(u((e:a, (r:x)), (e:b, (r:y))), (r:z))")[0] == "up"


def test_unlearn_from_an_fkge_run_says_it_is_not_supported(tmp_path, capsys):
    run = tmp_path / "fkge_run"
    run.mkdir()
    save_config(load_config(FKGE_CONFIG), run / "config.yaml")  # what every run directory starts with
    (run / "checkpoints").mkdir()
    for event in (931, 932):  # a peer run's manifests: the old message said none existed
        (run / "checkpoints" / f"round_{event:04d}.json").write_text("{}")
    assert main(["unlearn", "--from", str(run), "--out", str(tmp_path / "out")]) == 2
    line = error_line(capsys)
    assert "is an FKGE run" in line and "unlearning does not support" in line and "fedlu, fede" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_readme_unlearn_command_works_on_a_bundled_kg(tmp_path, capsys):
    # docs/usage.md, CLI reference: `fedkg unlearn --from RUN_DIR` (no -c, no unlearn.forget); the
    # bundled UMLS has no unlearn split, so the default (auto) samples.
    source = tmp_path / "fede"
    assert main(["fit", "-c", FEDE_CONFIG, "--out", str(source), *TINY_FED, "federated.rounds=1"]) == 0
    capsys.readouterr()
    # The budget overrides only keep the test short; what to forget is not given.
    assert main(["unlearn", "--from", str(source), "unlearn.retrain=false", "unlearn.interference_epochs=1",
                 "unlearn.decay_epochs=1", "unlearn.propagate_rounds=0"]) == 0
    out = source.with_name("fede-unlearn")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["forget"]["mode"] == "sample" and metrics["forget"]["triples"] > 0
    assert "forgotten triples, ranked by every model above" in capsys.readouterr().out
    # A finished run tests as one: no "unfinished" note, in the table or the JSON.
    assert main(["test", "--from", str(source), "--json"]) == 0
    captured = capsys.readouterr()
    assert "unfinished" not in json.loads(captured.out) and "unfinished" not in captured.err


def as_from_a_terminal() -> None:
    """In the child before exec: SIGINT neither ignored nor blocked, as a shell starts a
    command. Under ``pytest -n 2`` the worker that runs this file had SIGINT ignored or
    blocked below Python by then (Python's own handler was unchanged, checked): the child
    inherited that and Ctrl-C did nothing (the run went on; seen in 2 of 2 full runs)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_says_how_to_resume_and_test_from_says_unfinished(tmp_path, capsys):
    run = tmp_path / "run dir"  # a space: the printed command must quote it
    overrides = [*TINY_FED, "federated.rounds=1000"]
    # PYTHONFAULTHANDLER: a child that does not exit prints every thread's stack on SIGABRT
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "lightning_fedkg.cli", "fit", "-c", FEDE_CONFIG, "--out", str(run),
                             *overrides], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=as_from_a_terminal)
    try:
        deadline = time.monotonic() + 240
        # any committed round from the second on: only the last two are kept and a round takes
        # ~0.1 s, so the file of one round can come and go between two looks (seen: a missed round 2)
        while not any(int(m.group(1)) >= 2 for m in (re.search(r"round_(\d+)\.json$", p.name)
                                                    for p in (run / "checkpoints").glob("round_*.json")) if m):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail("no second round committed:\n" + proc.communicate()[1][-3000:])
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:  # seen once in a loaded full run, after the message was printed
            proc.send_signal(signal.SIGABRT)
            pytest.fail("still running 120 s after Ctrl-C; its stacks:\n" + proc.communicate(timeout=60)[1][-8000:])
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err
    line = err.strip().splitlines()[-1]
    assert line.startswith("fedkg: interrupted; ") and "resumes from it: " in line
    command = shlex.split(line.split("resumes from it: ", 1)[1])
    assert command == ["fedkg", "fit", "-c", FEDE_CONFIG, "--out", str(run), *overrides]
    assert not (run / "metrics.json").exists()

    stopped = max(int(re.search(r"round_(\d+)", p.name).group(1)) for p in (run / "checkpoints").glob("round_*.json"))
    assert main(["test", "--from", str(run)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"unfinished run: {run} stopped after round {stopped} of 1000 (no metrics.json)")
    assert main(["test", "--from", str(run), "--json"]) == 0
    captured = capsys.readouterr()
    record = json.loads(captured.out)["unfinished"]
    assert record["unit"] == "round" and record["stopped_after"] == stopped and record["of"] == 1000
    assert 1 <= record["best"] <= stopped and "unfinished run" in captured.err

    # The printed command resumes the run (here with a budget that ends it one round later).
    assert main([*command[1:], f"federated.rounds={stopped + 1}"]) == 0
    assert json.loads((run / "metrics.json").read_text())["rounds"] == stopped + 1


@pytest.mark.slow
def test_flower_logs_have_no_colour_codes_when_stderr_is_not_a_terminal():
    pytest.importorskip("flwr")  # the flower extra (a fresh clone's [test] has none)
    # A process that runs our Flower code (here: building the ClientApp, as every simulation
    # and deployment process does), its stderr a pipe, then one of Flower's deprecation warnings.
    script = ("from lightning_fedkg.backends.flower.client import make_client_app\n"
              "from flwr.common.logger import warn_deprecated_feature\n"
              "make_client_app()\nwarn_deprecated_feature('the old thing')\n")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "the old thing" in proc.stderr and "WARNING" in proc.stderr
    assert "\033[" not in proc.stderr


@pytest.mark.parametrize("overrides", [["model.dimm=3"], ["model.name=rotate", "model.p_normm=1"]],
                         ids=["transe", "rotate"])
@pytest.mark.slow
def test_a_misspelled_model_key_of_a_builtin_model_is_reported_before_torch(overrides):
    # docs/usage.md's own example of a misspelled key: reported without importing torch (seconds).
    script = ("import sys\nfrom lightning_fedkg.cli import main\n"
              f"status = main(['fit', '-c', {FEDE_CONFIG!r}, *{overrides!r}])\n"
              "print('HEAVY', sorted(m for m in ('torch', 'lightning', 'torch_geometric') if m in sys.modules))\n"
              "sys.exit(status)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    key = overrides[-1].split("=")[0]
    assert proc.returncode == 2 and f"unknown config key '{key}'. Valid keys here: dim," in proc.stderr, proc.stderr
    assert "HEAVY []" in proc.stdout


@pytest.mark.parametrize("words", [
    ["fit", "-c", "C", "a.b=1", "--out", "D", "c.d=2"],
    ["fit", "a.b=1", "-c", "C", "c.d=2", "--out", "D"],
    ["test", "-c", "C", "a.b=1", "--ckpt", "K", "c.d=2", "--json"],
    ["test", "--from", "R", "a.b=1", "--json", "c.d=2"],
    ["unlearn", "a.b=1", "--from", "R", "c.d=2", "--out", "D"],
    ["flower", "up", "-c", "C", "a.b=1", "--out", "D", "c.d=2", "--tls"],
    ["flower", "split", "-c", "C", "a.b=1", "--out", "D", "c.d=2"],
    ["flower", "policy", "-c", "C", "a.b=1", "--out", "D", "c.d=2"],
], ids=lambda words: "-".join(w for w in words[:2] if not w.startswith("-") and "=" not in w))
def test_overrides_may_come_before_between_and_after_options(words):
    """docs/methods/fkge.md put overrides on both sides of ``--out``; the old parser took only
    the first run of them and refused the rest ("unrecognized arguments: c.d=2", exit 2)."""
    from lightning_fedkg.cli import build_parser

    args = build_parser().parse_args(words)
    assert args.overrides == ["a.b=1", "c.d=2"]  # in the order given: a later one wins
    assert getattr(args, "out", "D") == "D"


def test_data_stats_takes_overrides_on_both_sides_of_its_options():
    from lightning_fedkg.cli import build_parser

    args = build_parser().parse_args(["data", "stats", "-c", "C", "a.b=1", "--workers", "2", "c.d=2"])
    assert args.target == ["a.b=1", "c.d=2"] and args.workers == 2


def test_an_unknown_option_is_still_refused(capsys):
    from lightning_fedkg.cli import build_parser

    with pytest.raises(SystemExit) as exit:
        build_parser().parse_args(["fit", "-c", "C", "a.b=1", "--bogus", "c.d=2"])
    assert exit.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_the_resume_hint_is_in_the_usage_order(tmp_path, monkeypatch, capsys):
    """The hint ``fit`` prints on Ctrl-C: options, then the overrides, as ``fedkg fit --help``'s
    usage line gives them (the old usage in docs/usage.md showed the overrides before --out,
    the hint after it)."""
    from lightning_fedkg import cli

    def interrupt(cfg, run_dir):
        raise KeyboardInterrupt

    monkeypatch.setattr("lightning_fedkg.run.fit", interrupt)
    run = tmp_path / "run"
    assert main(["fit", "model.dim=8", "-c", KGE_CONFIG, "--out", str(run), "train.max_epochs=1"]) == 130
    hint = shlex.split(capsys.readouterr().err.strip().splitlines()[-1].split("resumes from it: ", 1)[1])
    assert hint == ["fedkg", "fit", "-c", KGE_CONFIG, "--out", str(run), "model.dim=8", "train.max_epochs=1"]
    assert cli.build_parser().parse_args(hint[1:]).overrides == ["model.dim=8", "train.max_epochs=1"]
    usage = cli.build_parser()._subparsers._group_actions[0].choices["fit"].format_usage()
    assert usage.index("--out") < usage.index("overrides")
    assert "fedkg fit  -c CONFIG [--out DIR] [key=value ...]" in (REPO / "docs" / "usage.md").read_text()


def test_more_clients_than_relations_is_an_error_before_loading(tmp_path, capsys):
    """``data.num_clients=1000`` on UMLS (46 relations, split by relation): the old code loaded
    torch and the KG (about 50 s on a busy machine) and then raised a ValueError traceback
    ("46 relations cannot be split among 1000 clients"), exit 1."""
    run = tmp_path / "run"
    assert main(["fit", "-c", FEDE_CONFIG, "--out", str(run), "data.num_clients=1000"]) == 2
    line = error_line(capsys)
    assert "data.num_clients=1000: umls has 46 relations" in line and "at most 46" in line
    assert not run.exists()
    # A folder of named triples: its train file is read, up to as many relations as clients.
    folder = tmp_path / "kg"
    folder.mkdir()
    for split in ("train", "valid", "test"):
        (folder / f"{split}.txt").write_text("a\tr1\tb\nb\tr2\tc\nc\tr1\ta\n")
    assert main(["fit", "-c", FEDE_CONFIG, "--out", str(run), f"data.name={folder}", "data.num_clients=3"]) == 2
    assert f"data.num_clients=3: {folder} has 2 relations" in error_line(capsys)
    # The same count from an OpenKE folder's relation2id.txt header.
    (folder / "entity2id.txt").write_text("3\na\t0\nb\t1\nc\t2\n")
    (folder / "relation2id.txt").write_text("2\nr1\t0\nr2\t1\n")
    assert main(["flower", "split", "-c", FEDE_CONFIG, "--out", str(tmp_path / "split"), f"data.name={folder}",
                 "data.num_clients=5", "data.partition=clustered"]) == 2
    assert "data.num_clients=5" in error_line(capsys) and not (tmp_path / "split").exists()


@pytest.mark.slow
def test_more_clients_than_relations_is_reported_before_torch():
    script = ("import sys\nfrom lightning_fedkg.cli import main\n"
              f"status = main(['fit', '-c', {FEDE_CONFIG!r}, 'data.num_clients=47'])\n"
              "print('HEAVY', sorted(m for m in ('torch', 'lightning', 'torch_geometric') if m in sys.modules))\n"
              "sys.exit(status)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "data.num_clients=47: umls has 46 relations" in proc.stderr, proc.stderr
    assert "HEAVY []" in proc.stdout


@pytest.mark.parametrize("partition", ["relation", "clustered", "random"])
def test_a_split_with_too_many_clients_raises_a_config_error_naming_the_key(partition):
    """The partitioners themselves (a federated folder's loaders, the Python API, what the
    early check cannot read cheaply): the old code raised ValueError ("46 relations cannot
    be split among 1000 clients"; random: "resample: only 0 of 2 eligible valid/test
    triples"), which ``fedkg`` printed as a traceback."""
    from lightning_fedkg.config import ConfigError
    from lightning_fedkg.data.partition import PARTITIONERS
    from lightning_fedkg.data import load_kg

    if partition == "clustered":
        pytest.importorskip("sklearn")
    with pytest.raises(ConfigError, match=r"data\.num_clients=1000: ") as err:
        PARTITIONERS[partition](load_kg("umls"), 1000)
    if partition != "random":
        assert "umls has 46 relations" in str(err.value) and "at most 46" in str(err.value)
    else:
        assert "use fewer clients" in str(err.value)


@pytest.mark.slow
def test_test_from_refuses_an_override_that_changes_the_trained_model(tiny_fede_run, capsys):
    """``fedkg test --from RUN model.dim=32``: the old code loaded the run's weights into a
    model of the new shape and died in ``load_state_dict`` (a RuntimeError traceback, exit 1)."""
    metrics, run = tiny_fede_run
    assert main(["test", "--from", str(run), "model.dim=32"]) == 2
    line = error_line(capsys)
    assert "model.dim" in line and "8 -> 32" in line and "fedkg fit" in line
    # How it is tested may change: the same state, evaluated in other batches, the same numbers.
    assert main(["test", "--from", str(run), "--json", "train.eval_batch_size=7"]) == 0
    assert json.loads(capsys.readouterr().out)["test"]["mrr"] == pytest.approx(metrics["test"]["mrr"], abs=1e-6)


@pytest.mark.parametrize("overrides, keys", [
    (["model.name=rotate"], ["model.name: 'transe' -> 'rotate'"]),
    (["model.name=transr", "model.relation_dim=8"], ["model.name", "model.relation_dim: None -> 8"]),
    (["model.gamma=3"], ["model.gamma"]), (["data.num_clients=4"], ["data.num_clients: 3 -> 4"]),
    (["data.partition_seed=7"], ["data.partition_seed"]),
    (["federated.parties.client_0.model.dim=4"], ["federated.parties.client_0.model.dim: 64 -> 4"]),
], ids=lambda v: "+".join(o.split("=")[0] for o in v) if "=" in v[0] else None)
def test_test_from_names_each_override_of_the_trained_state_before_loading_it(tmp_path, capsys, overrides, keys):
    """The fast check of the same: a run directory with only its config.yaml (the old code
    went on to look for a state to load)."""
    run = tmp_path / "run"
    run.mkdir()
    save_config(load_config(FEDE_CONFIG), run / "config.yaml")  # no state: refused before it is looked for
    assert main(["test", "--from", str(run), *overrides, "train.eval_batch_size=7"]) == 2
    line = error_line(capsys)
    assert all(key in line for key in keys) and "changes what the run trained" in line
    assert "eval_batch_size: " not in line
