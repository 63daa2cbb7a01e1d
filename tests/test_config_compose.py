"""Configs composed from a base and a delta (issue 59): ``base:`` names the files a config
builds on, merged in order before the file's own keys."""

from __future__ import annotations

import pytest

from lightning_fedkg.config import ConfigError, load_config


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_config_is_its_bases_then_its_own_keys(tmp_path):
    write(tmp_path / "base" / "umls.yaml", "data: {name: umls, num_clients: 3}\nmodel: {name: transe, dim: 64}\n"
                                            "train: {lr: 0.01}\n")
    write(tmp_path / "base" / "short.yaml", "federated: {rounds: 7}\ntrain: {lr: 0.02}\n")
    cfg = load_config(write(tmp_path / "fedr" / "umls.yaml", "base: [../base/umls.yaml, ../base/short.yaml]\n"
                                                            "federated: {strategy: fedr}\nmodel: {dim: 32}\n"))
    assert (cfg.data.name, cfg.data.num_clients, cfg.model.name) == ("umls", 3, "transe")
    assert cfg.model.dim == 32 and cfg.train.lr == 0.02 and cfg.federated.rounds == 7  # later wins
    assert cfg.federated.strategy == "fedr"
    # a base may have its own base; a single path is a list of one; overrides still come last
    write(tmp_path / "base" / "chained.yaml", "base: umls.yaml\nmodel: {dim: 16}\n")
    cfg = load_config(write(tmp_path / "x.yaml", "base: base/chained.yaml\nfederated: {strategy: fede}\n"),
                      ["model.dim=8"])
    assert cfg.model.dim == 8 and cfg.data.name == "umls"


def test_a_base_that_is_missing_circular_or_malformed_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"a\.yaml: its base nope\.yaml is not a file"):
        load_config(write(tmp_path / "a.yaml", "base: nope.yaml\n"))
    write(tmp_path / "b.yaml", "base: c.yaml\n")
    write(tmp_path / "c.yaml", "base: b.yaml\n")
    with pytest.raises(ConfigError, match="form a cycle"):
        load_config(tmp_path / "b.yaml")
    with pytest.raises(ConfigError, match="'base' names the config files"):
        load_config(write(tmp_path / "d.yaml", "base: {x: 1}\n"))
    # a mistake in a base is reported at its own file and line
    write(tmp_path / "bad_base.yaml", "model:\n  dimm: 3\n")
    with pytest.raises(ConfigError, match=r"bad_base\.yaml.*dimm"):
        load_config(write(tmp_path / "e.yaml", "base: bad_base.yaml\n"))


def test_a_moved_config_names_its_new_path():
    # configs/MOVED.txt: one folder per method (issue 59); an old path in a script or a note
    # fails with the new one named
    with pytest.raises(ConfigError, match="moved to configs/fedr/umls_fedr.yaml"):
        load_config("configs/fede/umls_fedr.yaml")


def test_every_move_names_a_config_that_exists_in_place_of_one_that_does_not():
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    lines = (repo / "configs" / "MOVED.txt").read_text().splitlines()
    moves = [line.split("\t") for line in lines if "\t" in line]
    assert moves and all(len(m) == 2 for m in moves)
    for old, new in moves:
        assert not (repo / old).exists() and (repo / new).is_file(), (old, new)


def test_every_base_is_used_and_no_two_configs_are_near_copies():
    """configs/base/ holds what shipped configs share; each base is named by some config (a
    base nothing uses is a stale copy), and no two shipped files are near-copies again
    (scripts/tools/config_identity.py similar: at most 90% of their settings lines the same)."""
    import importlib.util
    from pathlib import Path

    from lightning_fedkg.config import file_layers

    repo = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("config_identity", repo / "scripts" / "tools" / "config_identity.py")
    identity = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(identity)
    used = {Path(str(source)).resolve() for path in identity.shipped_configs() for _, source in file_layers(path)}
    bases = sorted((repo / "configs" / "base").glob("*.yaml"))
    assert bases and [b.name for b in bases if b.resolve() not in used] == []
    assert identity.near_identical(identity.all_yaml(), 0.9, "settings") == []
