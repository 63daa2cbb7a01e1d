"""Recorded training steps (trainer.capture, lightning_fedkg.models.captured).

Without CUDA the recorder is :class:`EagerRecorder`, which replays a recording by calling the
step on its input buffers: what these tests check is the bookkeeping around a recording
(which batches are recorded, copied into the buffers and replayed, and when a recording is
dropped), with results bit-identical to the eager step. The CUDA test compares a real
recording with the eager step where a GPU exists.
"""

from __future__ import annotations

import copy
import json

import lightning as L
import pytest
import torch

from lightning_fedkg.config import ConfigError
from lightning_fedkg.data import KGDataModule, LoaderSettings, UniformSampler, load_kg
from lightning_fedkg.methods.fedlu import DistillationModule
from lightning_fedkg.models import KGEModule
from lightning_fedkg.models.captured import EagerRecorder, StepGraphs, make_capturable
from lightning_fedkg.run import fit

from conftest import make_small_config, single_thread


# ---------------------------------------------------------------------- StepGraphs alone
class Toy:
    """A step that adds each batch's ``x`` to a running total, with an optimizer stand-in
    the watch reports."""

    def __init__(self):
        self.total = torch.zeros(())
        self.owner = object()
        self.calls = 0

    def step(self, batch):
        self.calls += 1
        self.total += batch["x"].sum()
        return {"total": self.total.clone()}


def graphs_of(toy, warmup=2):
    return StepGraphs(toy.step, lambda: (toy.owner,), recorder=EagerRecorder(), warmup=warmup)


def test_a_signature_runs_eagerly_for_the_warmup_then_is_recorded_and_replayed_with_each_batch():
    toy = Toy()
    graphs = graphs_of(toy)
    outs = [graphs.run({"x": torch.full((3,), float(i)), "mode": "tail"})["total"].item() for i in range(1, 6)]
    # 3 + 6 + 9 + 12 + 15: every batch counted once, the recorded ones from their own buffers
    assert outs == [3.0, 9.0, 18.0, 30.0, 45.0]
    assert graphs.counts == {"eager": 2, "replayed": 3, "recorded": 1}
    assert toy.calls == 5  # a recording does not run the step by itself


def test_another_shape_or_plain_value_is_its_own_recording():
    toy = Toy()
    graphs = graphs_of(toy, warmup=1)
    for _ in range(2):
        graphs.run({"x": torch.ones(3), "mode": "tail"})
    graphs.run({"x": torch.ones(2), "mode": "tail"})  # the epoch's short last batch
    graphs.run({"x": torch.ones(3), "mode": "head"})
    assert graphs.counts == {"eager": 3, "replayed": 1, "recorded": 1}
    assert toy.total.item() == 3 + 3 + 2 + 3


def test_a_change_of_what_the_step_reads_drops_every_recording():
    toy = Toy()
    graphs = graphs_of(toy, warmup=1)
    for _ in range(3):
        graphs.run({"x": torch.ones(3)})
    assert graphs.counts["recorded"] == 1
    toy.owner = object()  # e.g. a new Adam for the next fit
    graphs.run({"x": torch.ones(3)})
    assert graphs.counts == {"eager": 2, "replayed": 2, "recorded": 1}


def test_a_failed_recording_trains_that_batch_and_every_later_one_eagerly():
    class Refusing(EagerRecorder):
        def record(self, step, inputs):
            raise RuntimeError("operation not permitted when stream is capturing")

    toy = Toy()
    graphs = StepGraphs(toy.step, lambda: (), recorder=Refusing(), warmup=1)
    outs = [graphs.run({"x": torch.ones(2)})["total"].item() for _ in range(4)]
    assert outs == [2.0, 4.0, 6.0, 8.0]
    assert graphs.counts == {"eager": 4, "replayed": 0, "recorded": 0}
    assert "not permitted" in graphs.failed


def test_make_capturable_keeps_the_moments_and_puts_the_step_count_on_the_parameters_device():
    param = torch.nn.Parameter(torch.ones(4))
    adam = torch.optim.Adam([param], lr=0.1)
    param.grad = torch.ones(4)
    adam.step()
    moment = adam.state[param]["exp_avg"].clone()
    make_capturable(adam)
    state = adam.state[param]
    assert adam.param_groups[0]["capturable"] is True
    assert torch.is_tensor(state["step"]) and state["step"].dtype == torch.float32 and state["step"].item() == 1
    assert torch.equal(state["exp_avg"], moment)


# ---------------------------------------------------------------------- modules
def train(module, kg, epochs=2):
    dm = KGDataModule(kg, UniformSampler(8), LoaderSettings(batch_size=1000), seed=0)
    trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu")
    with single_thread():
        trainer.fit(module, train_dataloaders=dm.train_dataloader())
    return trainer


def kge(kg):
    torch.manual_seed(0)
    return KGEModule("transe", num_entities=kg.num_entities, num_relations=kg.num_relations, dim=8, lr=0.05,
                     reset_optimizer=False)


def fedlu(kg):
    torch.manual_seed(0)
    return DistillationModule("transe", num_entities=kg.num_entities, num_relations=kg.num_relations, dim=8,
                              lr=0.05, loss="uniform")


