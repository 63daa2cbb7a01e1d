"""A party that is not KGE: a task from tests/plugin_task.py (relation classification,
accuracy, its own ``task:`` section) runs through the federated core unchanged."""

import json

import pytest

from lightning_fedkg.cli import format_metrics_table
from lightning_fedkg.config import ConfigError
from lightning_fedkg.run import fit

TASK = "tests.plugin_task:RelationClassification"
#: On top of conftest's small federation, under FedE.
SETTINGS = {"model.dim": 16, "train.lr": 0.02, "train.batch_size": 128, "federated.task": TASK,
            "federated.rounds": 6, "federated.eval_every": 2, "federated.local_epochs": 2}


@pytest.mark.slow
def test_a_relation_classification_task_federates_and_learns(small_config, tmp_path, one_thread):
    cfg = small_config("fede", "task.hidden=24", **SETTINGS)
    assert cfg.task.hidden == 24  # the task's own section, from its config_class
    metrics = fit(cfg, tmp_path / "run")
    # Far above chance (UMLS has 46 relations; the most frequent is about 1 in 9 triples).
    assert metrics["test"]["accuracy"] > 0.5, metrics["test"]
    assert set(metrics["test"]) == {"accuracy", "count"}
    assert [set(c) for c in metrics["clients"]] == [{"name", "accuracy", "count", "triples"}] * 3
    assert metrics["validation"] and all("accuracy" in v for v in metrics["validation"])  # the task's monitor
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["test"] == metrics["test"]
    table = format_metrics_table(metrics)  # no link-prediction columns assumed
    assert "accuracy" in table.splitlines()[1] and f"{metrics['test']['accuracy']:.4f}" in table
    # Only the declared entity rows crossed; the private MLP never did.
    shapes = [json.loads(line)["shapes"] for line in (tmp_path / "run" / "channel_log.jsonl").read_text().splitlines()]
    assert {name for s in shapes for name in s} <= {"entity_emb", "entity_digests"}


def test_the_task_section_is_checked_like_any_other(small_config):
    with pytest.raises(ConfigError, match=r"task\.hidden: 0 is out of range"):
        small_config("fede", "task.hidden=0", **SETTINGS)
    with pytest.raises(ConfigError, match=r"unknown config key 'task\.hiddn'.*Valid keys here: hidden"):
        small_config("fede", "task.hiddn=3", **SETTINGS)
