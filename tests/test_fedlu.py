"""FedLU: the distillation module, the validation gate, the strategy end to end."""

import json
import math

import lightning as L
import pytest
import torch

from lightning_fedkg.config import load_config
from lightning_fedkg.data import KGDataModule, LoaderSettings, UniformSampler, load_kg
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.run import fit
from lightning_fedkg.methods.fedlu.strategy import DistillationGate
from lightning_fedkg.methods.fedlu import DistillationModule
from lightning_fedkg.methods.fedlu.distillation import distillation_kl

BASE = ["data.name=umls", "model.dim=16", "train.num_negatives=16", "train.negative_mode=shared", "train.lr=0.02",
        "train.loss=uniform", "trainer.accelerator=cpu", "trainer.progress_bar=false", "federated.local_epochs=1",
        "federated.eval_every=1", "federated.strategy=fedlu"]


def tiny_module(**kwargs) -> DistillationModule:
    torch.manual_seed(0)
    return DistillationModule("transe", num_entities=6, num_relations=2, dim=4, lr=0.1, loss="uniform", **kwargs)


def a_batch() -> dict:
    positive = torch.tensor([[0, 0, 1], [2, 1, 3], [4, 0, 5]])
    negatives = torch.tensor([[2, 3, 4], [0, 1, 5], [1, 2, 3]])
    return {"positive": positive, "negatives": negatives, "mode": "tail"}


# ---------------------------------------------------------------------- the KL term
def test_kl_by_hand():
    student = torch.tensor([[0.0, 0.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0]])  # P_teacher = (3/4, 1/4), P_student = (1/2, 1/2)
    expected = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    assert distillation_kl(student, teacher).item() == pytest.approx(expected, rel=1e-6)
    assert distillation_kl(teacher, teacher).item() == pytest.approx(0.0, abs=1e-7)


def test_kl_is_zero_when_local_and_global_agree():
    module = tiny_module()  # the avatar starts as a copy of the local table
    for side in ("local", "global"):
        _, kl = module.side_losses(a_batch(), side)
        assert kl.item() == pytest.approx(0.0, abs=1e-7)
    with torch.no_grad():
        module.avatar.entity_emb.add_(0.3 * torch.randn_like(module.avatar.entity_emb))
    assert module.side_losses(a_batch(), "local")[1].item() > 1e-4


def test_the_relation_table_is_shared_and_distillation_flags_switch_the_term():
    module = tiny_module(distill_local=False, distill_global=True)
    assert module.avatar.relation_emb is module.model.relation_emb
    with torch.no_grad():
        module.avatar.entity_emb.add_(0.3 * torch.randn_like(module.avatar.entity_emb))
    assert module.side_losses(a_batch(), "local")[1].item() == 0.0  # avatar→local is off
    assert module.side_losses(a_batch(), "global")[1].item() > 0.0


def test_distillation_flags_travel_with_the_weights():
    module = tiny_module(distill_local=False, distill_global=False)
    module.distill_global = True
    with torch.no_grad():
        module.avatar.entity_emb.add_(0.3 * torch.randn_like(module.avatar.entity_emb))
    assert module.state_dict()["flags"].tolist() == [False, True]
    other = tiny_module(distill_local=True, distill_global=False)
    other.load_state_dict(module.state_dict())
    assert (other.distill_local, other.distill_global) == (False, True)
    # the loaded flags are the ones used: the sides differ, yet only avatar←local distils
    assert other.side_losses(a_batch(), "local")[1].item() == 0.0
    assert other.side_losses(a_batch(), "global")[1].item() > 0.0


def test_gradients_reach_only_the_student():
    module = tiny_module()
    with torch.no_grad():
        module.avatar.entity_emb.add_(0.3 * torch.randn_like(module.avatar.entity_emb))
    module.training_loss(a_batch()).backward()  # local objective: the avatar is the (detached) teacher
    assert module.avatar.entity_emb.grad is None
    assert module.model.entity_emb.grad.abs().sum() > 0 and module.model.relation_emb.grad.abs().sum() > 0