@pytest.mark.parametrize("make", [kge, fedlu], ids=["kge", "fedlu"])
def test_a_recorded_step_trains_exactly_as_the_eager_step(make):
    kg = load_kg("umls")  # 5,216 train triples: 5 full batches of 1,000 and a short one per epoch
    eager, recorded = make(kg), make(kg)
    recorded.step_recorder = EagerRecorder()
    eager_trainer, recorded_trainer = train(eager, kg), train(recorded, kg)
    for (name, a), (_, b) in zip(eager.state_dict().items(), recorded.state_dict().items()):
        assert torch.equal(a, b), name
    assert eager_trainer.callback_metrics.keys() == recorded_trainer.callback_metrics.keys()
    for name, value in eager_trainer.callback_metrics.items():
        assert torch.equal(value, recorded_trainer.callback_metrics[name]), name
    graphs = recorded.step_graphs()
    # 5 full batches per epoch and a short one. The first step creates Adam's moments, a
    # change the watch sees, so the full batches' 2 warm-up steps start again from the second:
    # 3 eager, then recorded and replayed. The short one is eager in both epochs (its warm-up
    # is not over before the run is).
    assert graphs.counts == {"eager": 3 + 2, "replayed": 7, "recorded": 1}
    assert eager.step_graphs() is None  # on a CPU without a stand-in nothing is recorded


def test_the_watch_sees_a_new_optimizer_reloaded_moments_a_replaced_table_and_fedlu_flags():
    kg = load_kg("umls")
    module = fedlu(kg)
    module.step_recorder = EagerRecorder()
    train(module, kg, epochs=1)
    before = module._recording_watch()
    assert module._recording_watch() == before
    module.distill_local = not module.distill_local
    assert module._recording_watch() != before
    module.distill_local = not module.distill_local
    local_adam = module._optimizer_list(wrapped=False)[0]
    local_adam.load_state_dict(copy.deepcopy(local_adam.state_dict()))  # same Adam, new moment tensors (a resume)
    assert module._recording_watch() != before
    before = module._recording_watch()
    module.model.entity_emb.data = module.model.entity_emb.data.clone()
    assert module._recording_watch() != before


def test_a_regularizer_or_a_compiled_loss_runs_the_eager_step():
    kg = load_kg("umls")
    module = kge(kg)
    module.step_recorder = EagerRecorder()
    assert module.captures()
    module.regularizers.append(lambda: torch.zeros(()))
    assert not module.captures()
    module.regularizers.clear()
    module.compile_training = True
    assert not module.captures()
    module.compile_training, module.capture_steps = False, False
    assert not module.captures()


def test_capture_and_compile_together_are_refused():
    with pytest.raises(ConfigError, match="trainer.capture"):
        make_small_config("fede", "trainer.compile=true", "trainer.capture=true")


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fede", "fedlu"])
def test_a_federated_run_with_recorded_steps_equals_the_eager_run(strategy, tmp_path, monkeypatch):
    # FedE builds a fresh Adam every round and FedLU a fresh avatar Adam: each round's
    # recordings must be dropped and made anew, with every metric unchanged.
    cfg = make_small_config(strategy, "model.dim=16", "train.num_negatives=16", "train.batch_size=128",
                            "federated.rounds=2", "federated.eval_every=1", "federated.local_epochs=2",
                            "trainer.threads=1")
    made = []
    original = KGEModule.step_graphs

    def counting(self):
        graphs = original(self)
        if graphs is not None and graphs not in made:
            made.append(graphs)
        return graphs

    with single_thread():
        fit(cfg, tmp_path / "eager")
        monkeypatch.setattr(KGEModule, "step_recorder", EagerRecorder())
        monkeypatch.setattr(KGEModule, "step_graphs", counting)
        fit(cfg, tmp_path / "recorded")
    eager, recorded = (json.loads((tmp_path / name / "metrics.json").read_text()) for name in ("eager", "recorded"))
    drop = ("seconds",)
    assert {k: v for k, v in eager.items() if k not in drop} == {k: v for k, v in recorded.items() if k not in drop}
    assert made and all(g.counts["replayed"] > 0 for g in made)
    assert sum(g.counts["recorded"] for g in made) >= 2 * len(made)  # recorded again in round 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("make", [kge, fedlu], ids=["kge", "fedlu"])
def test_a_cuda_graph_step_trains_as_the_eager_step_within_rounding(make):
    # Both sides use the capturable Adam, so what differs is only eager kernels against their
    # replay (the embedding backward's atomics may round differently); one epoch, so that L1
    # distances do not amplify that rounding through sign changes.
    kg = load_kg("umls")
    eager, recorded = make(kg), make(kg)
    eager.step_graphs = lambda: None  # the eager step with the optimizer a recording would get
    for module in (eager, recorded):
        dm = KGDataModule(kg, UniformSampler(8), LoaderSettings(batch_size=500), seed=0)
        L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, accelerator="gpu", devices=1).fit(module, datamodule=dm)
    graphs = recorded.__dict__.get("_step_graphs")
    assert graphs is not None and graphs.failed is None and graphs.counts["replayed"] >= 5, graphs and graphs.counts
    for (name, a), (_, b) in zip(eager.state_dict().items(), recorded.state_dict().items()):
        if a.is_floating_point():
            assert (a - b).abs().max().item() < 1e-4, (name, (a - b).abs().max().item())
