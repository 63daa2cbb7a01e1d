"""Federated unlearning (FedLU §4.3): losses, forgetting sets, the MIA AUC, ``fedkg unlearn`` end to end."""

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from lightning_fedkg.cli import main
from lightning_fedkg.config import ConfigError, load_config
from lightning_fedkg.data.kg import triple_keys
from lightning_fedkg.run import fit
from lightning_fedkg.methods.fedlu.phase import membership_auc, run_unlearn, sample_forget_set, split_retain
from lightning_fedkg.methods.fedlu.client_unlearning import confusion_loss

from conftest import FEDLU_UMLS, single_thread

#: The source run's settings: conftest's FedLU run on UMLS (shared with test_fedlu).
SOURCE = FEDLU_UMLS
#: An aggressive unlearning (the issue's bar: forgotten MRR at most half, test within 10%).
#: UMLS is so regular that a model retrained without the forgotten triples still ranks them
#: at ~90% of the original MRR, so reaching the bar means forgetting more than retraining does.
AGGRESSIVE = ["unlearn.forget=sample", "unlearn.fraction=0.05", "unlearn.lr=0.01", "unlearn.interference_epochs=20",
              "unlearn.decay_epochs=3", "unlearn.forget_weight=30"]


def test_confusion_loss_by_hand():
    # Uniform negatives, all scores 0: hard = ½ (w·log 2 + log 2), soft = ‖0‖ = 0.
    zero = confusion_loss(torch.zeros(1), torch.zeros(1, 2), forget_weight=10.0, mu_soft=1.0)
    assert zero.item() == pytest.approx(0.5 * 11 * math.log(2), rel=1e-6)
    # Soft term alone: the gap vector (4 - 1, 1 - 1) has norm 3.
    hard = confusion_loss(torch.tensor([1.0]), torch.tensor([[4.0, 1.0]]), 10.0, 0.0)
    both = confusion_loss(torch.tensor([1.0]), torch.tensor([[4.0, 1.0]]), 10.0, 0.5)
    assert (both - hard).item() == pytest.approx(1.5, rel=1e-6)


def test_confusion_loss_weights_the_hard_term_by_subsampling_weights():
    positive, negatives = torch.tensor([0.0, 2.0]), torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    # per row: -log σ(-s) is log 2 (row 0) and log(1 + e²) (row 1), for the forgotten triple
    # and for the mean over its negatives alike; weights 3 : 1
    weighted = confusion_loss(positive, negatives, 10.0, 0.0, weight=torch.tensor([3.0, 1.0]))
    want = 0.5 * 11 * (3 * math.log(2) + math.log(1 + math.e ** 2)) / 4
    assert weighted.item() == pytest.approx(want, rel=1e-6)
    equal = confusion_loss(positive, negatives, 10.0, 0.5, weight=torch.tensor([0.7, 0.7]))
    assert equal.item() == pytest.approx(confusion_loss(positive, negatives, 10.0, 0.5).item(), rel=1e-6)


@pytest.mark.parametrize("step", ["interference_loss", "decay_loss"])
@pytest.mark.parametrize("student", ["local", "global"])
def test_unlearning_losses_use_the_batch_weights(step, student):
    from lightning_fedkg.methods.fedlu import DistillationModule
    from lightning_fedkg.methods.fedlu.client_unlearning import UnlearningModule, UnlearningSettings

    torch.manual_seed(0)
    module = DistillationModule("transe", num_entities=6, num_relations=2, dim=4, loss="uniform")
    with torch.no_grad():
        module.avatar.entity_emb.add_(0.3 * torch.randn_like(module.avatar.entity_emb))
    batch = {"positive": torch.tensor([[0, 0, 1], [2, 1, 3]]), "negatives": torch.tensor([[4, 5], [0, 5]]),
             "mode": "tail"}

    def loss(weight):
        unlearning = UnlearningModule(module, UnlearningSettings())
        return getattr(unlearning, step)(dict(batch, **({} if weight is None else {"weight": weight})), student).item()

    assert loss(torch.tensor([0.5, 0.5])) == pytest.approx(loss(None), rel=1e-6)
    assert loss(torch.tensor([5.0, 1.0])) != pytest.approx(loss(None), rel=1e-3)


