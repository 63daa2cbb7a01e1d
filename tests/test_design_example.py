"""The "adding a method" example of docs/DESIGN.md runs as printed: a strategy outside the
package, named by import path, with a setting of its own YAML section; a task with its own
metrics table; an extra evaluation stage; a client-half state that survives SIGKILL."""

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from lightning_fedkg.config import ConfigError, load_config
from lightning_fedkg.federated.federation import FederatedRun
from tests.test_resume import kill_after_first_round

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "DESIGN.md"
MODULE = "design_example_method"


def example_blocks(lang: str) -> list[str]:
    section = DESIGN.read_text().split("### Adding a method", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


def example_source() -> str:
    """Every Python block of the example, as one module (``my_pkg.my_module``)."""
    return "\n\n".join(example_blocks("python"))


@pytest.fixture
def example_module(monkeypatch):
    module = types.ModuleType(MODULE)
    exec(compile(example_source(), str(DESIGN), "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, MODULE, module)
    return module


SMALL = ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
         "trainer.accelerator=cpu", "trainer.progress_bar=false", "federated.local_epochs=1"]


def example_config(tmp_path, *overrides):
    yaml = example_blocks("yaml")[0].replace("my_pkg.my_module", MODULE)
    path = tmp_path / "damped.yaml"
    path.write_text(yaml)
    return load_config(path, SMALL + list(overrides))


def test_design_example_strategy_runs_and_damps_the_update_by_its_yaml_beta(example_module, tmp_path, one_thread):
    cfg = example_config(tmp_path)
    assert cfg.federated.damped_fede.beta == 0.25  # from the YAML, not the default 0.5
    damped = FederatedRun(cfg, run_dir=None)
    plain = FederatedRun(load_config(None, SMALL + ["federated.strategy=fede"]), run_dir=None)
    for run in (damped, plain):
        run.align()
    start = {n: t.clone() for n, t in damped.server.table.items()}
    assert all(torch.equal(start[n], plain.server.table[n]) for n in start)
    damped.train_round(1)
    plain.train_round(1)
    for name, table in damped.server.table.items():
        expected = 0.25 * plain.server.table[name] + 0.75 * start[name]
        assert torch.allclose(table, expected, atol=1e-6)
    avg, _ = damped.evaluate("val", 1)
    assert 0.0 < avg["mrr"] <= 1.0


def test_design_example_section_is_checked_like_a_builtin(example_module, tmp_path):
    with pytest.raises(ConfigError, match=r"federated\.damped_fede\.beta: 2\.0 is out of range \(must be in \[0, 1\]\)"):
        example_config(tmp_path, "federated.damped_fede.beta=2.0")
    with pytest.raises(ConfigError, match=r"unknown config key 'federated\.damped_fede\.betta'.*Valid keys here: beta"):
        example_config(tmp_path, "federated.damped_fede.betta=0.3")
    # Without the strategy the section is unknown.
    with pytest.raises(ConfigError, match=r"unknown config key 'federated\.damped_fede'.*when federated\.strategy names"):
        load_config(None, ["federated.strategy=fede", "federated.damped_fede.beta=0.3"])


# ---------------------------------------------------------------------- the other hooks, killed and resumed
ROUNDS = 4
AUDITED = ["seed=1", "model.dim=16", "train.lr=0.05", "federated.eval_every=1", "federated.patience=20",
           f"federated.rounds={ROUNDS}", f"federated.strategy={MODULE}:AuditedDampedFedE",
           f"federated.task={MODULE}:MrrAndHits3", "trainer.threads=1"]


def launch(tmp_path: Path, run_dir: Path) -> subprocess.Popen:
    """``fedkg fit`` of the audited example in a fresh process (the example module on its path)."""
    (tmp_path / f"{MODULE}.py").write_text(example_source())
    yaml = tmp_path / "damped.yaml"
    yaml.write_text(example_blocks("yaml")[0].replace("my_pkg.my_module", MODULE))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "lightning_fedkg.cli", "fit", "-c", str(yaml), "--out", str(run_dir),
           *SMALL, *AUDITED]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return out


@pytest.mark.slow
def test_design_example_task_stage_and_client_state_survive_a_sigkill(tmp_path):
    reference, interrupted = tmp_path / "reference", tmp_path / "interrupted"
    uninterrupted = launch(tmp_path, reference)  # side by side with the run to interrupt
    killed_at = kill_after_first_round(launch(tmp_path, interrupted), interrupted)
    table = finish(uninterrupted)
    expected = json.loads((reference / "metrics.json").read_text())
    # The task's metrics and table; the extra evaluation stage's answers in every client entry.
    assert set(expected["test"]) == {"mrr", "hits@3", "count"}
    assert "HR@3" in table and "H@10" not in table
    assert expected["best_round"] == ROUNDS  # validation improved every round: the best state is the last
    assert [c["fits"] for c in expected["clients"]] == [ROUNDS] * 3  # every client trained every round

    assert 1 <= killed_at < ROUNDS and not (interrupted / "metrics.json").exists()
    finish(launch(tmp_path, interrupted))
    resumed = json.loads((interrupted / "metrics.json").read_text())
    # A half that lost its count on resume would report ROUNDS - killed_at fits.
    assert [c["fits"] for c in resumed["clients"]] == [ROUNDS] * 3
    for key in ("test", "clients", "validation", "best_round", "bytes_sent"):
        assert resumed[key] == expected[key], key
