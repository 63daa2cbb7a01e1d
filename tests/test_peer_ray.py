"""federated.backend=ray: the peer-to-peer runner with one Ray actor process per party.

Ray starts once for the module (seconds), and each Ray run starts one process per party
(torch and Lightning imported in each), so the Ray runs here are few: one of the ring
plugin (ends by itself, one injected failure) compared with the local backend, and one of
the endless gossip with a budget, resumed across backends.
"""

import collections
import json
from pathlib import Path

import pytest

from lightning_fedkg.cli import main
from lightning_fedkg.config import ConfigError, load_config
from lightning_fedkg.run import fit

from conftest import single_thread

#: Every test here starts Ray (about 20 s for the module): the fast loop leaves them out.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
GOSSIP, FAILING_RING = "tests.plugin_peer:Gossip", "tests.plugin_peer:FailingRing"


def overrides(strategy: str, events: int, engine: str) -> list[str]:
    return ["data.name=umls", "model.dim=8", "train.num_negatives=8", "train.negative_mode=shared",
            "train.lr=0.05", "trainer.accelerator=cpu", "trainer.progress_bar=false", "trainer.threads=1",
            f"federated.strategy={strategy}", f"federated.rounds={events}", "federated.local_epochs=1",
            f"federated.backend={engine}"]


@pytest.fixture(scope="module")
def ray_started():
    """Ray once for the module, on 2 CPUs; the runs find it started and leave it running."""
    ray = pytest.importorskip("ray")
    from lightning_fedkg.backends.ray.peer import ray_session

    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT))  # tests.plugin_peer, in the driver and (via PYTHONPATH) the actors
        with ray_session(ray, num_cpus=2):
            yield ray


@pytest.fixture(scope="module")
def ring_runs(ray_started, tmp_path_factory):
    """The ring plugin (each peer greets its next peer twice; client_1's hello handler raises)
    run to its end by both backends, with an event budget it does not reach."""
    out = tmp_path_factory.mktemp("ring")
    with single_thread():
        return {engine: (fit(load_config(None, overrides(FAILING_RING, 100, engine)), out / engine), out / engine)
                for engine in ("local", "ray")}


def wire(run_dir: Path) -> collections.Counter:
    records = [json.loads(line) for line in (run_dir / "channel_log.jsonl").read_text().splitlines()]
    return collections.Counter((r["sender"], r["receiver"], r["name"], json.dumps(r["shapes"], sort_keys=True))
                               for r in records)


def test_ray_ends_by_itself_with_the_local_backends_deliveries_and_wire_log(ring_runs):
    (local, local_dir), (ray_, ray_dir) = ring_runs["local"], ring_runs["ray"]
    assert local["engine"] == "local" and local["wall_seconds"] > 0
    assert ray_["engine"] == "ray" and ray_["runner"] == "event" and ray_["wall_seconds"] > 0
    assert json.loads((ray_dir / "metrics.json").read_text()) == ray_
    # 3 parties: client_0's first hello fails, the two other rings complete 2 handshakes each
    assert ray_["events"] == local["events"] == 1 + 2 * 2 * 3 and ray_["pending"] == local["pending"] == 0
    assert wire(ray_dir) == wire(local_dir) and sum(wire(ray_dir).values()) == 13
    assert (ray_["bytes_sent"], ray_["wire_bytes"]) == (local["bytes_sent"], local["wire_bytes"])
    assert ray_["peers"] == local["peers"] and set(ray_) == set(local)
    assert [c["name"] for c in ray_["clients"]] == ["client_0", "client_1", "client_2"]


def test_a_failing_handler_in_an_actor_is_recorded_and_the_others_go_on(ring_runs):
    ray_ = ring_runs["ray"][0]
    assert [{k: f[k] for k in ("party", "stage", "error")} for f in ray_["failures"]] == [
        {"party": "client_1", "stage": "hello", "error": "RuntimeError: injected"}]
    assert 1 <= ray_["failures"][0]["round"] <= ray_["events"]
    assert ray_["peers"]["client_2"]["handshakes"] == 4  # greeted by client_1, greeting client_0


