"""The "adding a method" example of docs/DESIGN.md runs as printed: a strategy outside the
package, named by import path, with a setting of its own YAML section."""

import re
import sys
import types
from pathlib import Path

import pytest
import torch

from lightning_fedkg.config import ConfigError, load_config
from lightning_fedkg.federated.orchestrator import FederatedRun

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"
MODULE = "design_example_method"


def example_blocks(lang: str) -> list[str]:
    section = DESIGN.read_text().split("### Adding a method", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{lang}\n(.*?)```", section, re.S)


@pytest.fixture
def example_module(monkeypatch):
    """The example's code as an importable module (what ``my_pkg.my_module`` is to a user)."""
    module = types.ModuleType(MODULE)
    exec(compile(example_blocks("python")[0], str(DESIGN), "exec"), module.__dict__)
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
    # Without the strategy the section is unknown: the valid keys name the core's and fede's.
    with pytest.raises(ConfigError, match=r"unknown config key 'federated\.damped_fede'.*when federated\.strategy names"):
        load_config(None, ["federated.strategy=fede", "federated.damped_fede.beta=0.3"])
