"""How ``fedkg`` reaches the methods without naming one: the commands they add
(``COMMANDS``), the tables they format (``format_report``), their tasks' own data."""

import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from lightning_fedkg.cli import build_parser, format_metrics_table, main
from lightning_fedkg.commands import Command
from lightning_fedkg.config import load_config
from lightning_fedkg.federated.strategy import Strategy
from lightning_fedkg.registry import COMMANDS, STRATEGIES, import_path

REPO = Path(__file__).resolve().parents[1]

#: FKGE's metrics.json layout: one entry per KG (no evaluation: zeros; no release: ε 0.00; an exact,
#: unaccounted release: ε None, shown "not private").
FKGE_METRICS = {"strategy": "fkge", "handshakes": [1, 2, 3], "bytes_sent": 123456,
                "kgs": [{"name": "umls_0", "model": "transe", "before": {"accuracy": 0.81234, "mrr": 0.412,
                                                                          "hits@10": 0.7},
                         "after": {"accuracy": 0.83, "mrr": 0.45, "hits@10": 0.72}, "epsilon": 11.234, "accepted": 2,
                         "hosted": 3},
                        {"name": "umls_1", "model": "rotate", "before": None, "after": None, "epsilon": 0.0,
                         "accepted": 0, "hosted": 0},
                        {"name": "umls_2", "model": "transe", "before": None, "after": None, "epsilon": None,
                         "accepted": 1, "hosted": 1}]}
FKGE_TABLE = """\
strategy=fkge  handshakes=3  bytes_sent=123456
KG              model    acc before acc after MRR before MRR after H@10 before H@10 after     epsilon  accepted
---------------------------------------------------------------------------------------------------------------
umls_0          transe       0.8123    0.8300     0.4120    0.4500      0.7000     0.7200       11.23     2/3  
umls_1          rotate       0.0000    0.0000     0.0000    0.0000      0.0000     0.0000        0.00     0/0  
umls_2          transe       0.0000    0.0000     0.0000    0.0000      0.0000     0.0000 not private     1/1  """


def _stage(x: float) -> dict:
    return {"forget": {"mrr": x, "hits@1": x / 2, "hits@10": None}, "test": {"mrr": x + .1, "hits@10": x + .2},
            "mia_auc": 0.5 + x / 10, "seconds": 12.5}


#: ``fedkg unlearn``'s metrics.json layout: the unlearn phase's block at the top level.
UNLEARN_METRICS = {"strategy": "fedlu", "before": _stage(0.3), "after": _stage(0.1),
                   "retrain": {**_stage(0.05), "rounds": 7}, "forget": {"triples": 42},
                   "budget": {"retrain_rounds": 9, "source_rounds": 5, "decay_epochs": {"client_0": 3, "client_1": 4},
                              "local_epochs": 2, "propagate_rounds": 1}}
UNLEARN_TABLE = """\
           forget MRR  forget H@1 forget H@10    test MRR   test H@10     MIA AUC     seconds
before         0.3000      0.1500           -      0.4000      0.5000      0.5300     12.5000
after          0.1000      0.0500           -      0.2000      0.3000      0.5100     12.5000
retrain        0.0500      0.0250           -      0.1500      0.2500      0.5050     12.5000
42 forgotten triples, ranked by every model above
retrain budget: 9 rounds (source 5 + decay epochs 4 / 2 per round + 1 propagation), trained 7"""


def test_fkge_formats_its_table_named_by_the_config_or_by_the_metrics():
    assert format_metrics_table(FKGE_METRICS, load_config(REPO / "configs" / "fkge" / "umls_fkge.yaml", [])) \
        == FKGE_TABLE
    assert format_metrics_table(FKGE_METRICS) == FKGE_TABLE  # a metrics.json read without its config


