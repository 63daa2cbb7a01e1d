"""The "adding a method" example of docs/DESIGN.md runs as printed and changes the result."""

import re
from pathlib import Path

import pytest
import torch

from lightning_fedkg.config import load_config
from lightning_fedkg.federated.orchestrator import FederatedRun

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "DESIGN.md"


def example_source() -> str:
    section = DESIGN.read_text().split("### Adding a method", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_design_example_strategy_runs_and_damps_the_update(one_thread):
    namespace: dict = {}
    exec(compile(example_source(), str(DESIGN), "exec"), namespace)
    overrides = ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
                 "trainer.accelerator=cpu", "trainer.progress_bar=false", "federated.local_epochs=1"]
    damped = FederatedRun(load_config(None, overrides + ["federated.strategy=damped_fede"]), run_dir=None)
    plain = FederatedRun(load_config(None, overrides + ["federated.strategy=fede"]), run_dir=None)
    for run in (damped, plain):
        run.align()
    start = {n: t.clone() for n, t in damped.server.table.items()}
    assert all(torch.equal(start[n], plain.server.table[n]) for n in start)
    damped.train_round(1)
    plain.train_round(1)
    for name, table in damped.server.table.items():
        expected = 0.5 * plain.server.table[name] + 0.5 * start[name]
        assert torch.allclose(table, expected, atol=1e-6)
    avg, _ = damped.evaluate("val", 1)
    assert 0.0 < avg["mrr"] <= 1.0
    # registered under its name, so a config can name it
    from lightning_fedkg.federated.strategies.base import STRATEGIES

    assert STRATEGIES.get("damped_fede").__name__ == "DampedFedE"
    from lightning_fedkg.registry import RegistryError

    with pytest.raises(RegistryError, match="already registered"):
        STRATEGIES.register("damped_fede")(type("Other", (namespace["Strategy"],), {}))
