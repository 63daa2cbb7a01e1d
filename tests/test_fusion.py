"""Tests for FedE model fusion (lightning_fedkg.methods.fede.fusion)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_fedkg.methods.fede.fusion import (
    ScoreFusion,
    evaluate_fusion,
    fit_fusion,
    fusion_loss,
    sample_fusion_negatives,
)

N_ENT, N_REL = 30, 3
EPOCHS_PERFECT = 25


class TableModel(nn.Module):
    """Stand-in KGE model whose score of (h, r, t) is ``table[h, r, t]`` (a trainable Parameter).

    Implements the ``KGEModel`` scoring interface (``forward`` and ``score_tails`` with
    ``None`` / ``[n]`` / ``[B, n]`` candidates) and counts calls and records candidates.
    """

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table.clone().float())
        self.calls = 0
        self.seen_candidates: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def forward(self, h, r, t):
        self.calls += 1
        return self.table[h, r, t]

    def score_tails(self, h, r, candidates=None):
        self.calls += 1
        rows = self.table[h, r]  # [B, N]
        if candidates is None:
            return rows
        if candidates.dim() == 1:
            return rows[:, candidates]
        self.seen_candidates.append((h.clone(), r.clone(), candidates.clone()))
        return rows.gather(1, candidates)


def make_kg(seed: int = 0, n_train: int = 250, n_valid: int = 160, n_test: int = 80,
            n_ent: int = N_ENT, n_rel: int = N_REL):
    """Random disjoint train/valid/test triples over ``n_ent`` entities and ``n_rel`` relations."""
    g = torch.Generator().manual_seed(seed)
    keys = torch.randperm(n_ent * n_rel * n_ent, generator=g)[: n_train + n_valid + n_test]
    h = keys // (n_rel * n_ent)
    r = (keys // n_ent) % n_rel
    t = keys % n_ent
    triples = torch.stack([h, r, t], dim=1)
    return triples[:n_train], triples[n_train : n_train + n_valid], triples[n_train + n_valid :]


def true_mask(*splits: torch.Tensor, n_ent: int = N_ENT, n_rel: int = N_REL) -> torch.Tensor:
    mask = torch.zeros(n_ent, n_rel, n_ent, dtype=torch.bool)
    for s in splits:
        mask[s[:, 0], s[:, 1], s[:, 2]] = True
    return mask


def brute_filter_fn(all_true: list[tuple[int, int, int]]):
    """filter_fn built with Python dicts: (row-in-chunk, entity) of every true tail of (h, r)."""
    tails: dict[tuple[int, int], list[int]] = {}
    for h, r, t in all_true:
        tails.setdefault((h, r), []).append(t)

    def filter_fn(h: torch.Tensor, r: torch.Tensor):
        rows, cols = [], []
        for i, (hh, rr) in enumerate(zip(h.tolist(), r.tolist())):
            for t in tails.get((hh, rr), []):
                rows.append(i)
                cols.append(t)
        return torch.tensor(rows, dtype=torch.long), torch.tensor(cols, dtype=torch.long)

    return filter_fn, tails


def brute_metrics(table: torch.Tensor, test: torch.Tensor, tails: dict) -> dict:
    """Filtered tail ranks with ties broken by entity id, by explicit Python loops."""
    ranks = []
    for h, r, t in test.tolist():
        s = table[h, r].tolist()
        rank = 1
        for e in range(N_ENT):
            if e == t or e in tails.get((h, r), []):
                continue
            if s[e] > s[t] or (s[e] == s[t] and e < t):
                rank += 1
        ranks.append(rank)
    n = len(ranks)
    out = {"mrr": sum(1.0 / k for k in ranks) / n, "mr": sum(ranks) / n}
    for k in (1, 3, 5, 10):
        out[f"hits@{k}"] = sum(x <= k for x in ranks) / n
    out["count"] = n
    return out


def assert_metrics_equal(got: dict, want: dict) -> None:
    assert set(got) == set(want)
    assert got["count"] == want["count"]
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-6, abs=1e-6), k


# --------------------------------------------------------------------------- ScoreFusion / loss


def test_score_fusion_forward_is_linear_combination():
    fusion = ScoreFusion.from_weights(2.0, -0.5, bias=1.5)
    a = torch.tensor([[1.0, 2.0], [3.0, -4.0]])
    b = torch.tensor([[0.0, 4.0], [-2.0, 8.0]])
    expected = 2.0 * a - 0.5 * b + 1.5
    assert torch.allclose(fusion(a, b), expected)
    # Equals nn.Linear applied to the stacked feature vector x = [s_single, s_fed].
    assert torch.allclose(fusion(a, b), fusion.linear(torch.stack([a, b], dim=-1)).squeeze(-1))
    assert torch.equal(fusion.weight.detach(), torch.tensor([2.0, -0.5]))
    assert float(fusion.bias.detach()) == 1.5
    with pytest.raises(ValueError):
        fusion(a, b[:, :1])


def test_fusion_loss_hand_computed_one_positive_two_negatives():
    fusion = ScoreFusion.from_weights(2.0, -1.0, bias=0.5)
    single_pos, fed_pos = torch.tensor([3.0]), torch.tensor([1.0])
    single_neg, fed_neg = torch.tensor([[1.0, 4.0]]), torch.tensor([[2.0, 0.0]])
    # s(pos) = 2*3 - 1 + 0.5 = 5.5 ; s(neg) = (2 - 2 + 0.5, 8 - 0 + 0.5) = (0.5, 8.5), mean 4.5
    pos, neg = fusion(single_pos, fed_pos), fusion(single_neg, fed_neg)
    assert torch.allclose(pos, torch.tensor([5.5]))
    assert torch.allclose(neg, torch.tensor([[0.5, 8.5]]))
    loss = fusion_loss(pos, neg, margin=10.0)
    assert loss.item() == pytest.approx(max(0.0, 10.0 - 5.5 + 4.5))  # = 9
    # Gradient of the active hinge: d/dw = -(x_pos - mean x_neg), d/db = 0 (bias cancels).
    loss.backward()
    assert torch.allclose(fusion.linear.weight.grad, torch.tensor([[-(3.0 - 2.5), -(1.0 - 1.0)]]))
    assert fusion.linear.bias.grad.abs().item() == 0.0
    # A satisfied margin contributes zero; the batch loss is the mean of per-positive hinges.
    assert fusion_loss(torch.tensor([20.0]), torch.tensor([[0.5, 8.5]]), margin=10.0).item() == 0.0
    two = fusion_loss(torch.tensor([5.5, 20.0]), torch.tensor([[0.5, 8.5], [0.5, 8.5]]), margin=10.0)
    assert two.item() == pytest.approx(9.0 / 2)


# --------------------------------------------------------------------------- negatives


def test_negatives_never_hit_validation_true_tails():
    _, valid, _ = make_kg(seed=1)
    # A query whose validation tails cover all but two entities (forces many rejections and
    # the exact fallback), plus the random validation triples.
    crowded = torch.tensor([[0, 0, t] for t in range(N_ENT - 2)])
    valid = torch.cat([valid[(valid[:, 0] != 0) | (valid[:, 1] != 0)], crowded])
    vmask = true_mask(valid)
    g = torch.Generator().manual_seed(3)
    neg = sample_fusion_negatives(valid, N_ENT, 64, generator=g, max_rounds=2)
    assert neg.shape == (valid.shape[0], 64)
    assert neg.min() >= 0 and neg.max() < N_ENT
    hits = vmask[valid[:, 0:1].expand_as(neg), valid[:, 1:2].expand_as(neg), neg]
    assert not hits.any()
    # The crowded query can only get the two remaining entities, and gets both.
    crowded_neg = neg[-crowded.shape[0] :]
    assert set(crowded_neg.unique().tolist()) == {N_ENT - 2, N_ENT - 1}
    # Uncrowded queries draw from the whole range except their own true tails.
    free = neg[: -crowded.shape[0]]
    assert free.unique().numel() == N_ENT


def test_negatives_are_not_filtered_against_other_splits_and_are_reproducible():
    valid = torch.tensor([[1, 0, 5], [2, 1, 7]])
    a = sample_fusion_negatives(valid, N_ENT, 2000, generator=torch.Generator().manual_seed(0))
    b = sample_fusion_negatives(valid, N_ENT, 2000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, b)
    assert not (a[0] == 5).any() and not (a[1] == 7).any()
    # Only the query's own validation tail is excluded: tail 7 is fine for (1, 0), 5 for (2, 1).
    assert (a[0] == 7).any() and (a[1] == 5).any()
    # Roughly uniform over the 29 allowed entities (2000 draws: ~69 each).
    counts = torch.bincount(a[0], minlength=N_ENT).float()
    allowed = torch.ones(N_ENT, dtype=torch.bool)
    allowed[5] = False
    assert counts[allowed].min() > 30 and counts[allowed].max() < 120


def test_negatives_impossible_query_raises():
    valid = torch.tensor([[0, 0, t] for t in range(N_ENT)])
    with pytest.raises(ValueError):
        sample_fusion_negatives(valid, N_ENT, 4)


# --------------------------------------------------------------------------- evaluation


def test_evaluate_fusion_reproduces_each_model_with_unit_weights():
    train, valid, test = make_kg(seed=2)
    g = torch.Generator().manual_seed(5)
    # Integer-valued scores so that ties occur and the tie rule (by entity id) is exercised.
    single_table = torch.randint(0, 6, (N_ENT, N_REL, N_ENT), generator=g).float()
    fed_table = torch.randint(0, 6, (N_ENT, N_REL, N_ENT), generator=g).float()
    single, fed = TableModel(single_table), TableModel(fed_table)
    all_true = torch.cat([train, valid, test]).tolist()
    filter_fn, tails = brute_filter_fn(all_true)

    want_single = brute_metrics(single_table, test, tails)
    want_fed = brute_metrics(fed_table, test, tails)
    assert want_single["mrr"] != pytest.approx(want_fed["mrr"])  # the two checks are distinct

    got_single = evaluate_fusion(ScoreFusion.from_weights(1.0, 0.0), single, fed, test, filter_fn)
    got_fed = evaluate_fusion(ScoreFusion.from_weights(0.0, 1.0), single, fed, test, filter_fn)
    assert_metrics_equal(got_single, want_single)
    assert_metrics_equal(got_fed, want_fed)
    # Chunking the queries (filter rows are chunk-relative) changes nothing.
    got_chunked = evaluate_fusion(
        ScoreFusion.from_weights(1.0, 0.0), single, fed, test, filter_fn, chunk_size=7
    )
    assert_metrics_equal(got_chunked, want_single)
    # A mixed weighting is the brute-force ranking of the mixed table.
    mixed = evaluate_fusion(ScoreFusion.from_weights(0.5, 2.0, bias=3.0), single, fed, test, filter_fn, chunk_size=11)
    assert_metrics_equal(mixed, brute_metrics(0.5 * single_table + 2.0 * fed_table + 3.0, test, tails))


# --------------------------------------------------------------------------- training


@pytest.mark.slow
def test_fit_fusion_learns_to_trust_the_perfect_model():
    # Enough validation triples that the noise model's finite-sample correlation with the
    # labels is small; the margin (10) forces the weight on the perfect 0/1 scores above ~10.
    n_ent, n_rel = 200, 5
    train, valid, test = make_kg(seed=4, n_train=3000, n_valid=2000, n_test=150, n_ent=n_ent, n_rel=n_rel)
    g = torch.Generator().manual_seed(7)
    noise = TableModel(torch.randn(n_ent, n_rel, n_ent, generator=g))
    perfect = TableModel(true_mask(train, valid, test, n_ent=n_ent, n_rel=n_rel).float())
    filter_fn, _ = brute_filter_fn(torch.cat([train, valid, test]).tolist())

    fusion = fit_fusion(
        noise, perfect, valid, n_ent, num_negatives=32, epochs=EPOCHS_PERFECT, batch_size=64, lr=0.03,
        generator=torch.Generator().manual_seed(0),
    )
    w_single, w_fed = fusion.weight.tolist()
    assert w_fed > 8.0
    assert w_fed > 10 * abs(w_single)
    hist = fusion.loss_history
    assert hist.shape == (EPOCHS_PERFECT,)
    assert hist[-5:].mean() < 0.1 * hist[:5].mean()

    fed_only = evaluate_fusion(ScoreFusion.from_weights(0.0, 1.0), noise, perfect, test, filter_fn)
    fused = evaluate_fusion(fusion, noise, perfect, test, filter_fn)
    noise_only = evaluate_fusion(ScoreFusion.from_weights(1.0, 0.0), noise, perfect, test, filter_fn)
    assert fed_only["mrr"] == 1.0
    assert fused["mrr"] == 1.0
    assert noise_only["mrr"] < 0.2


def test_fit_fusion_caches_frozen_scores_and_uses_filtered_negatives():
    train, valid, _ = make_kg(seed=6)
    g = torch.Generator().manual_seed(8)
    single = TableModel(torch.randn(N_ENT, N_REL, N_ENT, generator=g))
    fed = TableModel(torch.randn(N_ENT, N_REL, N_ENT, generator=g))
    before = (single.table.detach().clone(), fed.table.detach().clone())
    rng_state = torch.get_rng_state()

    fit_fusion(single, fed, valid, N_ENT, num_negatives=16, epochs=40, batch_size=32,
               generator=torch.Generator().manual_seed(1), score_chunk_size=100)
    # Scores computed once: ceil(160 / 100) = 2 chunks x (forward + score_tails), not per epoch.
    assert single.calls == 4 and fed.calls == 4
    # The KGE models are untouched and the global RNG is not consumed.
    assert torch.equal(single.table, before[0]) and torch.equal(fed.table, before[1])
    assert single.table.grad is None and fed.table.grad is None
    assert torch.equal(torch.get_rng_state(), rng_state)
    # Both models scored the same negatives, none of which is a validation true tail.
    vmask = true_mask(valid)
    negs_single = torch.cat([c for _, _, c in single.seen_candidates])
    negs_fed = torch.cat([c for _, _, c in fed.seen_candidates])
    assert torch.equal(negs_single, negs_fed) and negs_single.shape == (valid.shape[0], 16)
    h = torch.cat([h for h, _, _ in single.seen_candidates]).unsqueeze(1).expand_as(negs_single)
    r = torch.cat([r for _, r, _ in single.seen_candidates]).unsqueeze(1).expand_as(negs_single)
    assert torch.equal(h[:, 0], valid[:, 0]) and torch.equal(r[:, 0], valid[:, 1])
    assert not vmask[h, r, negs_single].any()


def test_fit_fusion_is_reproducible_with_a_generator():
    _, valid, _ = make_kg(seed=9)
    g = torch.Generator().manual_seed(2)
    single = TableModel(torch.randn(N_ENT, N_REL, N_ENT, generator=g))
    fed = TableModel(torch.randn(N_ENT, N_REL, N_ENT, generator=g))
    kw = dict(num_negatives=8, epochs=20, batch_size=50)
    a = fit_fusion(single, fed, valid, N_ENT, generator=torch.Generator().manual_seed(11), **kw)
    b = fit_fusion(single, fed, valid, N_ENT, generator=torch.Generator().manual_seed(11), **kw)
    c = fit_fusion(single, fed, valid, N_ENT, generator=torch.Generator().manual_seed(12), **kw)
    assert torch.equal(a.linear.weight, b.linear.weight) and torch.equal(a.linear.bias, b.linear.bias)
    assert torch.equal(a.loss_history, b.loss_history)
    assert not torch.equal(a.linear.weight, c.linear.weight)


# --------------------------------------------------------------------------- real KGE models


@pytest.mark.parametrize("single_name,fed_name", [("transe", "distmult"), ("rotate", "complex")])
def test_fusion_with_real_kge_models(single_name, fed_name):
    kge = pytest.importorskip("lightning_fedkg.models.kge")
    train, valid, test = make_kg(seed=10)
    torch.manual_seed(0)
    single = kge.build_model(single_name, N_ENT, N_REL, dim=8, gamma=4.0, epsilon=2.0)
    fed = kge.build_model(fed_name, N_ENT, N_REL, dim=8, gamma=4.0, epsilon=2.0)
    before = [p.detach().clone() for p in (*single.parameters(), *fed.parameters())]

    fusion = fit_fusion(single, fed, valid, N_ENT, num_negatives=16, epochs=5, batch_size=64,
                        generator=torch.Generator().manual_seed(0))
    after = [p.detach() for p in (*single.parameters(), *fed.parameters())]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert all(p.grad is None for p in (*single.parameters(), *fed.parameters()))
    assert torch.isfinite(fusion.loss_history).all()

    # Brute-force tables from forward() over the whole (h, r, t) grid.
    grid = torch.cartesian_prod(torch.arange(N_ENT), torch.arange(N_REL), torch.arange(N_ENT))
    with torch.no_grad():
        single_table = single(*grid.unbind(1)).reshape(N_ENT, N_REL, N_ENT)
        fed_table = fed(*grid.unbind(1)).reshape(N_ENT, N_REL, N_ENT)
    filter_fn, tails = brute_filter_fn(torch.cat([train, valid, test]).tolist())
    got_single = evaluate_fusion(ScoreFusion.from_weights(1.0, 0.0), single, fed, test, filter_fn, chunk_size=13)
    got_fed = evaluate_fusion(ScoreFusion.from_weights(0.0, 1.0), single, fed, test, filter_fn, chunk_size=13)
    assert_metrics_equal(got_single, brute_metrics(single_table, test, tails))
    assert_metrics_equal(got_fed, brute_metrics(fed_table, test, tails))
    w_s, w_f = fusion.weight.tolist()
    b = float(fusion.bias.detach())
    got_fused = evaluate_fusion(fusion, single, fed, test, filter_fn)
    assert_metrics_equal(got_fused, brute_metrics(w_s * single_table + w_f * fed_table + b, test, tails))


# --------------------------------------------------------------------------- the LightningModule


def test_fusion_module_trains_under_a_plain_trainer(one_thread):
    import lightning as L

    from lightning_fedkg.methods.fede.fusion import FusionModule

    g = torch.Generator().manual_seed(3)
    pos, neg = torch.randn(40, generator=g), torch.randn(40, 6, generator=g)
    module = FusionModule(pos, neg, pos + 1.0, neg - 1.0, batch_size=16, lr=0.05,
                          generator=torch.Generator().manual_seed(0))
    weight, bias = module.fusion.linear.weight.detach().clone(), module.fusion.linear.bias.detach().clone()
    trainer = L.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module)
    history = module.loss_history()
    assert history.shape == (3,) and torch.isfinite(history).all()
    assert trainer.global_step == 3 * 3  # ceil(40 / 16) Adam steps per epoch
    assert not torch.equal(module.fusion.linear.weight, weight)
    assert torch.equal(module.fusion.linear.bias, bias)  # it cancels in the margin loss: no gradient


@pytest.mark.parametrize("models,epochs,batch_size,seeded", [
    ("tables", 40, 32, True),   # 160 positives: five full batches
    ("tables", 9, 50, True),    # a short last batch
    ("tables", 6, 64, False),   # global RNG: both draw the same numbers from it
    ("kge", 7, 64, True),
])
def test_fit_fusion_is_the_plain_loop_bit_for_bit(models, epochs, batch_size, seeded, one_thread):
    """The Trainer's fit of FusionModule gives the weights, bias and loss history of the
    plain loop it replaced (tests/plain_loops.py), and leaves the global RNG where it does."""
    from plain_loops import plain_fit_fusion

    _, valid, _ = make_kg(seed=9)
    if models == "tables":
        g = torch.Generator().manual_seed(2)
        single = TableModel(torch.randn(N_ENT, N_REL, N_ENT, generator=g))
        fed = TableModel(torch.randn(N_ENT, N_REL, N_ENT, generator=g))
    else:
        from lightning_fedkg.models.kge import build_model

        torch.manual_seed(0)
        single = build_model("rotate", N_ENT, N_REL, dim=8, gamma=4.0, epsilon=2.0)
        fed = build_model("complex", N_ENT, N_REL, dim=8, gamma=4.0, epsilon=2.0)
    kw = dict(num_negatives=16, epochs=epochs, batch_size=batch_size, score_chunk_size=100)
    results = []
    for fit in (plain_fit_fusion, fit_fusion):
        torch.manual_seed(123)
        layer = fit(single, fed, valid, N_ENT, generator=torch.Generator().manual_seed(1) if seeded else None, **kw)
        results.append((layer.linear.weight.detach(), layer.linear.bias.detach(), layer.loss_history,
                        torch.get_rng_state()))
    (w0, b0, h0, rng0), (w1, b1, h1, rng1) = results
    assert torch.equal(w0, w1) and torch.equal(b0, b1) and torch.equal(h0, h1)
    assert torch.equal(rng0, rng1)
    assert h1.shape == (epochs,) and torch.isfinite(h1).all()
    # with a generator the global RNG is not drawn from; without, both drew the same numbers
    assert torch.equal(rng1, torch.Generator().manual_seed(123).get_state()) == seeded
