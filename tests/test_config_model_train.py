"""The ``model`` and ``train`` config sections: defaults that agree with the classes they
configure, and every option reaching the built module."""

import inspect
from pathlib import Path

import pytest
import yaml

from lightning_fedkg.config import TrainConfig, load_config

REPO = Path(__file__).resolve().parents[1]
UMLS_QUICK_START = [REPO / "configs" / "fede" / f"umls_{s}.yaml" for s in ("fede", "single", "entire", "fedr")]


def test_reset_optimizer_default_agrees_with_kge_module():
    from lightning_fedkg.models import KGEModule
    from lightning_fedkg.training import build_module

    module_default = inspect.signature(KGEModule).parameters["reset_optimizer"].default
    assert TrainConfig().reset_optimizer is True and module_default is True
    module = build_module(load_config(), num_entities=5, num_relations=2)
    assert module.hparams.reset_optimizer is True


@pytest.mark.parametrize("path", UMLS_QUICK_START, ids=lambda p: p.name)
def test_umls_quick_start_configs_share_one_optimizer_policy(path):
    # They take the default rather than each stating its own, so they cannot drift apart.
    assert "reset_optimizer" not in yaml.safe_load(path.read_text())["train"]
    assert load_config(path).train.reset_optimizer is True
