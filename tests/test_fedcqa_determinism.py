"""Same seed, same FedCQA run, whatever the process's RNG held before it started.

A training step's negatives and dropout are seeded by its batch (``QueryBatches``' own
stream), so a run does not depend on what drew from torch's process-wide RNG before it or
between its clients: a run started with that RNG in another state, or built without
seeding the process at all, writes the same ``metrics.json`` to the last bit, and a
resumed run equals the straight one. Q2P (dropout) and GQE with negative sampling are the
encoders that draw; GQE with the softmax loss draws nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import lightning_fedkg.run as run_module
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.methods.fedcqa.module import QueryBatches
from lightning_fedkg.run import fit
from lightning_fedkg.runtime import seed_process

from conftest import make_small_config, single_thread

pytest.importorskip("cryptography")

#: (encoder, loss): the two ways a step draws random numbers.
DRAWING = [("q2p", "softmax"), ("gqe", "negative_sampling")]


def tiny(encoder: str, loss: str, cache: Path, rounds: int = 2, *extra: str):
    """FedCQA (hidden secure aggregate) on the small UMLS federation in 16 dimensions: two
    short rounds, validation after each, 30 cross-graph queries per type."""
    return make_small_config(
        "fedcqa", "model.dim=16", "train.lr=0.01", "train.batch_size=64", "train.eval_batch_size=64",
        f"task.encoder={encoder}", f"task.loss={loss}", "task.negatives=16", "task.steps_per_epoch=4",
        "task.train_per_type=300", "task.eval_per_type=30", "task.cross_per_type=30", f"task.cache_dir={cache}",
        "federated.task=query_answering", f"federated.rounds={rounds}", "federated.eval_every=1",
        "federated.federation_key=determinism-test-key", "federated.secure_aggregation.enabled=true",
        "federated.secure_aggregation.hide_aggregate=true", "trainer.threads=1", *extra)


def untimed(x):
    """``metrics.json`` without its wall times (every ``seconds`` key, at any depth)."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, list):
        return [untimed(v) for v in x]
    return x


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("queries")


def test_each_batch_carries_its_own_seed_and_the_batches_are_unchanged():
    from lightning_fedkg.methods.fedcqa.queries import QuerySet

    qs = QuerySet("1p", torch.arange(20).view(10, 2), torch.arange(11), torch.arange(10), torch.zeros(11, dtype=torch.long),
                  torch.zeros(0, dtype=torch.long))
    first = list(QueryBatches({"1p": qs}, 4, seed=7, steps=5))
    again = list(QueryBatches({"1p": qs}, 4, seed=7, steps=5))
    other = list(QueryBatches({"1p": qs}, 4, seed=8, steps=5))
    seeds = [b["seed"] for b in first]
    assert seeds == [b["seed"] for b in again] and len(set(seeds)) == 5
    assert seeds != [b["seed"] for b in other]
    # the queries are drawn from their own generator, exactly as before the seeds existed
    generator = torch.Generator().manual_seed(7)
    for batch in first:
        torch.multinomial(torch.tensor([10.0]), 1, generator=generator)
        rows = torch.randint(10, (4,), generator=generator)
        torch.rand(4, generator=generator)
        assert torch.equal(batch["queries"], qs.queries[rows])


@pytest.mark.parametrize("encoder, loss", DRAWING, ids=[e for e, _ in DRAWING])
def test_a_step_is_a_function_of_its_batch_and_leaves_the_process_rng_alone(encoder, loss):
    from lightning_fedkg.methods.fedcqa.module import QueryAnsweringModule

    torch.manual_seed(0)
    module = QueryAnsweringModule(20, 8, encoder=encoder, dim=16, loss=loss, negatives=8)
    batch = {"structure": "2i", "queries": torch.tensor([[1, 2, 3, 4], [5, 0, 6, 2]]), "positive": torch.tensor([7, 9]),
             "weight": torch.ones(2)}
    losses = []
    for disturbance in (1, 2):
        torch.manual_seed(disturbance)
        state = torch.get_rng_state()
        losses.append([float(module.training_step({**batch, "seed": seed}, 0).detach()) for seed in (11, 12)])
        assert torch.equal(torch.get_rng_state(), state)  # nothing drawn from the process RNG
    assert losses[0] == losses[1]  # the process RNG's state does not matter
    assert losses[0][0] != losses[0][1]  # the batch's seed does: the step draws from it


