"""Checkpoints of another format are refused with a message that says what to do; the
former ``best.pt``/``last.pt`` names are not read."""

import json

import pytest

from lightning_fedkg.config import ConfigError, load_config, resume_fingerprint
from lightning_fedkg.federated import entry, peer, round_loop
from lightning_fedkg.federated.checkpoint import CheckpointError, resolve_manifest, resume_manifest


def manifest(path, version, cfg=None, **extra):
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"version": version, "round": 1, "files": {}, **extra}
    if cfg is not None:
        body["fingerprint"] = resume_fingerprint(cfg)
    path.write_text(json.dumps(body))
    return path


def test_the_formats_were_bumped_for_this_release():
    assert round_loop.CHECKPOINT_VERSION == 3 and peer.CHECKPOINT_VERSION == 2


@pytest.mark.parametrize("module,config", [(round_loop, None), (peer, "configs/fkge/umls_fkge.yaml")])
def test_resuming_an_earlier_format_is_refused_with_what_to_do(tmp_path, module, config):
    cfg = load_config(config, [])
    current = module.CHECKPOINT_VERSION
    manifest(tmp_path / "round_0001.json", current - 1, cfg)
    with pytest.raises(ConfigError) as err:
        resume_manifest(tmp_path, cfg, current)
    message = str(err.value)
    assert f"format {current - 1}" in message and f"reads format {current} only" in message
    assert "another run directory" in message
    manifest(tmp_path / "round_0002.json", current, cfg)  # the current format resumes
    path, found = resume_manifest(tmp_path, cfg, current)
    assert path.name == "round_0002.json" and found["version"] == current


def test_reading_a_finished_run_of_an_earlier_format_is_refused(tmp_path):
    fede = load_config(None, [])
    manifest(tmp_path / "fede" / "checkpoints" / "best.json", round_loop.CHECKPOINT_VERSION - 1)
    with pytest.raises(ConfigError, match="reads format"):
        entry.restore_finished_run(fede, tmp_path / "fede")
    fkge = load_config("configs/fkge/umls_fkge.yaml", [])
    manifest(tmp_path / "fkge" / "checkpoints" / "round_0001.json", peer.CHECKPOINT_VERSION - 1)
    with pytest.raises(ConfigError, match="reads format"):
        peer.evaluate_peer_checkpoint(fkge, tmp_path / "fkge")


def test_the_former_checkpoint_file_names_are_not_read(tmp_path):
    ckpt = tmp_path / "checkpoints"
    manifest(ckpt / "best.json", 3)
    manifest(ckpt / "round_0001.json", 3)
    assert resolve_manifest(tmp_path) == ckpt / "best.json"
    for name in ("best.pt", "last.pt"):
        with pytest.raises(CheckpointError, match="expected a checkpoints"):
            resolve_manifest(ckpt / name)
