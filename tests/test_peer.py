"""The event-driven runner for peer-to-peer methods (no server, no rounds), with the
gossip-averaging plugin of tests/plugin_peer.py on the bundled UMLS KG."""

import json

import pytest
import torch

from lightning_fedkg.cli import main
from lightning_fedkg.config import load_config
from lightning_fedkg.run import fit
from lightning_fedkg.federated.peer import EventRunner

GOSSIP = "tests.plugin_peer:Gossip"


@pytest.fixture(autouse=True)
def importable_tests(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))


def overrides(events: int) -> list[str]:
    return ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
            "train.lr=0.05", "trainer.accelerator=cpu", "trainer.progress_bar=false",
            f"federated.strategy={GOSSIP}", f"federated.rounds={events}", "federated.local_epochs=1"]


def test_a_handshake_leaves_both_peers_equal_on_shared_rows_and_no_server_exists(one_thread):
    runner = EventRunner(load_config(None, overrides(20)), run_dir=None)
    runner.start()
    while True:
        delivery = runner.step()
        assert delivery is not None
        if delivery.event == "average":
            break
    a, b = runner.peers[delivery.sender], runner.peers[delivery.receiver]
    from lightning_fedkg.federated.alignment import pairwise_alignment

    ia, ib = pairwise_alignment(a.digests(), b.digests())
    assert ia.numel() > 0
    assert torch.equal(a.party.model.entity_emb[ia], b.party.model.entity_emb[ib])
    records = runner.channel.records()
    assert all("server" not in (r.sender, r.receiver) for r in records)
    assert {r.name for r in records} == {"hello", "rows", "average"}
    # only digests and entity rows (with their positions) ever cross; relations never
    assert all(not any(k.startswith("relation_") for k in r.shapes) for r in records)


@pytest.mark.slow
def test_fit_runs_a_peer_method_and_a_larger_budget_resumes_to_the_uninterrupted_result(tmp_path, one_thread):
    straight, staged = tmp_path / "straight", tmp_path / "staged"
    assert main(["fit", "-c", str(write_config(tmp_path, 9)), "--out", str(straight)]) == 0
    expected = json.loads((straight / "metrics.json").read_text())
    assert expected["runner"] == "event" and expected["events"] == 9 and expected["failures"] == []
    assert sum(p["handshakes"] for p in expected["peers"].values()) >= 2
    fit(load_config(None, overrides(5)), staged)
    resumed = fit(load_config(None, overrides(9)), staged)  # the event budget may grow on resume
    assert resumed.pop("wall_seconds") > 0 and expected.pop("wall_seconds") > 0  # timing, not results
    assert resumed == expected
    assert (staged / "channel_log.jsonl").read_text() == (straight / "channel_log.jsonl").read_text()


def test_a_failing_peer_is_recorded_and_the_others_go_on(one_thread):
    runner = EventRunner(load_config(None, overrides(12)), run_dir=None)

    def broken(message, sender):
        raise RuntimeError("injected")

    runner.peers["client_1"].on_hello = broken
    runner.start()
    while runner.step() is not None and runner.events < 12:
        pass
    assert runner.failures and all(f["party"] == "client_1" and f["stage"] == "hello" for f in runner.failures)
    assert "injected" in runner.failures[0]["error"]


def write_config(tmp_path, events):
    from omegaconf import OmegaConf

    path = tmp_path / "gossip.yaml"
    OmegaConf.save(OmegaConf.from_dotlist(overrides(events)), path)
    return path
