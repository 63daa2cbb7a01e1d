"""Typed configs: defaults, YAML + dotlist merging, errors that name the valid keys."""

from pathlib import Path

import pytest

from lightning_fedkg.config import ConfigError, ExperimentConfig, config_from_yaml_text, load_config, save_config

REPO = Path(__file__).resolve().parents[1]


def test_defaults_and_overrides():
    cfg = load_config(None, ["model.dim=64", "federated.strategy=fede", "train.lr=0.5"])
    assert isinstance(cfg, ExperimentConfig)
    assert (cfg.model.dim, cfg.federated.strategy, cfg.train.lr) == (64, "fede", 0.5)
    assert cfg.model.name == "transe" and cfg.data.name == "umls"


def test_yaml_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  name: rotate\n  dim: 32\ntrain:\n  lr: 0.1\n")
    cfg = load_config(path, ["model.dim=48"])
    assert (cfg.model.name, cfg.model.dim, cfg.train.lr) == ("rotate", 48, 0.1)


def test_unknown_key_lists_valid_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.dimm.*Valid keys here: dim, epsilon, gamma, name"):
        load_config(None, ["model.dimm=3"])
    path = tmp_path / "bad.yaml"
    path.write_text("trian:\n  lr: 0.1\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'trian'.*Valid keys here: data, federated, model"):
        load_config(path)


def test_bad_values_are_rejected():
    with pytest.raises(ConfigError, match="model.name"):
        load_config(None, ["model.name=transx"])
    with pytest.raises(ConfigError, match="model.dim"):
        load_config(None, ["model.dim=abc"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["model.dim"])
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/config.yaml")


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["model.name=complex", "federated.rounds=7"])
    save_config(cfg, tmp_path / "config.yaml")
    assert config_from_yaml_text((tmp_path / "config.yaml").read_text()) == cfg


@pytest.mark.parametrize("path", sorted((REPO / "configs").rglob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_valid(path):
    load_config(path)