@pytest.mark.slow
@pytest.mark.parametrize("encoder, loss", DRAWING, ids=[e for e, _ in DRAWING])
def test_same_seed_same_metrics_whatever_the_process_rng_held(tmp_path, cache, monkeypatch, encoder, loss):
    with single_thread():
        first = fit(tiny(encoder, loss, cache), tmp_path / "first")
        # the second run starts with the process RNG elsewhere (as after other work in a process)
        monkeypatch.setattr(run_module, "seed_process", lambda seed: (seed_process(seed), torch.rand(123)))
        second = fit(tiny(encoder, loss, cache), tmp_path / "second")
    on_disk = [json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("first", "second")]
    assert untimed(on_disk[0]) == untimed(on_disk[1])
    assert untimed(first) == untimed(second)
    # the runs learned something and were tested across graphs: the equality has teeth
    assert first["rounds"] == 2 and first["cross_graph"]["mrr"] > 0 and first["in_graph"]["mrr"] > 0


@pytest.mark.slow
def test_a_run_built_without_seeding_the_process_repeats_itself(cache):
    """How tests and benchmarks build runs (``FederatedRun`` directly): before the fix, two
    such Q2P runs in one process gave different cross-graph MRR."""
    results = []
    with single_thread():
        for disturbance in (1, 2):
            torch.manual_seed(disturbance)
            run = FederatedRun(tiny("q2p", "softmax", cache, rounds=1), None)
            run.train_round(1)
            run.evaluate("test", 1)
            results.append(untimed(run.server.report()))
            run.close()
    assert results[0] == results[1]
    assert results[0]["cross_graph"]["mrr"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("reset", ["true", "false"])
def test_a_resumed_q2p_run_equals_the_straight_one(tmp_path, cache, reset):
    """Also with one AdamW per client across rounds (``reset_optimizer: false``, the FedCQA
    configs' default): its moments are checkpointed with the party and come back."""
    opt = f"train.reset_optimizer={reset}"
    with single_thread():
        straight = fit(tiny("q2p", "softmax", cache, 2, opt), tmp_path / "straight")
        fit(tiny("q2p", "softmax", cache, 1, opt), tmp_path / "resumed")
        torch.rand(99)  # whatever the process did in between
        resumed = fit(tiny("q2p", "softmax", cache, 2, opt), tmp_path / "resumed")
    assert resumed["rounds"] == 2
    assert untimed(resumed) == untimed(straight)


@pytest.mark.slow
def test_a_resumed_named_rows_run_equals_the_straight_one(tmp_path, cache):
    """``federated.aggregation=named_rows``: the server's record of which rows it averaged is
    checkpointed; without it a resumed client would take stale rows it never had."""
    clear = ("federated.strategy=fedcqa_fede", "federated.secure_aggregation.enabled=false",
             "federated.secure_aggregation.hide_aggregate=false", "federated.aggregation=named_rows",
             "train.reset_optimizer=false")
    with single_thread():
        straight = fit(tiny("gqe", "softmax", cache, 3, *clear), tmp_path / "straight")
        fit(tiny("gqe", "softmax", cache, 1, *clear), tmp_path / "resumed")
        resumed = fit(tiny("gqe", "softmax", cache, 3, *clear), tmp_path / "resumed")
    assert resumed["rounds"] == 3
    assert untimed(resumed) == untimed(straight)


def test_batch_types_draw_structures_by_set_size_or_uniformly(monkeypatch):
    """``task.batch_types``: ``size`` draws a batch's structure in proportion to its training
    set (a 10-query set against a 90-query one: 1 in 10 batches), ``uniform`` one in two."""
    from lightning_fedkg.methods.fedcqa.queries import QuerySet

    def one_p(n):
        return QuerySet("1p", torch.zeros(n, 2, dtype=torch.long), torch.arange(n + 1), torch.zeros(n, dtype=torch.long),
                        torch.zeros(n + 1, dtype=torch.long), torch.zeros(0, dtype=torch.long))

    sets = {"small": one_p(10), "large": one_p(90)}
    for types, share in (("size", 0.1), ("uniform", 0.5)):
        drawn = [b["structure"] for b in QueryBatches(sets, 2, seed=3, steps=4000, types=types)]
        assert abs(drawn.count("small") / 4000 - share) < 0.025, types  # 3 to 5 standard deviations
    with pytest.raises(ValueError, match="uniform"):
        QueryBatches(sets, 2, types="even")
    import lightning_fedkg.methods.fedcqa.task as task  # the config's choice reaches the batches

    monkeypatch.setattr(task, "graph_query_sets", lambda *args, **kwargs: {"train": sets})
    cfg = tiny("gqe", "softmax", Path("unused"), 1, "task.batch_types=uniform")
    assert task.QueryAnswering().build_datamodule(cfg, None, 0, "client_0").train_dataloader().dataset.types == "uniform"