def test_a_training_step_never_moves_relations_through_the_avatar_step(one_thread):
    kg = load_kg("umls")
    module = DistillationModule("transe", num_entities=kg.num_entities, num_relations=kg.num_relations, dim=8,
                                lr=0.05, loss="uniform")
    # The local objective is made gradient-free, so anything that moves comes from the avatar step.
    module.training_loss = lambda batch: sum((p * 0).sum() for p in module.local_parameters())
    relations, local = module.model.relation_emb.detach().clone(), module.model.entity_emb.detach().clone()
    avatar = module.avatar.entity_emb.detach().clone()
    dm = KGDataModule(kg, UniformSampler(8), LoaderSettings(batch_size=1024), seed=0)
    trainer = L.Trainer(max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    trainer.fit(module, train_dataloaders=dm.train_dataloader())
    assert torch.equal(module.model.relation_emb.detach(), relations)
    assert torch.equal(module.model.entity_emb.detach(), local)
    assert not torch.equal(module.avatar.entity_emb.detach(), avatar)


def test_the_local_optimizer_persists_and_the_avatars_is_rebuilt():
    module = tiny_module()
    local_a, global_a = module.configure_optimizers()
    local_b, global_b = module.configure_optimizers()
    assert local_a is local_b and global_a is not global_b
    assert {id(p) for g in local_a.param_groups for p in g["params"]} == {id(p) for p in module.model.parameters()}
    assert [p for g in global_a.param_groups for p in g["params"]] == module.avatar_parameters()


def test_only_the_avatar_is_declared_shareable():
    module = tiny_module()
    groups = module.shareable_groups()
    assert list(groups) == ["avatar"]
    assert list(groups["avatar"].tensors) == ["avatar_entity_emb"]
    assert groups["avatar"].tensors["avatar_entity_emb"] is module.avatar.entity_emb


# ---------------------------------------------------------------------- the gate
def test_the_gate_follows_the_official_rules():
    gate = DistillationGate(schedule="gated", wait_rounds=20)
    gate.update(5, 0.30, 0.20)  # both improve from 0: nothing switches
    assert gate.flags() == {"distill_local": False, "distill_global": False}
    gate.update(10, 0.29, 0.25)  # only the avatar improved: local→avatar
    assert gate.flags() == {"distill_local": False, "distill_global": True} and gate.global_on_round == 10
    gate.update(15, 0.35, 0.24)  # only the local side improved: avatar→local
    assert gate.flags() == {"distill_local": True, "distill_global": True} and gate.local_on_round == 15
    assert (gate.best_local, gate.best_global) == (0.35, 0.25)

    stalled = DistillationGate(schedule="gated", wait_rounds=20)
    stalled.update(5, 0.3, 0.3)
    stalled.update(10, 0.2, 0.2)  # neither improved: both on
    assert stalled.flags() == {"distill_local": True, "distill_global": True}

    plateau = DistillationGate(schedule="gated", wait_rounds=20)
    plateau.update(5, 0.3, 0.3)
    plateau.update(20, 0.3005, 0.5)  # both improved, but the local gain is a plateau at t >= wait
    assert plateau.flags() == {"distill_local": False, "distill_global": True}
    early = DistillationGate(schedule="gated", wait_rounds=20)
    early.update(5, 0.3, 0.3)
    early.update(15, 0.3005, 0.5)  # the same before wait_rounds: nothing
    assert early.flags() == {"distill_local": False, "distill_global": False}


def test_the_always_schedule_distils_from_the_start():
    gate = DistillationGate(schedule="always")
    assert gate.flags() == {"distill_local": True, "distill_global": True}
    gate.update(5, 0.1, 0.1)
    gate.update(10, 0.05, 0.05)
    assert gate.flags() == {"distill_local": True, "distill_global": True} and len(gate.validation) == 2


# ---------------------------------------------------------------------- the strategy
@pytest.mark.slow
def test_fedlu_run_reports_local_and_global_results_and_only_avatars_cross(tmp_path, one_thread):
    cfg = load_config(None, BASE + ["federated.rounds=3", "federated.record_payloads=true",
                                    "federated.fedlu.schedule=always"])
    metrics = fit(cfg, tmp_path)
    assert metrics["strategy"] == "fedlu" and metrics["distillation"]["schedule"] == "always"
    assert metrics["distillation"]["local_on_round"] == 0
    assert [v["round"] for v in metrics["distillation"]["validation"]] == [1, 2, 3]
    glob = metrics["test_global"]
    assert len(glob["clients"]) == len(metrics["clients"]) == 3
    for local, avatar in zip(metrics["clients"], glob["clients"]):
        assert local["name"] == avatar["name"] and local["triples"] == avatar["triples"] > 0
        assert 0 < local["mrr"] <= 1 and 0 < avatar["mrr"] <= 1 and local["mrr"] != avatar["mrr"]
        assert not any(k.startswith("global/") for k in local)
    # The wire: alignment digests in round 0, then avatar rows only; never a relation or a
    # local entity table.
    records = [json.loads(line) for line in (tmp_path / "channel_log.jsonl").read_text().splitlines()]
    names = {n for r in records if r["round"] >= 1 for n in r["shapes"]}
    assert names == {"avatar_entity_emb"}
    assert {n for r in records if r["round"] == 0 for n in r["shapes"]} == {"entity_digests"}


def test_fedlu_clients_keep_separate_local_tables_and_the_gate_state_resumes(tmp_path, one_thread):
    cfg = load_config(None, BASE + ["federated.rounds=2"])
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    run.train_round(1)
    for party in run.clients:
        m = party.module
        assert bool(m.local_initialized)
        # local rows were initialised from the first avatar, then trained apart from it
        assert not torch.equal(m.model.entity_emb, m.avatar.entity_emb)
        assert party.state_dict()["optimizer"] is not None  # the local Adam is checkpointed
    run.evaluate("val", 1)
    state = run.server.state_dict()
    assert state["gate"]["validation"][0]["round"] == 1
    other = FederatedRun(cfg, run_dir=None)
    other.server.load_state_dict(state)
    assert other.server.gate == run.server.gate


@pytest.mark.slow
def test_fedlu_learns_on_umls(fedlu_umls_run):
    # Six rounds, dim 32 (conftest's FEDLU_UMLS): both sides must rank far better than chance (~0.04).
    metrics, _ = fedlu_umls_run  # measured: local 0.56, avatar 0.44
    assert metrics["test"]["mrr"] > 0.45, metrics["test"]
    assert metrics["test_global"]["mrr"] > 0.35, metrics["test_global"]


@pytest.mark.slow
def test_a_resumed_fedlu_run_equals_an_uninterrupted_one(tmp_path, one_thread):
    # Gate state, distillation flags, local_initialized and the local Adam all persist.
    base = BASE + ["federated.fedlu.wait_rounds=0"]
    straight = fit(load_config(None, base + ["federated.rounds=4"]), tmp_path / "straight")
    fit(load_config(None, base + ["federated.rounds=2"]), tmp_path / "resumed")
    resumed = fit(load_config(None, base + ["federated.rounds=4"]), tmp_path / "resumed")
    for metrics in (straight, resumed):
        metrics.pop("seconds")
    assert resumed == straight


@pytest.mark.parametrize("avatar_eval", ["aggregated", "before_aggregation"])
def test_the_avatar_is_evaluated_as_trained_or_as_aggregated(avatar_eval, one_thread):
    cfg = load_config(None, BASE + ["federated.rounds=1", f"federated.fedlu.avatar_eval={avatar_eval}"])
    run = FederatedRun(cfg, run_dir=None)
    run.align()
    run.train_round(1)
    trained = {p.name: p.module.avatar.entity_emb.detach().clone() for p in run.clients}
    aggregated = {p.name: run.server.rows(p.name)["avatar_entity_emb"] for p in run.clients}
    run.evaluate("val", 1)
    for party in run.clients:
        evaluated = party.module.avatar.entity_emb.detach()
        assert not torch.equal(trained[party.name], aggregated[party.name])
        expected = trained if avatar_eval == "before_aggregation" else aggregated
        assert torch.equal(evaluated, expected[party.name])
    downloads = [r for r in run.channel.records(round=1) if r.receiver != "server" and r.bytes > 0]
    trained_downloads = len(run.clients)  # the round's training download
    assert len(downloads) == trained_downloads + (0 if avatar_eval == "before_aggregation" else len(run.clients))
