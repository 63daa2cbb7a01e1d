"""federated.evaluate=before_aggregation: clients are validated and tested with the state
their own fit left (the official FedLU/FedE controllers' order), not with the aggregated rows.

Two tiny FedE runs on UMLS (3 clients, TransE dim 8, 2 rounds) that differ only in
``federated.evaluate``; every client's tables are copied aside right after each round's
training, and the reported metrics are checked against a brute-force ranking of those copies.
"""

import json
import shutil

import pytest
import torch

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.checkpoint import load_party, read_manifest
from lightning_fedkg.federated.entry import evaluate_federated_checkpoint, restore_finished_run
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.run import fit

from conftest import make_small_config, single_thread

ROUNDS = 2


SETTINGS = {
    "model.dim": 8, "train.lr": 0.05, "train.num_negatives": 16, "train.negative_mode": "shared",
    "federated.rounds": ROUNDS, "federated.local_epochs": 1, "federated.eval_every": 1, "federated.patience": 10,
}


def tiny_config(evaluate: str = "aggregated", **overrides):
    """The small federation (conftest) under FedE, dim 8, evaluated as ``evaluate`` says."""
    return make_small_config("fede", **{**SETTINGS, "federated.evaluate": evaluate, **overrides})


def brute_force_mrr(tables: dict, kg, split: str) -> float:
    """Filtered MRR over head and tail queries of ``split`` with TransE (L1) on ``tables``,
    ties counted as half (``train.ties=mean``), every other true triple of the client filtered."""
    ent, rel = tables["entity_emb"].double(), tables["relation_emb"].double()
    known = {tuple(t) for t in kg.all_true_triples().tolist()}
    reciprocal = []
    for h, r, t in kg.triples("valid" if split == "val" else split).tolist():
        for side, target in (("tail", t), ("head", h)):
            query = ent[h] + rel[r] if side == "tail" else ent[t] - rel[r]
            scores = -(query - ent).abs().sum(dim=1)
            s = scores[target]
            better = equal = 0
            for e in range(ent.shape[0]):
                triple = (h, r, e) if side == "tail" else (e, r, t)
                if e == target or triple in known:
                    continue
                better += int(scores[e] > s)
                equal += int(scores[e] == s)
            reciprocal.append(1.0 / (1 + better + equal / 2))
    return sum(reciprocal) / len(reciprocal)