def test_a_budget_stops_ray_exactly_and_runs_resume_across_backends(ray_started, tmp_path, one_thread, capsys):
    run_dir = tmp_path / "gossip"
    local = fit(load_config(None, overrides(GOSSIP, 4, "local")), run_dir)
    assert local["events"] == 4 and local["pending"] > 0  # an unfinished local run ...
    head = (run_dir / "channel_log.jsonl").read_text()
    # ... resumed by Ray (free to change on resume), which stops at exactly the new budget
    resumed = fit(load_config(None, overrides(GOSSIP, 9, "ray")), run_dir)
    assert resumed["engine"] == "ray" and resumed["events"] == 9 and resumed["pending"] > 0
    log = (run_dir / "channel_log.jsonl").read_text()
    assert log.startswith(head) and {json.loads(line)["round"] for line in log[len(head):].splitlines()} <= set(range(4, 10))
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("*.json"))[-1] == "round_0009.json"
    # the end of the Ray run is what fedkg test evaluates, and where a local run goes on
    capsys.readouterr()
    assert main(["test", "--from", str(run_dir), "--json"]) == 0
    tested = json.loads(capsys.readouterr().out)
    assert tested["test"] == resumed["test"] and tested["events"] == 9
    again = fit(load_config(None, overrides(GOSSIP, 12, "local")), run_dir)
    assert again["engine"] == "local" and again["events"] == 12
    assert sum(p["handshakes"] for p in again["peers"].values()) > sum(p["handshakes"] for p in local["peers"].values())


def test_without_ray_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    from lightning_fedkg.backends.ray.peer import RayNotInstalledError

    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # import ray -> ImportError
    monkeypatch.syspath_prepend(str(ROOT))
    with pytest.raises(RayNotInstalledError, match=r'pip install "lightning-fedkg\[ray\]"') as err:
        fit(load_config(None, overrides(GOSSIP, 3, "ray")), tmp_path / "run")
    assert isinstance(err.value, ImportError) and isinstance(err.value, ConfigError)


def test_the_ray_backend_is_for_peer_to_peer_strategies_only(tmp_path):
    cfg = load_config(None, ["data.name=umls", "federated.strategy=fede", "federated.backend=ray"])
    with pytest.raises(ConfigError, match="peer-to-peer strategies only"):
        fit(cfg, tmp_path / "run")


def test_each_actor_builds_only_its_own_party(monkeypatch, one_thread):
    """``build_parties(only=...)`` gives an actor its party and nothing else; FKGE's override
    names its parties after its sources without building a model."""
    from lightning_fedkg.federated.peer import build_named_party
    from lightning_fedkg.federated.tasks import TASKS
    from lightning_fedkg.methods.fkge.federation import FKGE

    monkeypatch.syspath_prepend(str(ROOT))
    from tests.plugin_peer import Gossip

    cfg = load_config(None, overrides(GOSSIP, 3, "ray"))
    task = TASKS.get(cfg.federated.task)()
    assert Gossip.party_names(cfg) == ["client_0", "client_1", "client_2"]
    assert build_named_party(Gossip, cfg, task, None, None, "client_1").name == "client_1"
    with pytest.raises(ConfigError, match="party_names"):
        build_named_party(Gossip, cfg, task, None, None, "client_7")
    fkge = load_config(None, ["federated.strategy=fkge", "data.name=umls", "data.num_clients=3"])
    assert FKGE.party_names(fkge) == ["umls-src0", "umls-src1", "umls-src2"]
    assert [p.name for p in FKGE.build_parties(fkge, task, None, None, only="umls-src2")] == ["umls-src2"]


def test_fkge_on_ray_terminates_with_the_synchronous_invariants(ray_started, tmp_path, one_thread):
    """FKGE with one process per KG: the run ends by itself (no message pending), every
    accepted handshake improved its host's validation MRR, no host's epsilon passed the
    budget, and nothing but the protocol crossed."""
    from test_fkge_federation import ARRAYS, BASE

    cfg = load_config(None, [*BASE, "federated.backend=ray", "federated.fkge.max_epsilon=6.0",
                             "federated.fkge.handshakes_per_kg=3"])
    metrics = fit(cfg, tmp_path / "run")
    assert metrics["engine"] == "ray" and metrics["pending"] == 0 and metrics["failures"] == []
    assert metrics["handshakes"]
    for h in metrics["handshakes"]:
        assert not h["accepted"] or h["valid_after"] > h["valid_before"]
    assert all(kg["epsilon"] <= 6.0 for kg in metrics["kgs"])
    for line in (tmp_path / "run" / "channel_log.jsonl").read_text().splitlines():
        record = json.loads(line)
        assert set(record["shapes"]) == ARRAYS[record["name"]]