def test_the_unlearn_phase_formats_fedkg_unlearns_table_and_nothing_else():
    from lightning_fedkg.methods.fedlu.phase import UnlearnPhase

    cfg = load_config(REPO / "configs" / "fedlu" / "umls_fedlu.yaml", [], sections=("unlearn",))
    assert format_metrics_table(UNLEARN_METRICS, cfg) == UNLEARN_TABLE
    without_retrain = {k: v for k, v in UNLEARN_METRICS.items() if k != "retrain"}
    assert UnlearnPhase.format_report(without_retrain) == "\n".join(UNLEARN_TABLE.splitlines()[:3] +
                                                                     UNLEARN_TABLE.splitlines()[4:5])
    # A training run's metrics (the phase's block under its name) get the generic table.
    entry = {"mrr": 0.5, "hits@1": 0.4, "hits@5": 0.6, "hits@10": 0.7, "count": 3, "triples": 3}
    trained = {"strategy": "fedlu", "clients": [entry], "test": entry, "unlearn": UNLEARN_METRICS}
    assert UnlearnPhase.format_report(trained) is None
    assert format_metrics_table(trained, cfg).splitlines()[1].startswith("client")


class Reporting(Strategy):
    """A strategy with a metrics.json layout of its own (its ``"own"`` key)."""

    name = "reporting"

    @classmethod
    def format_report(cls, metrics):
        return f"own table: {metrics['own']}" if "own" in metrics else None


def test_a_strategy_with_its_own_layout_formats_it_and_falls_back_to_the_generic_table(monkeypatch):
    monkeypatch.setitem(STRATEGIES._classes, "reporting", Reporting)
    assert format_metrics_table({"strategy": "reporting", "own": 7}) == "own table: 7"
    entry = {"mrr": 0.5, "hits@1": 0.4, "hits@5": 0.6, "hits@10": 0.7, "count": 3, "triples": 3}
    generic = format_metrics_table({"strategy": "reporting", "clients": [entry], "test": entry})
    assert generic.splitlines()[0] == "strategy=reporting"
    # A strategy that no longer resolves (a plugin since uninstalled) is not asked.
    assert format_metrics_table({"strategy": "uninstalled_xyz", "own": 7, "test": entry}).splitlines()[2] \
        .startswith("test")


def test_every_declared_command_is_a_light_command_of_a_method_or_a_backend():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][
        "lightning_fedkg.commands"]
    assert declared == {"query": "lightning_fedkg.methods.fedcqa.commands:Query",
                        "unlearn": "lightning_fedkg.methods.fedlu.commands:Unlearn",
                        "flower": "lightning_fedkg.backends.flower.commands:Flower"}
    for target in declared.values():
        assert issubclass(import_path(target), Command)
    # What the installed package declares is what fedkg offers (after a reinstall).
    assert {"query", "unlearn", "flower"} <= set(COMMANDS.names())
    choices = next(a for a in build_parser()._actions if a.dest == "command").choices
    assert list(choices)[:5] == ["fit", "test", "flower", "query", "unlearn"]


class Hello(Command):
    help = "say hello"

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--name", default="world")

    @classmethod
    def run(cls, args):
        print(f"hello {args.name}")
        return 0


def test_a_registered_command_joins_fedkg(monkeypatch, capsys):
    monkeypatch.setitem(COMMANDS._classes, "hello", Hello)
    assert main(["hello", "--name", "you"]) == 0
    assert capsys.readouterr().out == "hello you\n"
    assert main(["hello"]) == 0 and capsys.readouterr().out == "hello world\n"


def test_a_command_that_cannot_load_is_left_out_with_a_warning(monkeypatch, capsys):
    declared = COMMANDS._declared()
    monkeypatch.setitem(declared, "broken", EntryPoint("broken", "no_such_module_xyz:Cmd", "lightning_fedkg.commands"))
    monkeypatch.setitem(COMMANDS._classes, "hello", Hello)
    assert main(["hello"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "hello world\n"
    assert captured.err.startswith("fedkg: warning: command 'broken' (no_such_module_xyz:Cmd) cannot be loaded")
    with pytest.raises(SystemExit) as exit:
        main(["broken"])
    assert exit.value.code == 2 and "invalid choice: 'broken'" in capsys.readouterr().err