def test_confusion_loss_leaves_masked_negatives_out():
    positive = torch.tensor([0.5, -1.0])
    negatives = torch.tensor([[2.0, -3.0, 7.0], [0.0, 9.0, 1.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    kept = torch.tensor([[2.0, -3.0], [0.0, 1.0]])  # the valid negatives, two per row
    for loss in ("uniform", "self_adversarial"):
        masked = confusion_loss(positive, negatives, 10.0, 0.3, loss, negative_mask=mask)
        assert masked.item() == pytest.approx(confusion_loss(positive, kept, 10.0, 0.3, loss).item(), rel=1e-6)
        everything = torch.ones_like(mask)
        assert confusion_loss(positive, negatives, 10.0, 0.3, loss, negative_mask=everything).item() == \
            pytest.approx(confusion_loss(positive, negatives, 10.0, 0.3, loss).item(), rel=1e-6)


def _module_and_batch():
    from lightning_fedkg.methods.fedlu import DistillationModule

    torch.manual_seed(0)
    module = DistillationModule("transe", num_entities=8, num_relations=2, dim=4, loss="self_adversarial")
    with torch.no_grad():
        module.avatar.entity_emb.add_(0.3 * torch.randn_like(module.avatar.entity_emb))
    batch = {"positive": torch.tensor([[0, 0, 1], [2, 1, 3]]), "negatives": torch.tensor([[4, 5, 6], [0, 5, 7]]),
             "negative_mask": torch.tensor([[True, False, True], [True, True, False]]), "mode": "tail"}
    return module, batch


@pytest.mark.parametrize("step", ["interference_loss", "decay_loss"])
@pytest.mark.parametrize("student", ["local", "global"])
def test_unlearning_losses_ignore_masked_negatives(step, student):
    """A masked negative is a known true triple: which entity it is must not change any
    unlearning loss (confusion, prediction, the KL of the avatar's distillation)."""
    from lightning_fedkg.methods.fedlu.client_unlearning import UnlearningModule, UnlearningSettings

    module, batch = _module_and_batch()

    def loss(negatives):
        return getattr(UnlearningModule(module, UnlearningSettings()), step)(dict(batch, negatives=negatives),
                                                                              student).item()

    swapped = batch["negatives"].clone()
    swapped[~batch["negative_mask"]] = torch.tensor([1, 2])  # other entities in the masked slots
    assert loss(swapped) == pytest.approx(loss(batch["negatives"]), rel=1e-6)
    unmasked = batch["negatives"].clone()
    unmasked[0, 0] = 1  # a valid slot does count
    assert loss(unmasked) != pytest.approx(loss(batch["negatives"]), rel=1e-4)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("official", [False, True])
def test_unlearning_update_counts(official, grouped, monkeypatch):
    """Ours: 1 local + 1 avatar interference step per forget batch and epoch, 1 decay step per
    retained batch (sides alternating). The official code's: 2 + 2 (an avatar pass, a local
    pass, then avatar + local per batch) and 5 decay steps per batch. ``grouped``: the
    loaders yield lists of batches (``train.batches_per_step`` > 1), the same steps. The
    schedule runs in UnlearningModule.training_step, fit by a Trainer."""
    from lightning_fedkg.methods.fedlu.client_unlearning import ClientUnlearner, UnlearningModule, UnlearningSettings

    module, batch = _module_and_batch()
    calls = []
    monkeypatch.setattr(UnlearningModule, "interference_step",
                        lambda self, b, student="local": calls.append(("interfere", b["id"], student)) or 0.0)
    monkeypatch.setattr(UnlearningModule, "decay_step",
                        lambda self, b, student="local", distill=True: calls.append(("decay", b["id"], student, distill))
                        or 0.0)
    settings = UnlearningSettings(interference_epochs=2, decay_epochs=1, official_updates=official)
    unlearner = ClientUnlearner(module, settings)
    two = [dict(batch, id=0), dict(batch, id=1)]
    batches = (lambda: [two]) if grouped else (lambda: two)
    unlearner.interfere(batches)
    scores = iter([0.1, 0.2])
    unlearner.decay(batches, lambda: next(scores))
    interference = [c for c in calls if c[0] == "interfere"]
    decay = [c[1:] for c in calls if c[0] == "decay"]
    if not official:
        assert interference == [("interfere", b, s) for _ in range(2) for b in (0, 1) for s in ("local", "global")]
        assert decay == [(0, "local", True), (1, "global", True)]
    else:
        epoch = ([("interfere", b, "global") for b in (0, 1)] + [("interfere", b, "local") for b in (0, 1)]
                 + [("interfere", b, s) for b in (0, 1) for s in ("global", "local")])
        assert interference == epoch * 2
        five = [("local", False), ("global", False), ("global", True), ("global", False), ("local", True)]
        assert decay == [(b, *step) for b in (0, 1) for step in five]


def _small_kg(n_ent: int = 40, n_rel: int = 4, n_train: int = 300):
    """Random distinct triples: ``n_train`` train, 30 valid, 30 test."""
    from lightning_fedkg.data.kg import KnowledgeGraph

    keys = torch.randperm(n_ent * n_rel * n_ent, generator=torch.Generator().manual_seed(0))[: n_train + 60]
    triples = torch.stack([keys // (n_rel * n_ent), (keys // n_ent) % n_rel, keys % n_ent], dim=1)
    return KnowledgeGraph({"train": triples[:n_train], "valid": triples[n_train:n_train + 30],
                           "test": triples[n_train + 30:]}, n_ent, n_rel)


def _unlearning_setup(learner: str, *overrides: str):
    """A FedLU (its avatar apart from its local table) or FedE learner over :func:`_small_kg`,
    a maker of its forget and retain data modules (the first 48 train triples and the rest)
    and the unlearning settings of ``overrides``."""
    from lightning_fedkg.builders import build_datamodule
    from lightning_fedkg.methods.fedlu import DistillationModule
    from lightning_fedkg.methods.fedlu.phase import _settings, _view
    from lightning_fedkg.models import KGEModule

    kg = _small_kg()
    cfg = load_config(None, SOURCE + ["unlearn.lr=0.01", "unlearn.batch_size=16", *overrides])
    torch.manual_seed(0)
    kind = DistillationModule if learner == "fedlu" else KGEModule
    module = kind("transe", num_entities=kg.num_entities, num_relations=kg.num_relations, dim=8,
                  loss="self_adversarial")
    if learner == "fedlu":
        with torch.no_grad():
            module.avatar.entity_emb.add_(0.3 * torch.randn_like(module.avatar.entity_emb))
    train = kg.triples("train")

    def datamodules():
        return (build_datamodule(_view(kg, train[:48], {}), cfg, seed=1, batch_size=16),
                build_datamodule(_view(kg, train[48:], {}), cfg, seed=2, batch_size=16))

    return module, datamodules, _settings(cfg.unlearn, cfg.train.lr)


def test_unlearning_module_trains_under_a_plain_trainer(one_thread):
    """Both stages fit by a plain Trainer: each step's loss is finite, the entity tables of
    both sides move, the shared relation table does not."""
    import lightning as L

    from lightning_fedkg.methods.fedlu.client_unlearning import Passes, UnlearningModule

    class Recording(UnlearningModule):
        def interference_step(self, batch, student="local"):
            loss = super().interference_step(batch, student)
            self.seen.append(("interference", student, loss))
            return loss

        def decay_step(self, batch, student="local", distill=True):
            loss = super().decay_step(batch, student, distill)
            self.seen.append(("decay", student, loss))
            return loss

    module, datamodules, settings = _unlearning_setup("fedlu")
    forget_dm, retain_dm = datamodules()
    unlearning = Recording(module, settings)
    unlearning.seen = []

    def tables():
        return [t.detach().clone() for t in (module.model.entity_emb, module.avatar.entity_emb,
                                             module.model.relation_emb)]

    def fit(epochs, make, passes):
        trainer = L.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(unlearning, train_dataloaders=Passes(make, passes))
        return trainer

    for stage, epochs, make in (("interference", 2, forget_dm.train_dataloader),
                                ("decay", 1, retain_dm.train_dataloader)):
        before = tables()
        unlearning.stage = stage
        unlearning.fresh_optimizers()
        unlearning.seen.clear()
        trainer = fit(epochs, make, len(unlearning.interference_passes()) if stage == "interference" else 1)
        # interference: both sides per batch; decay: one side per batch, alternating
        steps = epochs * len(make()) * (2 if stage == "interference" else 1)
        assert len(unlearning.seen) == steps and trainer.global_step == steps
        assert {student for _, student, _ in unlearning.seen} == {"local", "global"}
        assert all(s == stage and torch.isfinite(loss) for s, _, loss in unlearning.seen)
        after = tables()
        assert not torch.equal(before[0], after[0]) and not torch.equal(before[1], after[1])
        assert torch.equal(before[2], after[2])  # relations stay frozen


@pytest.mark.parametrize("batches_per_step", [1, 3])
@pytest.mark.parametrize("official", [False, True])
@pytest.mark.parametrize("learner", ["fedlu", "fede"])
def test_client_unlearner_is_the_plain_loop_bit_for_bit(learner, official, batches_per_step, one_thread):
    """The Trainer's fits of UnlearningModule give the tables, decay scores, sampler states
    and global RNG of the plain loop they replaced (tests/plain_loops.py); the scripted
    validation improves once, then falls, so the decay also restores its best epoch."""
    import copy

    from plain_loops import PlainClientUnlearner

    from lightning_fedkg.methods.fedlu.client_unlearning import ClientUnlearner

    module, datamodules, settings = _unlearning_setup(
        learner, "unlearn.interference_epochs=2", "unlearn.decay_epochs=3",
        f"unlearn.official_updates={str(official).lower()}", f"train.batches_per_step={batches_per_step}")
    results = []
    for unlearner_class in (PlainClientUnlearner, ClientUnlearner):
        copy_ = copy.deepcopy(module)
        forget_dm, retain_dm = datamodules()
        validation = iter([0.1, 0.3, 0.2])
        torch.manual_seed(5)
        unlearner = unlearner_class(copy_, settings)
        unlearner.interfere(forget_dm.train_dataloader)
        scores = unlearner.decay(retain_dm.train_dataloader, lambda: next(validation))
        results.append((scores, copy_.state_dict(), torch.get_rng_state(), forget_dm.generator.get_state(),
                        retain_dm.generator.get_state()))
    (scores0, state0, *rngs0), (scores1, state1, *rngs1) = results
    assert scores0 == scores1 == [0.1, 0.3, 0.2]
    assert state0.keys() == state1.keys() and all(torch.equal(state0[k], state1[k]) for k in state0)
    assert all(torch.equal(a, b) for a, b in zip(rngs0, rngs1))
    assert not torch.equal(state1["model.entity_emb"], module.state_dict()["model.entity_emb"])


@pytest.mark.parametrize("extra", [[], ["unlearn.official_updates=true", "train.batches_per_step=3",
                                        "unlearn.batch_size=16", "unlearn.fraction=0.05"]])
def test_unlearn_client_on_the_party_trainer_is_the_plain_loop(source_run, extra):
    """``unlearn_client`` fits the unlearning with the party's own Trainer (validated
    between the decay's fits by the same Trainer): the party's tables, the decay's
    validation MRRs and the global RNG are those of the plain loop, bit for bit."""
    from plain_loops import plain_unlearn_client

    from lightning_fedkg.federated.entry import load_run_from
    from lightning_fedkg.methods.fedlu.phase import forget_sets, retain_only, unlearn_client

    cfg = load_config(None, SOURCE + ["unlearn.forget=sample", "unlearn.interference_epochs=2",
                                      "unlearn.decay_epochs=3", "unlearn.lr=0.01"] + extra)
    results = []
    for unlearn in (plain_unlearn_client, unlearn_client):
        _, run = load_run_from(source_run, sections=("unlearn",))
        party = run.clients[0]
        forget = forget_sets(cfg.unlearn, run.clients)[party.name]
        retain_only(party, forget, cfg.seed)
        torch.manual_seed(5)
        scores = unlearn(party, forget, cfg)
        results.append((scores, {k: v.clone() for k, v in party.module.state_dict().items()},
                        torch.get_rng_state()))
        run.close()
    (scores0, state0, rng0), (scores1, state1, rng1) = results
    assert scores0 == scores1 and len(scores1) >= 2
    assert all(torch.equal(state0[k], state1[k]) for k in state0)
    assert torch.equal(rng0, rng1)


def test_retrain_budget_is_the_source_rounds_plus_the_unlearning_training():
    from lightning_fedkg.methods.fedlu.phase import retrain_budget

    cfg = load_config(None, SOURCE + ["federated.local_epochs=3", "unlearn.propagate_rounds=2"])
    # decay validations: client_0 ran 4 epochs (5 scores), client_1 1 epoch
    budget = retrain_budget(cfg, 20, {"client_0": [0.1, 0.2, 0.3, 0.4, 0.35], "client_1": [0.5, 0.4]})
    assert budget["decay_epochs"] == {"client_0": 4, "client_1": 1}
    assert budget["retrain_rounds"] == budget["equal_rounds"] == 20 + 2 + 2  # ⌈4 / 3⌉ + propagation
    fixed = load_config(None, SOURCE + ["unlearn.retrain_rounds=7"])
    assert retrain_budget(fixed, 20, {})["retrain_rounds"] == 7


def test_split_retain_removes_every_copy_of_the_forgotten_triples():
    train = torch.tensor([[0, 0, 1], [1, 0, 2], [0, 0, 1], [2, 1, 0]])
    retain = split_retain(train, torch.tensor([[0, 0, 1]]), 3, 2)
    assert retain.tolist() == [[1, 0, 2], [2, 1, 0]]


def test_sampled_forgetting_sets_keep_every_entity_and_relation_in_the_retained_triples():
    g = torch.Generator().manual_seed(0)
    train = torch.randint(0, 30, (400, 3))
    train[:, 1] %= 5
    forget = sample_forget_set(train, 0.2, g, 30, 5)
    assert len(forget) == 80
    retain = split_retain(train, forget, 30, 5)
    for column, size in ((0, 30), (1, 5)):
        present = torch.zeros(size, dtype=torch.bool)
        used = train[:, [0, 2]].reshape(-1) if column == 0 else train[:, 1]
        kept = retain[:, [0, 2]].reshape(-1) if column == 0 else retain[:, 1]
        present[used] = True
        assert bool(torch.isin(torch.nonzero(present).squeeze(1), kept).all())
    again = sample_forget_set(train, 0.2, torch.Generator().manual_seed(0), 30, 5)
    assert torch.equal(forget, again)
    assert bool(torch.isin(triple_keys(forget, 30, 5), triple_keys(train, 30, 5)).all())


class FixedScores(torch.nn.Module):
    """A 'model' whose score of (h, r, t) is a table entry of h."""

    def __init__(self, scores):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(scores))

    def forward(self, h, r, t):
        return self.table[h]


def test_membership_auc_equals_the_pairwise_count():
    scores = [0.9, 0.3, 0.5, 0.5, 0.1, 0.7, 0.5]
    model = FixedScores(scores)
    members = torch.tensor([[0, 0, 0], [2, 0, 0], [5, 0, 0]])
    others = torch.tensor([[1, 0, 0], [3, 0, 0], [4, 0, 0], [6, 0, 0]])
    pairs = [(scores[m], scores[o]) for m in (0, 2, 5) for o in (1, 3, 4, 6)]
    brute = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs) / len(pairs)
    assert membership_auc(model, members, others) == pytest.approx(brute)
    assert math.isnan(membership_auc(model, members[:0], others))


def tree_hash(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def source_run(fedlu_umls_run):
    """The shared FedLU run's folder; this module's tests unlearn from it on one thread."""
    with single_thread():
        yield fedlu_umls_run[1]


@pytest.mark.slow
def test_unlearning_forgets_keeps_the_rest_and_leaves_the_source_alone(source_run, tmp_path):
    before_hash = tree_hash(source_run)
    out = tmp_path / "unlearned"
    metrics = run_unlearn(load_config(None, SOURCE + AGGRESSIVE), source_run, out)
    assert tree_hash(source_run) == before_hash  # not one byte of the source run changed

    before, after, retrain = metrics["before"], metrics["after"], metrics["retrain"]
    assert after["forget"]["mrr"] <= 0.5 * before["forget"]["mrr"], (before["forget"], after["forget"])
    assert after["test"]["mrr"] >= 0.9 * before["test"]["mrr"], (before["test"], after["test"])
    # Membership inference: the trained model gives its training triples away; the retrained
    # one cannot tell the forgotten triples from test triples.
    assert before["mia_auc"] > 0.55 and abs(retrain["mia_auc"] - 0.5) < 0.15
    assert after["mia_auc"] < before["mia_auc"]
    assert metrics["mia_auc"] == {k: metrics[k]["mia_auc"] for k in ("before", "after", "retrain")}
    for block in (before, after, retrain):
        assert {"forget", "test", "seconds", "mia_auc", "clients"} <= set(block)
        assert {"mrr", "hits@1", "hits@10", "count"} <= set(block["forget"])
    assert after["seconds"] > 0 and retrain["seconds"] > 0 and before["seconds"] > 0
    assert metrics["forget"]["triples"] == before["forget"]["count"] // 2  # head and tail queries
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk["after"]["forget"] == after["forget"] and on_disk["source"] == str(source_run)
    # The propagation round moved avatars only.
    records = [json.loads(line) for line in (out / "channel_log.jsonl").read_text().splitlines()]
    assert {n for r in records for n in r["shapes"]} == {"avatar_entity_emb"}
    assert (out / "phases" / "unlearn.json").is_file() and (out / "retrain" / "run" / "metrics.json").is_file()


@pytest.mark.slow
def test_a_fede_run_can_be_unlearned_too(tmp_path, one_thread):
    source = tmp_path / "fede"
    fede = [s for s in SOURCE if not s.startswith("federated.fedlu")]
    fede = [s if s != "federated.strategy=fedlu" else "federated.strategy=fede" for s in fede]
    fit(load_config(None, fede + ["federated.rounds=3"]), source)
    metrics = run_unlearn(load_config(None, fede + ["federated.rounds=3", "unlearn.retrain=false"] + AGGRESSIVE),
                          source, tmp_path / "out")
    assert "retrain" not in metrics and "test_global" not in metrics["after"]
    assert metrics["after"]["forget"]["mrr"] < metrics["before"]["forget"]["mrr"]


@pytest.mark.slow
def test_unlearn_refuses_a_config_of_another_run_and_writing_into_the_source(source_run, tmp_path):
    with pytest.raises(ConfigError, match="model.dim"):
        run_unlearn(load_config(None, SOURCE + ["model.dim=8"]), source_run, tmp_path / "x")
    with pytest.raises(ConfigError, match="--out"):
        run_unlearn(None, source_run, source_run)
    assert main(["unlearn", "--from", str(tmp_path / "missing")]) == 2


def test_nothing_to_forget_is_a_clear_error(source_run, tmp_path):
    # The bundled UMLS has no unlearn.txt: forget=file finds nothing.
    with pytest.raises(ConfigError, match="unlearn.forget=sample"):
        run_unlearn(load_config(None, SOURCE + ["unlearn.forget=file"]), source_run, tmp_path / "x")


@pytest.mark.slow
def test_fedkg_unlearn_command(source_run, tmp_path, capsys):
    out = tmp_path / "cli"
    code = main(["unlearn", "--from", str(source_run), "--out", str(out), "unlearn.forget=sample",
                 "unlearn.retrain=false", "unlearn.interference_epochs=2", "unlearn.decay_epochs=1"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "before" in printed and "after" in printed and "retrain" not in printed.split("MIA AUC")[1]
    assert "forgotten triples, ranked by every model above" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["mia_auc"]) == {"before", "after"} and metrics["forget"]["mode"] == "sample"


@pytest.mark.slow
def test_the_unlearned_model_is_a_run_that_fedkg_test_reads(source_run, tmp_path, capsys):
    out = tmp_path / "unlearned"
    metrics = run_unlearn(load_config(None, SOURCE + ["unlearn.forget=sample", "unlearn.retrain=false",
                                                      "unlearn.interference_epochs=2", "unlearn.decay_epochs=1"]),
                          source_run, out)
    assert (out / "checkpoints" / "best.json").is_file()
    assert main(["test", "--from", str(out)]) == 0
    capsys.readouterr()
    from lightning_fedkg.run import best_state, evaluate, read_run_config

    cfg = read_run_config(out)
    tested = evaluate(cfg, best_state(out, cfg))
    # the test of the saved model is the "after" test: same model, same test set and filter
    assert tested["test"]["mrr"] == pytest.approx(metrics["after"]["test"]["mrr"], abs=1e-6)
    assert tested["test"]["mrr"] != pytest.approx(metrics["before"]["test"]["mrr"], abs=1e-6)


@pytest.mark.slow
def test_before_after_and_retrain_rank_the_same_forgotten_triples(tmp_path, one_thread):
    """FedLU's unlearn.txt may hold every triple of an entity: the retrain still ranks it."""
    from lightning_fedkg.data import load_kg
    from lightning_fedkg.data import partition_by_relation, write_fedlu_folder

    fed = partition_by_relation(load_kg("umls"), 3, seed=4)
    folder = write_fedlu_folder(fed, tmp_path / "R3", {"unlearn": [kg.triples("train")[:5] for kg in fed.clients]})
    relation = (folder / "0" / "train.txt").read_text().split("\t")[1]
    orphan = f"only_forgotten\t{relation}\t{fed.clients[0].entity_names[0]}\n"
    for split in ("train", "unlearn"):
        with open(folder / "0" / f"{split}.txt", "a") as f:
            f.write(orphan)
    (folder / "2" / "unlearn.txt").unlink()  # a client with nothing to forget
    base = [s for s in SOURCE if not s.startswith(("data.name", "federated.rounds"))]
    base += [f"data.name={folder}", "federated.rounds=2", "model.dim=16"]
    fit(load_config(None, base), tmp_path / "source")
    metrics = run_unlearn(load_config(None, base + ["unlearn.interference_epochs=1", "unlearn.decay_epochs=1",
                                                    "unlearn.propagate_rounds=0"]),
                          tmp_path / "source", tmp_path / "out")
    assert metrics["forget"]["clients"] == {"client_0": 6, "client_1": 5, "client_2": 0}
    for block in ("before", "after", "retrain"):
        assert metrics[block]["forgotten"] == 11 and metrics[block]["forget"]["count"] == 22, block
    budget = metrics["budget"]
    assert budget["source_rounds"] == 2 and budget["retrain_rounds"] == 2 + 1  # one decay epoch -> one round
    assert metrics["retrain"]["rounds"] <= budget["retrain_rounds"]
    # No propagation: each client's avatar is its own; the saved run must not overwrite it
    # with the server's (pre-unlearning) rows when it is tested.
    from lightning_fedkg.run import best_state, evaluate, read_run_config

    from lightning_fedkg.federated.entry import restore_finished_run

    cfg = read_run_config(tmp_path / "out")
    tested = evaluate(cfg, best_state(tmp_path / "out", cfg))
    assert tested["test"]["mrr"] == pytest.approx(metrics["after"]["test"]["mrr"], abs=1e-6)
    run, round_ = restore_finished_run(cfg, tmp_path / "out")
    assert run.own_states
    run.evaluate("test", round_, download=False)
    assert run.server.test_global["mrr"] == pytest.approx(metrics["after"]["test_global"]["mrr"], abs=1e-6)
    run.close()


def test_decay_validates_without_the_forgotten_triples_in_its_filter(source_run):
    """unlearn_client runs on a party that already holds only its retained triples, so the
    decay's validation filter (train ∪ valid ∪ test) no longer contains the forgotten ones."""
    from lightning_fedkg.federated.entry import load_run_from
    from lightning_fedkg.methods.fedlu.phase import forget_sets, retain_only, unlearn_client

    cfg, run = load_run_from(source_run, sections=("unlearn",))
    cfg = load_config(None, SOURCE + ["unlearn.forget=sample", "unlearn.interference_epochs=1",
                                      "unlearn.decay_epochs=1"])
    party = run.clients[0]
    forget = forget_sets(cfg.unlearn, run.clients)[party.name]
    with pytest.raises(ValueError, match="retain_only"):
        unlearn_client(party, forget, cfg)
    retain_only(party, forget, cfg.seed)
    filtered = party.datamodule.valid_filter_index.contains(forget)
    assert forget.numel() and not bool(filtered.any())
    assert len(unlearn_client(party, forget, cfg)) >= 2  # before the decay, then one per epoch
    run.close()


@pytest.mark.slow
def test_unlearn_labels_every_progress_line_with_its_phase_and_sub_run(source_run, tmp_path, caplog):
    """``fedkg unlearn`` printed the retrain sub-run's "round k/N" lines as they are, with
    nothing saying they were not the unlearning's; the client unlearning and the propagation
    rounds printed nothing."""
    import logging

    caplog.set_level(logging.INFO, logger="lightning_fedkg")
    run_unlearn(load_config(None, SOURCE + ["unlearn.forget=sample", "unlearn.interference_epochs=1",
                                            "unlearn.decay_epochs=1", "unlearn.propagate_rounds=2",
                                            "unlearn.retrain_rounds=2"]), source_run, tmp_path / "out")
    lines = [r.getMessage() for r in caplog.records if r.name == "lightning_fedkg"]
    rounds = [line for line in lines if ": round " in line]
    assert len(rounds) == 2 and all(line.startswith("unlearn/retrain: round ") for line in rounds), lines
    assert any(line.startswith("unlearn/retrain: training from scratch") and str(tmp_path / "out" / "retrain")
               in line for line in lines), lines
    assert sum(line.startswith("unlearn: client_") and "interference" in line and "decay" in line
               for line in lines) == 3, lines
    propagation = [line for line in lines if line.startswith("unlearn: propagation round")]
    assert [line.split(" (")[0] for line in propagation] == ["unlearn: propagation round 1/2",
                                                             "unlearn: propagation round 2/2"], lines
    # Outside the phase, nothing is labelled.
    logging.getLogger("lightning_fedkg").info("after")
    assert caplog.records[-1].getMessage() == "after"