def tables_of(party) -> dict:
    model = party.module.model
    return {"entity_emb": model.entity_emb.detach().clone(), "relation_emb": model.relation_emb.detach().clone()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{evaluate: (metrics, run_dir, {round: {client: tables after its fit}})}``."""
    real = FederatedRun.train_round
    out = {}
    with single_thread():
        for evaluate in ("aggregated", "before_aggregation"):
            fits: dict = {}

            def train_round(self, round, fits=fits):
                selected = real(self, round)
                fits[round] = {p.name: tables_of(p) for p in self.clients}
                return selected

            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(FederatedRun, "train_round", train_round)
                run_dir = tmp_path_factory.mktemp(evaluate)
                out[evaluate] = (fit(tiny_config(evaluate), run_dir), run_dir, fits)
    return out


def client_kgs():
    run = FederatedRun(tiny_config(), run_dir=None)
    try:
        return {p.name: p.kg for p in run.clients}
    finally:
        run.close()


@pytest.mark.slow
def test_validation_ranks_each_clients_state_after_its_own_fit(runs):
    metrics, _, fits = runs["before_aggregation"]
    kgs = client_kgs()
    assert [v["round"] for v in metrics["validation"]] == list(range(1, ROUNDS + 1))
    for entry in metrics["validation"]:
        for name, mrr in entry["clients"].items():
            expected = brute_force_mrr(fits[entry["round"]][name], kgs[name], "val")
            assert mrr == pytest.approx(expected, abs=1e-6), (entry["round"], name)


@pytest.mark.slow
def test_training_is_unchanged_and_the_aggregated_evaluation_differs(runs):
    agg_metrics, agg_dir, agg_fits = runs["aggregated"]
    pre_metrics, pre_dir, pre_fits = runs["before_aggregation"]
    # What clients train from is the next round's download either way.
    for r in range(1, ROUNDS + 1):
        for name, tables in agg_fits[r].items():
            assert all(torch.equal(tables[k], pre_fits[r][name][k]) for k in tables)
    kgs = client_kgs()
    for agg, pre in zip(agg_metrics["validation"], pre_metrics["validation"]):
        r = agg["round"]
        assert agg["clients"] != pre["clients"]
        # The aggregated validation ranks with the server's rows: a round's checkpoint restored
        # under evaluate=aggregated downloads them; under before_aggregation it keeps the fit.
        run, _ = restore_finished_run(tiny_config("aggregated"), agg_dir / "checkpoints" / f"round_{r:04d}.json")
        for p in run.clients:
            assert agg["clients"][p.name] == pytest.approx(brute_force_mrr(tables_of(p), kgs[p.name], "val"),
                                                           abs=1e-6)
        run.close()
        run, _ = restore_finished_run(tiny_config("before_aggregation"),
                                      pre_dir / "checkpoints" / f"round_{r:04d}.json")
        for p in run.clients:
            assert all(torch.equal(v, pre_fits[r][p.name][k]) for k, v in tables_of(p).items())
        run.close()


def read_log(run_dir):
    return [json.loads(line) for line in (run_dir / "channel_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_no_rows_cross_for_evaluation_before_aggregation(runs):
    # The evaluation request still crosses (it names the split) but carries no array.
    eval_names = {"eval_download", "test_download"}
    pre = [r for r in read_log(runs["before_aggregation"][1]) if r["name"] in eval_names]
    agg = [r for r in read_log(runs["aggregated"][1]) if r["name"] in eval_names]
    assert {r["name"] for r in pre} == {r["name"] for r in agg} == eval_names
    assert all(r["bytes"] == 0 and not r["shapes"] for r in pre)
    assert all(r["bytes"] > 0 and set(r["shapes"]) == {"entity_emb"} for r in agg)
    saved = sum(r["bytes"] for r in agg)
    assert runs["aggregated"][0]["bytes_sent"] - runs["before_aggregation"][0]["bytes_sent"] == saved


@pytest.mark.slow
def test_the_best_state_is_tested_as_it_was_validated(runs):
    metrics, run_dir, fits = runs["before_aggregation"]
    best = metrics["best_round"]
    kgs = client_kgs()
    # The best set holds each client's state after its own fit of the best round ...
    best_path = run_dir / "checkpoints" / "best.json"
    manifest = read_manifest(best_path)
    for name, tables in fits[best].items():
        module = load_party(best_path, manifest, name)["module"]
        assert all(torch.equal(module[f"model.{k}"], v) for k, v in tables.items())
    # ... and the final test ranks with exactly those tables.
    for entry in metrics["clients"]:
        assert entry["mrr"] == pytest.approx(brute_force_mrr(fits[best][entry["name"]], kgs[entry["name"]], "test"),
                                             abs=1e-6)
    # `fedkg test` of the finished run does the same.
    again = evaluate_federated_checkpoint(tiny_config("before_aggregation"), best_path)
    assert again["clients"] == metrics["clients"] and again["test"] == metrics["test"]


def test_loading_the_evaluation_state_sends_nothing_before_aggregation():
    # Unlearning's propagation ends with load_evaluation_state: a no-op here.
    run = FederatedRun(tiny_config("before_aggregation"), run_dir=None)
    try:
        run.train_round(1)
        before, records = {p.name: tables_of(p) for p in run.clients}, len(run.channel)
        assert not run.evaluation_download
        run.load_evaluation_state(1)
        assert len(run.channel) == records
        for p in run.clients:
            assert all(torch.equal(v, before[p.name][k]) for k, v in tables_of(p).items())
    finally:
        run.close()


def test_resume_keeps_the_evaluation_setting(runs, tmp_path):
    run_dir = shutil.copytree(runs["before_aggregation"][1], tmp_path / "run")
    with pytest.raises(ConfigError, match="federated.evaluate"):
        fit(tiny_config("aggregated", **{"federated.rounds": ROUNDS + 1}), run_dir)


def test_an_unknown_value_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"federated.evaluate.*'aggregated', 'before_aggregation'"):
        tiny_config("after")


def test_a_centralised_reference_refuses_before_aggregation():
    with pytest.raises(ConfigError, match="train none"):
        FederatedRun(tiny_config("before_aggregation", **{"federated.strategy": "entire"}), run_dir=None)


@pytest.mark.slow
def test_fedlu_avatar_eval_before_aggregation_is_the_same_behaviour(tmp_path):
    # FedLU downloads only the avatar: its own option and the core one evaluate the same states.
    common = {"federated.strategy": "fedlu", "model.dim": 8, "train.loss": "uniform"}
    core = fit(tiny_config("before_aggregation", **common), tmp_path / "core")
    own = fit(tiny_config("aggregated", **common, **{"federated.fedlu.avatar_eval": "before_aggregation"}),
                        tmp_path / "own")
    for key in ("test", "clients", "validation", "test_global", "bytes_sent", "wire_bytes"):
        assert core[key] == own[key], key
    assert core["distillation"]["validation"] == own["distillation"]["validation"]
