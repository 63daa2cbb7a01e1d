"""federated.clients=ray: the clients of a round trained side by side in Ray actors.

The oracle is the sequential in-process run (federated.clients=local) of the same config
and seed: the side-by-side run must write the same metrics.json (but its own seconds and the
``client_workers`` block), the same wire log and the same final states, bit for bit, and
resume the other's checkpoints (FedE, FedLU, and FedCQA with Q2P). Ray runs start one process per client (torch and Lightning
imported in each), so they are few and marked slow.
"""

import itertools
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.checkpoint import CHECKPOINT_DIR, latest_manifest, load_party, read_manifest
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.run import fit
from lightning_fedkg.runtime import machine_core_ids, place_workers, shared_finish, worker_threads

from conftest import make_small_config, single_thread

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = ["client_0", "client_1", "client_2"]


def tiny(strategy: str, clients: str, rounds: int = 2, *extra: str):
    return make_small_config(strategy, "model.dim=16", "train.num_negatives=16", "train.batch_size=128",
                             f"federated.rounds={rounds}", "federated.eval_every=1", "federated.local_epochs=1",
                             "trainer.threads=1", f"federated.clients={clients}", *extra)


def same(a, b) -> bool:
    """Equal to the last bit: tensors by value and dtype, containers recursively."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def final_states(run_dir: Path) -> dict:
    path = latest_manifest(run_dir / CHECKPOINT_DIR)
    manifest = read_manifest(path)
    return {name: load_party(path, manifest, name) for name in CLIENTS}


def without_timing(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in ("seconds", "client_workers")}


# ---------------------------------------------------------------------- without Ray
def test_the_worker_threads_share_the_free_cores_among_the_workers():
    trainer = make_small_config().trainer
    trainer.threads, trainer.deterministic = None, False
    # a large table on a quiet 16-core machine: 16 free cores, 5 for each of 3 workers
    assert worker_threads(trainer, 3, 4_000_000, cpus=16, load=0.0)[0] == 5
    assert worker_threads(trainer, 10, 4_000_000, cpus=16, load=0.0)[0] == 1
    # 2 cores: one thread each, and for a small table one thread whatever the cores
    threads, why = worker_threads(trainer, 3, 4_000_000, cpus=2, load=0.0)
    assert threads == 1 and why.endswith("2 shared by 3 workers")
    assert worker_threads(trainer, 2, 2_160, cpus=16, load=0.0)[0] == 1
    trainer.threads = 4
    assert worker_threads(trainer, 3, 2_160, cpus=2, load=9.0) == (4, "trainer.threads, per worker")


def test_workers_are_placed_on_cores_by_their_work():
    # the UMLS quick start's clients (CPU seconds per round .07 / .09 / .18) on 2 cores: the
    # largest alone on core 0, the two others together on core 1 (.16 of work)
    assert place_workers([0.07, 0.09, 0.18], 1, [0, 1]) == [[1], [1], [0]]
    # three clients of about equal work (FB15k-237-Fed3): left to the OS on both cores, which
    # ends them together (75.5 s); pinned, one core would hold two of them (95 s)
    assert place_workers([48, 52, 47], 1, [0, 1]) == [[0, 1]] * 3
    assert shared_finish([48, 52, 47], 2) == 75.5
    # one large worker and three small ones: pinning by LPT ties with the largest alone and
    # the others sharing the second core (3.1 each; the OS alone: 3.9), which pins fewer
    assert place_workers([2.9, 1, 1, 1.1], 1, [0, 1]) == [[0], [1], [1], [1]]
    assert shared_finish([2.9, 1, 1, 1.1], 2) == pytest.approx(3.9)
    # no more workers than slots: a slot each; slots are cut from the ids this process may use
    assert place_workers([1, 1], 2, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert place_workers([3, 2, 1], 2, [2, 5, 7, 9]) == [[2, 5], [7, 9], [7, 9]]
    # more threads than cores: one slot of all of them
    assert place_workers([1, 2], 4, [0, 1]) == [[0, 1], [0, 1]]
    # ten equal clients on two cores: the OS
    assert place_workers([1.0] * 10, 1, [0, 1]) == [[0, 1]] * 10
    assert place_workers([], 1, [0, 1]) == []
    # the time-slicing model: [1, 1, 1.4] on 2 slots, all at 2/3 until t = 1.5, then 0.4 alone
    assert shared_finish([1, 1, 1.4], 2) == pytest.approx(1.9)
    assert shared_finish([1, 2, 3], 1) == pytest.approx(6) and shared_finish([], 2) == 0


def modelled_end(work, placed, threads):
    """When a placement ends if the OS time-slices each group of workers evenly over the
    group's cores (a test-side reading of the returned core lists)."""
    groups = {}
    for w, cores in zip(work, placed):
        groups.setdefault(tuple(cores), []).append(w)
    assert all(set(a) == set(b) or not set(a) & set(b) for a in groups for b in groups)  # disjoint or equal
    return max(shared_finish(ws, max(1, len(cores) // threads)) for cores, ws in groups.items())


def test_the_placement_ends_no_later_than_the_os_alone_or_lpt_and_within_grahams_bound():
    """Modelled end of the chosen placement: at least max(largest, total / slots); at most
    the OS's time-slicing over all cores and pinning by the longest-processing-time rule,
    hence within Graham's (4/3 - 1/(3m)) of the best pinning, found by trying every one."""
    rng = random.Random(0)
    for _ in range(300):
        slots = rng.randint(1, 3)
        work = [rng.choice([0.5, 1, 2, 3, 5, 8]) * rng.uniform(0.9, 1.1) for _ in range(rng.randint(1, 7))]
        end = modelled_end(work, place_workers(work, 1, list(range(slots))), 1)
        assert end >= max(max(work), sum(work) / slots) - 1e-9
        assert end <= shared_finish(work, slots) + 1e-9
        best = min(max(sum(w for w, s in zip(work, pick) if s == j) for j in range(slots))
                   for pick in itertools.product(range(slots), repeat=len(work)))
        assert end <= (4 / 3 - 1 / (3 * slots)) * best + 1e-9


@pytest.mark.skipif(machine_core_ids() is None, reason="this OS cannot pin a process to cores")
def test_pinning_moves_every_thread_of_the_process():
    # in a child process: pinning the test process would slow the rest of the suite
    code = (
        "import os, threading\n"
        "from lightning_fedkg.runtime import pin_process\n"
        "ev = threading.Event(); t = threading.Thread(target=ev.wait); t.start()\n"
        "core = min(os.sched_getaffinity(0)); assert pin_process([core])\n"
        "u = threading.Thread(target=ev.wait); u.start()\n"
        "tids = [int(x) for x in os.listdir('/proc/self/task')]\n"
        "print(len(tids), all(os.sched_getaffinity(x) == {core} for x in tids)); ev.set()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    count, pinned = out.stdout.split()
    assert int(count) >= 3 and pinned == "True"  # the main thread, one started before, one after


def test_each_stage_places_the_clients_it_addresses():
    """A round that samples some clients (fraction < 1) spreads those over the cores: the
    placement is made per exchange, for the addressed clients only."""
    from lightning_fedkg.federated.channel import Channel
    from lightning_fedkg.backends.ray.clients import RayClients
    from lightning_fedkg.federated.message import Message

    calls = []

    class Handle:
        def __init__(self, name):
            self.name = name

        def remote(self, stage, data, round, cores):
            calls.append((self.name, cores))
            return self.name

    class Actor:
        def __init__(self, name):
            self.handle = Handle(name)

    class FakeRay:
        @staticmethod
        def get(refs):
            return [(None, None, 0.0) for _ in refs]

    pool = RayClients.__new__(RayClients)
    pool.ray, pool.threads, pool.core_ids = FakeRay, 1, [0, 1]
    pool.work = {"client_0": 20.0, "client_1": 10.0, "client_2": 30.0, "client_3": 10.0}
    pool.actors = {n: Actor(n) for n in pool.work}
    # clients 0, 1 and 3 sampled: the largest alone, the other two together (placed once for
    # all four, every client would be left to the OS on both cores: a tie at 40 in the model)
    pool.exchange(0, "train", {n: Message() for n in ("client_0", "client_1", "client_3")}, ("d", "u"), Channel(),
                  None)
    assert calls == [("client_0", [0]), ("client_1", [1]), ("client_3", [1])]
    calls.clear()
    pool.exchange(1, "train", {n: Message() for n in ("client_0", "client_2")}, ("d", "u"), Channel(), None)
    assert calls == [("client_0", [0]), ("client_2", [1])]  # no more clients than cores: one each
    calls.clear()
    pool.core_ids = None  # an OS that cannot pin: the OS schedules
    pool.exchange(2, "train", {"client_1": Message()}, ("d", "u"), Channel(), None)
    assert calls == [("client_1", None)]


def test_sequential_clients_are_the_default():
    cfg = make_small_config()
    assert cfg.federated.clients == "local"


def test_ray_clients_without_ray_name_the_extra(monkeypatch):
    from lightning_fedkg.backends.ray.peer import RayNotInstalledError

    monkeypatch.setitem(sys.modules, "ray", None)  # "import ray" raises ImportError
    with pytest.raises(RayNotInstalledError, match=r'federated.clients=ray needs Ray.*lightning-fedkg\[ray\]'):
        FederatedRun(tiny("fede", "ray"), run_dir=None)


def test_methods_that_need_their_parties_here_refuse_ray_clients():
    with pytest.raises(ConfigError, match="phase.*fusion.*federated.clients=local"):
        FederatedRun(tiny("fede", "ray", 2, "federated.fede.fusion=true"), run_dir=None)
    with pytest.raises(ConfigError, match="one process only"):
        FederatedRun(tiny("entire", "ray"), run_dir=None)


# ---------------------------------------------------------------------- with Ray
@pytest.fixture(scope="module")
def ray_started():
    """Ray once for the module; the runs find it started and leave it running."""
    ray = pytest.importorskip("ray")
    from lightning_fedkg.backends.ray.peer import ray_session

    with ray_session(ray, num_cpus=3):
        yield ray


@pytest.fixture(scope="module")
def fede_runs(ray_started, tmp_path_factory):
    out = tmp_path_factory.mktemp("side_by_side")
    with single_thread():
        return {mode: (fit(tiny("fede", mode), out / mode), out / mode) for mode in ("local", "ray")}


@pytest.mark.slow
def test_side_by_side_equals_the_sequential_run_to_the_last_bit(fede_runs):
    (local, local_dir), (ray_, ray_dir) = fede_runs["local"], fede_runs["ray"]
    assert "client_workers" not in local
    workers = ray_["client_workers"]
    assert {k: v for k, v in workers.items() if k not in ("why", "cores")} == {
        "clients": "ray", "workers": 3, "threads": 1}
    cores = machine_core_ids()
    if cores is not None:  # each actor runs on the cores placed for it, by its training triples
        work = [len(kg.triples("train")) for kg in FederatedRun(tiny("fede", "local"), run_dir=None).fkg.clients]
        assert workers["cores"] == dict(zip(CLIENTS, place_workers(work, 1, cores)))
    assert json.loads((ray_dir / "metrics.json").read_text()) == ray_
    assert without_timing(ray_) == without_timing(local)
    assert ray_["rounds"] == 2 and len(ray_["validation"]) == 2 and ray_["bytes_sent"] > 0
    assert (ray_dir / "channel_log.jsonl").read_text() == (local_dir / "channel_log.jsonl").read_text()
    local_states, ray_states = final_states(local_dir), final_states(ray_dir)
    assert same(ray_states, local_states)
    # the states hold trained weights, optimizer and sampler state: the comparison has teeth
    assert set(ray_states["client_0"]) >= {"module", "optimizer", "datamodule", "half"}
    # every client wrote its own TensorBoard sub-run from its actor
    assert all(any((ray_dir / "tb" / name).iterdir()) for name in CLIENTS)



@pytest.mark.slow
def test_a_side_by_side_run_is_tested_again_in_this_process(fede_runs):
    """``fedkg test`` / ``--from``: the parties are rebuilt here and test as the run did."""
    from lightning_fedkg.federated.clients import LocalClients
    from lightning_fedkg.federated.entry import evaluate_federated_checkpoint, restore_finished_run

    ray_, ray_dir = fede_runs["ray"]
    run, round_ = restore_finished_run(tiny("fede", "ray"), ray_dir)
    assert isinstance(run.pool, LocalClients) and round_ == ray_["best_round"]
    with single_thread():
        tested = evaluate_federated_checkpoint(tiny("fede", "ray"), ray_dir)
    assert tested["test"] == ray_["test"] and tested["clients"] == ray_["clients"]


@pytest.mark.slow
def test_side_by_side_resumes_a_sequential_checkpoint(fede_runs, tmp_path):
    """One round in this process, the second in the actors: the two-round run's results."""
    local = fede_runs["local"][0]
    with single_thread():
        fit(tiny("fede", "local", 1), tmp_path)
        resumed = fit(tiny("fede", "ray", 2), tmp_path)
    assert resumed["rounds"] == 2
    assert without_timing(resumed) == without_timing(local)
    assert same(final_states(tmp_path), final_states(fede_runs["local"][1]))


@pytest.mark.slow
def test_fedlu_side_by_side_equals_its_sequential_run(ray_started, tmp_path):
    """FedLU: two models per client, a persistent local optimizer and distillation, all in the actors."""
    with single_thread():
        runs = {mode: fit(tiny("fedlu", mode, 2, "federated.fedlu.schedule=always"), tmp_path / mode)
                for mode in ("local", "ray")}
    assert without_timing(runs["ray"]) == without_timing(runs["local"])
    assert same(final_states(tmp_path / "ray"), final_states(tmp_path / "local"))


@pytest.mark.slow
def test_a_client_failing_in_its_actor_is_the_same_failure_as_in_process(ray_started, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # tests.plugin_flaky, in the driver and (PYTHONPATH) the actors
    with single_thread():
        runs = {mode: fit(tiny("tests.plugin_flaky:FlakyFedE", mode), tmp_path / mode) for mode in ("local", "ray")}
    expected = [{"round": 1, "stage": "train", "party": "client_1", "error": "RuntimeError: injected crash"}]
    assert runs["ray"]["failures"] == runs["local"]["failures"] == expected
    assert without_timing(runs["ray"]) == without_timing(runs["local"])
    assert (tmp_path / "ray" / "channel_log.jsonl").read_text() == (tmp_path / "local" / "channel_log.jsonl").read_text()


@pytest.mark.slow
def test_fedcqa_q2p_side_by_side_equals_its_sequential_run(ray_started, tmp_path):
    """FedCQA with Q2P (dropout) under the hidden secure aggregate, cross-graph retrieval
    included: each training step draws from a seed its batch carries, so a client trains
    alike in its actor and after other clients in this process."""
    with single_thread():
        runs = {mode: fit(make_small_config(
            "fedcqa", "model.dim=16", "train.batch_size=64", "train.eval_batch_size=64", "task.encoder=q2p",
            "task.steps_per_epoch=4", "task.train_per_type=300", "task.eval_per_type=30", "task.cross_per_type=30",
            f"task.cache_dir={tmp_path / 'queries'}", "federated.task=query_answering", "federated.rounds=2",
            "federated.eval_every=1", "federated.federation_key=ray-test-key", "trainer.threads=1",
            "federated.secure_aggregation.enabled=true", "federated.secure_aggregation.hide_aggregate=true",
            f"federated.clients={mode}"), tmp_path / mode) for mode in ("local", "ray")}
    local, ray_ = (without_timing(runs[m]) for m in ("local", "ray"))
    for m in (local, ray_):
        del m["cross_graph"]["seconds"]  # retrieval wall times
    assert ray_ == local
    assert runs["local"]["cross_graph"]["mrr"] > 0 and runs["local"]["rounds"] == 2
    assert same(final_states(tmp_path / "ray"), final_states(tmp_path / "local"))
