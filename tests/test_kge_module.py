"""KGEModule: loss values, evaluation vs brute force, optimizer persistence, learning on UMLS."""

import math
import time

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_fedkg.models.kge_module import LOSSES, KGEModule, kge_loss

pytestmark = pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`")


def log_sigmoid(x):
    return -math.log1p(math.exp(-x))


def trainer(**kw):
    defaults = dict(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    defaults.update(kw)
    return L.Trainer(**defaults)


def loader(batches):
    """A DataLoader that yields prebuilt batch dicts unchanged."""
    return DataLoader(batches, batch_size=None, shuffle=False)


# ---------------------------------------------------------------------------- loss values
POS = torch.tensor([1.0, -0.5])
NEG = torch.tensor([[0.0, 2.0], [1.0, -1.0]])


def test_self_adversarial_loss_hand_value():
    # per row: -sum_j softmax(s_neg)_j log sigmoid(-s_neg_j)
    def row(r):
        z = sum(math.exp(x) for x in r)
        return -sum(math.exp(x) / z * log_sigmoid(-x) for x in r)

    expected = 0.5 * ((-log_sigmoid(1.0) - log_sigmoid(-0.5)) / 2 + (row([0.0, 2.0]) + row([1.0, -1.0])) / 2)
    assert expected == pytest.approx(1.109353645926133, abs=1e-12)
    assert kge_loss(POS, NEG, "self_adversarial", 1.0).item() == pytest.approx(expected, abs=1e-6)
    # alpha -> 0 gives uniform weights
    assert kge_loss(POS, NEG, "self_adversarial", 0.0).item() == pytest.approx(
        kge_loss(POS, NEG, "uniform").item(), abs=1e-7)


def test_uniform_and_margin_loss_hand_values():
    assert kge_loss(POS, NEG, "uniform").item() == pytest.approx(0.8776594887545028, abs=1e-6)
    # pairs: max(0, 1-1+0)=0, max(0, 1-1+2)=2, max(0, 1+.5+1)=2.5, max(0, 1+.5-1)=.5 -> 5/4
    assert kge_loss(POS, NEG, "margin", margin=1.0).item() == pytest.approx(1.25, abs=1e-7)


def test_weighted_loss_by_hand_and_equal_weights_change_nothing():
    # uniform: per-row positive terms (-log σ(1), -log σ(-.5)) and negative terms (means of
    # -log σ(-s) over the row), each averaged over the batch with weights (3, 1)
    w = torch.tensor([3.0, 1.0])
    pos_terms = [-log_sigmoid(1.0), -log_sigmoid(-0.5)]
    neg_terms = [-(log_sigmoid(0.0) + log_sigmoid(-2.0)) / 2, -(log_sigmoid(-1.0) + log_sigmoid(1.0)) / 2]
    expected = 0.5 * ((3 * pos_terms[0] + pos_terms[1]) / 4 + (3 * neg_terms[0] + neg_terms[1]) / 4)
    assert kge_loss(POS, NEG, "uniform", weight=w).item() == pytest.approx(expected, abs=1e-6)
    # margin: row hinges (0, 2) and (2.5, .5) weighted 3 and 1 over 2 negatives each
    assert kge_loss(POS, NEG, "margin", margin=1.0, weight=w).item() == pytest.approx(
        (3 * 2 + 1 * 3) / 8, abs=1e-7)
    for loss in LOSSES:
        assert kge_loss(POS, NEG, loss, weight=torch.full((2,), 0.7)).item() == pytest.approx(
            kge_loss(POS, NEG, loss).item(), abs=1e-6)


@pytest.mark.parametrize("loss", ["self_adversarial", "uniform", "margin"])
def test_negative_mask_equals_dropping_the_masked_negatives(loss):
    torch.manual_seed(0)
    pos, neg = torch.randn(4), torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 0, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 0, 0, 0, 1]], dtype=torch.bool)
    masked = kge_loss(pos, neg, loss, 0.7, 2.0, negative_mask=mask)
    if loss == "margin":
        hinges = [torch.relu(2.0 - pos[i] + neg[i][mask[i]]) for i in range(4)]
        expected = torch.cat(hinges).mean()
    else:
        # Row by row on its valid negatives only, then the usual batch means.
        rows = [kge_loss(pos[i : i + 1], neg[i : i + 1][:, mask[i]], loss, 0.7) for i in range(4)]
        expected = torch.stack(rows).mean()
    assert masked.item() == pytest.approx(expected.item(), abs=1e-6)
    all_valid = kge_loss(pos, neg, loss, 0.7, 2.0, negative_mask=torch.ones(4, 5, dtype=torch.bool))
    assert all_valid.item() == pytest.approx(kge_loss(pos, neg, loss, 0.7, 2.0).item(), abs=1e-6)


def test_self_adversarial_weights_carry_no_gradient():
    neg = NEG.clone().requires_grad_(True)
    kge_loss(POS, neg, "self_adversarial").backward()
    # with detached weights d/ds_j = 0.5/B * p_j * sigmoid(s_j)
    p = torch.softmax(NEG, dim=1)
    assert torch.allclose(neg.grad, 0.25 * p * torch.sigmoid(NEG), atol=1e-7)


def tiny_transe():
    """1-d TransE, gamma 2: entities at 0, 1, 3; relation 0 translates by +1."""
    module = KGEModule("transe", num_entities=3, num_relations=1, dim=1, gamma=2.0)
    with torch.no_grad():
        module.model.entity_emb.copy_(torch.tensor([[0.0], [1.0], [3.0]]))
        module.model.relation_emb.copy_(torch.tensor([[1.0]]))
    return module


def test_training_loss_on_tiny_transe_by_hand():
    module = tiny_transe()
    # positive (0, 0, 1): 2 - |0 + 1 - 1| = 2
    # tail negatives 2, 0: 2 - |1 - 3| = 0 and 2 - |1 - 0| = 1
    batch = {"positive": torch.tensor([[0, 0, 1]]), "negatives": torch.tensor([[2, 0]]), "mode": "tail"}
    w0, w1 = 1 / (1 + math.e), math.e / (1 + math.e)
    expected = 0.5 * (-log_sigmoid(2.0) - w0 * log_sigmoid(0.0) - w1 * log_sigmoid(-1.0))
    assert module.training_loss(batch).item() == pytest.approx(expected, abs=1e-6)
    # head negatives 2, 1: 2 - |3 + 1 - 1| = -1 and 2 - |1 + 1 - 1| = 1
    batch = {"positive": torch.tensor([[0, 0, 1]]), "negatives": torch.tensor([[2, 1]]), "mode": "head"}
    expected = 0.5 * (-log_sigmoid(2.0) - 0.5 * (log_sigmoid(1.0) + log_sigmoid(-1.0)))
    module.hparams.loss = "uniform"
    assert module.training_loss(batch).item() == pytest.approx(expected, abs=1e-6)
    # the N3 regulariser adds weight * sum |x|^3 = 0.1 * (0 + 1 + 27 + 1)
    module.hparams.regularization = 0.1
    assert module.training_loss(batch).item() == pytest.approx(expected + 2.9, abs=1e-5)


@pytest.mark.parametrize("shared", [False, True])
def test_mixed_mode_selects_side_per_row(shared):
    torch.manual_seed(0)
    module = KGEModule("rotate", num_entities=20, num_relations=4, dim=6)
    positive = torch.tensor([[0, 1, 2], [3, 0, 4], [5, 3, 6], [7, 2, 8]])
    negatives = torch.randint(20, (5,)) if shared else torch.randint(20, (4, 5))
    head_mask = torch.tensor([True, False, False, True])
    got = module.negative_scores({"positive": positive, "negatives": negatives, "mode": "mixed",
                                  "head_mask": head_mask})
    tails = module.negative_scores({"positive": positive, "negatives": negatives, "mode": "tail"})
    heads = module.negative_scores({"positive": positive, "negatives": negatives, "mode": "head"})
    assert torch.allclose(got, torch.where(head_mask.unsqueeze(1), heads, tails))
    # and it is the score of the corrupted triple
    negs = negatives.expand(4, -1) if shared else negatives
    h, r, t = positive.T
    assert torch.allclose(got[0], module.model(negs[0], r[0].expand(5), t[0].expand(5)), atol=1e-5)
    assert torch.allclose(got[1], module.model(h[1].expand(5), r[1].expand(5), negs[1]), atol=1e-5)


# ---------------------------------------------------------------------------- evaluation
def random_kg(seed, n=15, r=3, m=70):
    g = torch.Generator().manual_seed(seed)
    triples = torch.stack([torch.randint(n, (m,), generator=g), torch.randint(r, (m,), generator=g),
                           torch.randint(n, (m,), generator=g)], 1).unique(dim=0)
    return triples, n, r


def eval_batches(queries, all_true, batch_size=7):
    """Evaluation batches as the datamodule produces them, built by plain loops."""
    batches = []
    for mode in ("tail", "head"):
        for start in range(0, len(queries), batch_size):
            part = queries[start : start + batch_size]
            rows, cols = [], []
            for i, (h, r, t) in enumerate(part.tolist()):
                for h2, r2, t2 in all_true.tolist():
                    if mode == "tail" and (h2, r2) == (h, r) and t2 != t:
                        rows.append(i), cols.append(t2)
                    if mode == "head" and (r2, t2) == (r, t) and h2 != h:
                        rows.append(i), cols.append(h2)
            batches.append({"triples": part, "mode": mode, "filter_row": torch.tensor(rows, dtype=torch.long),
                            "filter_col": torch.tensor(cols, dtype=torch.long)})
    return batches


def brute_force_mrr(model, queries, all_true, n, allowed=None):
    true_set = set(map(tuple, all_true.tolist()))
    reciprocal = []
    with torch.no_grad():
        for h, r, t in queries.tolist():
            for side in ("tail", "head"):
                target = t if side == "tail" else h
                s_true = model(torch.tensor([h]), torch.tensor([r]), torch.tensor([t])).item()
                better = 0
                for e in range(n):
                    cand = (h, r, e) if side == "tail" else (e, r, t)
                    if e == target or cand in true_set or (allowed is not None and not allowed[e]):
                        continue
                    if model(*(torch.tensor([x]) for x in cand)).item() > s_true:
                        better += 1
                reciprocal.append(1.0 / (1 + better))
    return sum(reciprocal) / len(reciprocal)


@pytest.mark.parametrize("model_name", ["transe", "rotate", "complex"])
def test_validation_mrr_equals_brute_force(model_name):
    triples, n, r = random_kg(1)
    queries = triples[:20]
    torch.manual_seed(0)
    module = KGEModule(model_name, num_entities=n, num_relations=r, dim=8, ties="optimistic")
    trainer().validate(module, dataloaders=loader(eval_batches(queries, triples)), verbose=False)
    got = module.last_metrics["val"]
    assert got["count"] == 2 * len(queries)
    assert got["mrr"] == pytest.approx(brute_force_mrr(module.model, queries, triples, n), abs=1e-6)
    assert module.evaluation_results() == got

    # chunked scoring and a candidate mask
    allowed = torch.arange(n) % 3 != 1
    module.eval_candidate_mask = allowed
    module.hparams.eval_chunk_size = 3
    trainer().test(module, dataloaders=loader(eval_batches(queries, triples)), verbose=False)
    assert module.last_metrics["test"]["mrr"] == pytest.approx(
        brute_force_mrr(module.model, queries, triples, n, allowed.tolist()), abs=1e-6)
    assert module.evaluation_results("val") == got


def test_diverged_model_ranks_last_not_first():
    """A NaN entity table (a diverged client) must report MRR near 0, not 1."""
    triples, n, r = random_kg(3, n=200, m=300)
    queries = triples[:30]
    module = KGEModule("transe", num_entities=n, num_relations=r, dim=8)
    with torch.no_grad():
        module.model.entity_emb.fill_(float("nan"))
    trainer().validate(module, dataloaders=loader(eval_batches(queries, triples)), verbose=False)
    # every target ranks behind all of its unfiltered competitors: rank = n - #other true answers
    true_set = set(map(tuple, triples.tolist()))
    expected = []
    for h, r_, t in queries.tolist():
        expected.append(1 / (n - sum((h, r_, e) in true_set for e in range(n) if e != t)))
        expected.append(1 / (n - sum((e, r_, t) in true_set for e in range(n) if e != h)))
    got = module.last_metrics["val"]
    assert got["mrr"] == pytest.approx(sum(expected) / len(expected), rel=1e-6)
    assert got["mrr"] < 0.01 and got["hits@10"] == 0.0


def test_split_emptied_by_the_input_policy_records_count_zero(tmp_path):
    """valid only mentions an entity unseen in train, so loading drops it all: evaluating it
    must record count 0 with NaN metrics (Lightning skips an empty loop, hooks and all)."""
    from lightning_fedkg.data import KGDataModule, LoaderSettings, load_kg

    (tmp_path / "train.txt").write_text("a\tr\tb\nb\tr\tc\nc\ts\ta\n")
    (tmp_path / "valid.txt").write_text("x\tr\ta\nb\ts\tx\n")
    (tmp_path / "test.txt").write_text("a\tr\tc\n")
    kg = load_kg(tmp_path)
    assert kg.triples("valid").shape == (0, 3) and kg.removed["valid"]["unseen"] == 2
    dm = KGDataModule(kg, loader=LoaderSettings(eval_batch_size=4))
    module = KGEModule("transe", num_entities=kg.num_entities, num_relations=kg.num_relations, dim=4)
    t = trainer()
    t.validate(module, datamodule=dm, verbose=False)
    val = module.evaluation_results("val")
    assert val["count"] == 0
    assert all(math.isnan(val[k]) for k in ("mrr", "mr", "hits@1", "hits@3", "hits@5", "hits@10"))
    assert set(val) == {"mrr", "mr", "hits@1", "hits@3", "hits@5", "hits@10", "count"}
    # the non-empty test split on the same (reused) Trainer still gives real numbers
    t.test(module, datamodule=dm, verbose=False)
    test = module.evaluation_results()
    assert test["count"] == 2 and 1.0 <= test["mr"] <= 3.0
    # and a later validation is recorded afresh, not left over from test
    module.last_metrics.pop("val")
    t.validate(module, datamodule=dm, verbose=False)
    assert module.evaluation_results()["count"] == 0


def test_empty_batch_ranks_nothing():
    module = KGEModule("transe", num_entities=5, num_relations=2, dim=4, eval_chunk_size=2)
    empty = torch.zeros(0, dtype=torch.long)
    batch = {"triples": torch.zeros(0, 3, dtype=torch.long), "mode": "tail", "filter_row": empty, "filter_col": empty}
    assert module.rank_batch(batch).shape == (0,)


def test_evaluation_ranks_in_fp32_under_bf16_autocast():
    triples, n, r = random_kg(2)
    torch.manual_seed(0)
    module = KGEModule("distmult", num_entities=n, num_relations=r, dim=16, ties="pessimistic")
    batch = eval_batches(triples[:10], triples, batch_size=10)[0]
    ref = module.rank_batch(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(module.rank_batch(batch), ref)


# ---------------------------------------------------------------------------- optimizer state
def train_batches(n, r, count=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [{"positive": torch.stack([torch.randint(n, (8,), generator=g), torch.randint(r, (8,), generator=g),
                                      torch.randint(n, (8,), generator=g)], 1),
             "negatives": torch.randint(n, (8, 4), generator=g), "mode": "tail"} for _ in range(count)]


def adam_step(module):
    state = module._optimizer.state_dict()["state"]
    return int(next(iter(state.values()))["step"])


@pytest.mark.parametrize("reset", [True, False])
def test_reset_optimizer_across_fits(reset):
    module = KGEModule("transe", num_entities=10, num_relations=2, dim=4, reset_optimizer=reset)
    data = loader(train_batches(10, 2))
    trainer().fit(module, train_dataloaders=data)
    first = module._optimizer
    assert adam_step(module) == 3
    trainer().fit(module, train_dataloaders=data)
    assert adam_step(module) == (3 if reset else 6)
    assert (module._optimizer is first) is (not reset)
    # Only a persistent optimizer has a state worth saving in a party checkpoint.
    assert (module.optimizer_state_dict() is None) is reset


def test_optimizer_state_moves_between_modules():
    a = KGEModule("transe", num_entities=10, num_relations=2, dim=4, reset_optimizer=False)
    data = loader(train_batches(10, 2))
    trainer().fit(a, train_dataloaders=data)
    b = KGEModule("transe", num_entities=10, num_relations=2, dim=4, reset_optimizer=False)
    b.load_state_dict(a.state_dict())
    b.load_optimizer_state_dict(a.optimizer_state_dict())
    assert torch.equal(b._optimizer.state_dict()["state"][0]["exp_avg"], a._optimizer.state_dict()["state"][0]["exp_avg"])
    trainer().fit(b, train_dataloaders=data)
    assert adam_step(b) == 6


def test_checkpoint_round_trip(tmp_path):
    module = KGEModule("rotate", num_entities=10, num_relations=2, dim=4, lr=0.05, ties="arbitrary")
    t = trainer()
    t.fit(module, train_dataloaders=loader(train_batches(10, 2)))
    path = tmp_path / "m.ckpt"
    t.save_checkpoint(path)
    restored = KGEModule.load_from_checkpoint(path)
    assert restored.hparams.ties == "arbitrary" and restored.hparams.lr == 0.05
    assert torch.equal(restored.model.entity_emb, module.model.entity_emb)


def test_invalid_arguments():
    with pytest.raises(ValueError):
        KGEModule(num_entities=3, num_relations=1, loss="hinge")
    with pytest.raises(ValueError):
        KGEModule(num_entities=3, num_relations=1, ties="random")


# ---------------------------------------------------------------------------- learning on UMLS
@pytest.fixture(scope="module")
def umls():
    from lightning_fedkg.data import load_kg

    return load_kg("umls")


def umls_datamodule(kg, eval_batch_size=512):
    from lightning_fedkg.data import KGDataModule, LoaderSettings, UniformSampler

    return KGDataModule(kg, UniformSampler(32, corruption="both"),
                        LoaderSettings(batch_size=512, eval_batch_size=eval_batch_size), seed=0)


E2E = {
    # model: (hyperparameters, epochs, trained MRR bar)
    "transe": (dict(dim=64, gamma=8.0, lr=0.01), 10, 0.60),
    "rotate": (dict(dim=32, gamma=8.0, lr=0.02), 10, 0.70),
}


@pytest.mark.parametrize("model_name", sorted(E2E))
@pytest.mark.slow
def test_learns_umls(umls, model_name):
    hparams, epochs, bar = E2E[model_name]
    L.seed_everything(0, verbose=False)
    module = KGEModule(model_name, num_entities=umls.num_entities, num_relations=umls.num_relations, **hparams)
    dm = umls_datamodule(umls)
    trainer().test(module, datamodule=dm, verbose=False)
    untrained = module.last_metrics["test"]["mrr"]

    start, cpu_start = time.perf_counter(), time.process_time()
    t = trainer(max_epochs=epochs, limit_val_batches=0)
    t.fit(module, datamodule=dm)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    t.test(module, datamodule=dm, verbose=False)
    trained = module.last_metrics["test"]
    # Budget: a few seconds of CPU time; wall time is not asserted (shared CI machines).
    print(f"{model_name}: untrained MRR {untrained:.3f}, trained {trained}, fit {elapsed:.1f}s wall {cpu:.1f}s CPU")
    assert trained["count"] == 2 * len(umls.triples("test"))
    assert untrained < 0.15
    assert trained["mrr"] >= bar
    assert trained["mrr"] - untrained >= 0.45


def test_bf16_mixed_smoke_fit(umls):
    L.seed_everything(0, verbose=False)
    module = KGEModule("rotate", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=16)
    dm = umls_datamodule(umls)
    t = trainer(accelerator="auto", precision="bf16-mixed", limit_train_batches=3)
    t.fit(module, datamodule=dm)
    metrics = module.last_metrics["val"]
    assert metrics["count"] == 2 * len(umls.triples("valid"))
    assert 0.0 < metrics["mrr"] <= 1.0 and math.isfinite(float(t.callback_metrics["train/loss"]))
    assert module.model.entity_emb.dtype == torch.float32


def test_umls_validation_matches_per_query_loop(umls):
    """Module + datamodule eval batches vs a loop over queries with the model's ``forward``."""
    torch.manual_seed(0)
    module = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=16,
                       ties="pessimistic")
    trainer().validate(module, datamodule=umls_datamodule(umls, eval_batch_size=100), verbose=False)
    true_tails, true_heads = {}, {}
    for h, r, t in torch.cat([umls.triples(s) for s in ("train", "valid", "test")]).tolist():
        true_tails.setdefault((h, r), set()).add(t)
        true_heads.setdefault((r, t), set()).add(h)
    entities = torch.arange(umls.num_entities)
    reciprocal = []
    with torch.no_grad():
        for h, r, t in umls.triples("valid").tolist():
            for target, others, make in (
                (t, true_tails[(h, r)], lambda e: (torch.full_like(e, h), torch.full_like(e, r), e)),
                (h, true_heads[(r, t)], lambda e: (e, torch.full_like(e, r), torch.full_like(e, t))),
            ):
                scores = module.model(*make(entities))
                keep = torch.tensor([e == target or e not in others for e in range(umls.num_entities)])
                keep[target] = False
                reciprocal.append(1.0 / (1 + int((scores[keep] >= scores[target]).sum())))
    got = module.last_metrics["val"]
    assert got["count"] == len(reciprocal)
    assert got["mrr"] == pytest.approx(sum(reciprocal) / len(reciprocal), abs=1e-6)
