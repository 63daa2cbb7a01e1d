"""KGDataModule: filter index, evaluation batches, negative sampling, reproducibility."""

import math
from dataclasses import replace

import lightning.pytorch as pl
import pytest
import torch

from lightning_fedkg.data import (BernoulliSampler, FilterIndex, KGDataModule, KnowledgeGraph, LoaderSettings,
                                  UniformSampler, bernoulli_head_probability, load_kg)


def random_triples(seed, n, num_entities, num_relations):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, num_entities, (n,), generator=g),
                        torch.randint(0, num_relations, (n,), generator=g),
                        torch.randint(0, num_entities, (n,), generator=g)], 1)


def small_kg(seed=0, num_entities=12, num_relations=3):
    t = random_triples(seed, 150, num_entities, num_relations)
    t = torch.unique(t, dim=0)
    t = t[torch.randperm(t.shape[0], generator=torch.Generator().manual_seed(seed))]
    k = t.shape[0]
    return KnowledgeGraph({"train": t[: k - 30], "valid": t[k - 30: k - 15], "test": t[k - 15:]},
                          num_entities, num_relations)


def brute_answers(true_set, triples, mode):
    """Set of (row, entity) pairs: every true answer of each row's query."""
    out = set()
    for i, (h, r, t) in enumerate(triples.tolist()):
        for a, b, c in true_set:
            if mode == "tail" and (a, b) == (h, r):
                out.add((i, c))
            if mode == "head" and (b, c) == (r, t):
                out.add((i, a))
    return out


def pairs(row, col):
    got = list(zip(row.tolist(), col.tolist()))
    assert len(got) == len(set(got)), "duplicate filter pairs"
    return set(got)


# ---- filter index -----------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_filter_index_equals_bruteforce(seed):
    n_ent, n_rel = 11, 3
    triples = random_triples(seed, 90, n_ent, n_rel)  # contains duplicates
    true_set = {tuple(x) for x in triples.tolist()}
    index = FilterIndex(triples, n_ent, n_rel)
    assert len(index) == len(true_set)
    # every possible query, including ones without any answer
    queries = torch.cartesian_prod(torch.arange(n_ent), torch.arange(n_rel), torch.arange(n_ent))
    queries = queries[torch.randperm(queries.shape[0], generator=torch.Generator().manual_seed(seed))][:200]
    for mode in ("tail", "head"):
        assert pairs(*index.answers(queries, mode)) == brute_answers(true_set, queries, mode)
        target = 2 if mode == "tail" else 0
        expect = {(i, e) for i, e in brute_answers(true_set, queries, mode)
                  if e != queries[i, target].item()}
        assert pairs(*index.filter_pairs(queries, mode)) == expect
    member = index.contains(queries).tolist()
    assert member == [tuple(q) in true_set for q in queries.tolist()]


def test_filter_index_hand_case():
    t = torch.tensor([[0, 0, 1], [0, 0, 2], [3, 0, 2], [0, 1, 2]])
    index = FilterIndex(t, 4, 2)
    row, col = index.tail_answers(torch.tensor([0, 3, 1]), torch.tensor([0, 0, 0]))
    assert row.tolist() == [0, 0, 1] and col.tolist() == [1, 2, 2]
    row, col = index.head_answers(torch.tensor([0, 1]), torch.tensor([2, 2]))
    assert row.tolist() == [0, 0, 1] and col.tolist() == [0, 3, 0]
    row, col = index.filter_pairs(torch.tensor([[0, 0, 1]]), "tail")
    assert (row.tolist(), col.tolist()) == ([0], [2])


# ---- evaluation loaders -----------------------------------------------------------------

def test_eval_batches_equal_bruteforce_filter():
    kg = small_kg(1)
    dm = KGDataModule(kg, loader=LoaderSettings(eval_batch_size=7, eval_sides="both"))
    dm.setup("validate")
    true_set = {tuple(x) for s in ("train", "valid", "test") for x in kg.triples(s).tolist()}
    batches = list(dm.val_dataloader())
    assert len(batches) == len(dm.val_dataloader()) == 2 * math.ceil(15 / 7)
    assert [b["mode"] for b in batches] == ["tail"] * 3 + ["head"] * 3
    for mode in ("tail", "head"):
        got = torch.cat([b["triples"] for b in batches if b["mode"] == mode])
        assert torch.equal(got, kg.triples("valid"))
    for b in batches:
        target = 2 if b["mode"] == "tail" else 0
        expect = {(i, e) for i, e in brute_answers(true_set, b["triples"], b["mode"])
                  if e != b["triples"][i, target].item()}
        assert pairs(b["filter_row"], b["filter_col"]) == expect
    tails_only = KGDataModule(kg, loader=LoaderSettings(eval_batch_size=100, eval_sides="tail"))
    assert [b["mode"] for b in tails_only.test_dataloader()] == ["tail"]


def test_empty_split_gives_no_batches():
    kg = tiny_kg()  # empty valid / test
    dm = KGDataModule(kg)
    assert len(dm.val_dataloader()) == 0 and list(dm.val_dataloader()) == []


def test_explicit_filter_triples_replace_the_default():
    kg = small_kg(2)
    train_only = {tuple(x) for x in kg.triples("train").tolist()}
    dm = KGDataModule(kg, loader=LoaderSettings(eval_batch_size=100), filter_triples=kg.triples("train"))
    for b in dm.test_dataloader():
        target = 2 if b["mode"] == "tail" else 0
        expect = {(i, e) for i, e in brute_answers(train_only, b["triples"], b["mode"])
                  if e != b["triples"][i, target].item()}
        assert pairs(b["filter_row"], b["filter_col"]) == expect


def test_valid_filter_triples_filter_validation_only():
    """A method's own validation filter (FedLU's rule sets one: tests/test_fedlu_data.py)
    replaces the filter of validation only, and set_valid_filter(None) gives the test's back."""
    kg = small_kg(2)
    everything = {tuple(x) for x in kg.all_true_triples().tolist()}
    train_only = {tuple(x) for x in kg.triples("train").tolist()}
    dm = KGDataModule(kg, loader=LoaderSettings(eval_batch_size=100), valid_filter_triples=kg.triples("train"))
    for valid_truth in (train_only, everything):
        for split, truth in (("valid", valid_truth), ("test", everything)):
            for b in dm.eval_dataloader(split):
                target = 2 if b["mode"] == "tail" else 0
                expect = {(i, e) for i, e in brute_answers(truth, b["triples"], b["mode"])
                          if e != b["triples"][i, target].item()}
                assert pairs(b["filter_row"], b["filter_col"]) == expect, split
        dm.set_valid_filter(None)


def test_setup_is_idempotent_and_lazy():
    dm = KGDataModule(small_kg(), UniformSampler(filtered=True))
    assert dm._filter_index is None
    dm.setup("fit")
    index, train_index = dm.filter_index, dm.sampler.train_index
    dm.setup("fit")
    dm.setup("test")
    assert dm.filter_index is index and dm.sampler.train_index is train_index


# ---- negative sampling ------------------------------------------------------------------

def tiny_kg():
    # (0, 0, ?) has true tails {0, 1}: the only valid tail negative is 2;
    # (?, 0, 1) has true heads {0, 2}: the only valid head negative is 1
    train = torch.tensor([[0, 0, 0], [0, 0, 1], [2, 0, 1]])
    empty = torch.zeros(0, 3, dtype=torch.long)
    return KnowledgeGraph({"train": train, "valid": empty, "test": empty}, 3, 1)


def test_filtered_negatives_hand_case():
    kg = tiny_kg()
    dm = KGDataModule(kg, UniformSampler(50, filtered=True, max_filter_retries=200), seed=3)
    neg = dm.sampler.sample_negatives(torch.tensor([[0, 0, 1]]), torch.tensor([False]), dm.generator)
    assert neg.tolist() == [[2] * 50]
    neg = dm.sampler.sample_negatives(torch.tensor([[2, 0, 1]]), torch.tensor([True]), dm.generator)
    assert neg.tolist() == [[1] * 50]
    unfiltered = KGDataModule(kg, UniformSampler(50), seed=3)
    raw = unfiltered.sampler.sample_negatives(torch.tensor([[0, 0, 1]]), torch.tensor([False]),
                                            unfiltered.generator)
    assert set(raw.flatten().tolist()) == {0, 1, 2}


@pytest.mark.parametrize("sampler,corruption,method", [(UniformSampler, "tail", "index"),
                                                       (UniformSampler, "both", "index"),
                                                       (BernoulliSampler, None, "index"),
                                                       (UniformSampler, "both", "search"),
                                                       (BernoulliSampler, None, "search")])
@pytest.mark.slow
def test_filtered_negatives_are_never_train_triples(sampler, corruption, method):
    # Nations has 14 entities: many draws collide with true triples, and some queries
    # have a single valid negative (e.g. 13 true heads), hence the generous retry bound
    kg = load_kg("nations")
    train = {tuple(x) for x in kg.triples("train").tolist()}
    side = {} if corruption is None else {"corruption": corruption}
    dm = KGDataModule(kg, sampler(16, filtered=True, max_filter_retries=1000, filter_method=method, **side),
                      LoaderSettings(batch_size=64))
    dm.setup("fit")
    collisions = 0
    for i, b in enumerate(dm.train_dataloader()):
        if i == 4:
            break
        pos, neg = b["positive"], b["negatives"]
        if b["mode"] == "mixed":
            head = b["head_mask"]
        else:
            head = torch.full((pos.shape[0],), b["mode"] == "head")
        for (h, r, t), row, is_head in zip(pos.tolist(), neg.tolist(), head.tolist()):
            original = h if is_head else t
            for e in row:
                cand = (e, r, t) if is_head else (h, r, e)
                assert cand not in train
                assert e != original
        # the same draws without the filter would collide: the test can fail
        hm = head.unsqueeze(1)
        raw = torch.randint(0, 14, neg.shape, generator=torch.Generator().manual_seed(i))
        cands = torch.stack([torch.where(hm, raw, pos[:, :1]), pos[:, 1:2].expand_as(raw),
                             torch.where(hm, pos[:, 2:], raw)], -1)
        collisions += sum(tuple(c) in train for c in cands.reshape(-1, 3).tolist())
    assert collisions > 0


def test_negative_pool_and_shared_mode():
    kg = small_kg()
    pool = torch.tensor([2, 5, 7])
    dm = KGDataModule(kg, UniformSampler(40, pool=pool), LoaderSettings(batch_size=10))
    b = next(iter(dm.train_dataloader()))
    assert b["negatives"].shape == (10, 40)
    assert set(b["negatives"].unique().tolist()) == {2, 5, 7}
    shared = KGDataModule(kg, UniformSampler(6, mode="shared"), LoaderSettings(batch_size=10))
    b = next(iter(shared.train_dataloader()))
    assert b["negatives"].shape == (6,) and b["mode"] == "tail"
    assert ((b["negatives"] >= 0) & (b["negatives"] < kg.num_entities)).all()


@pytest.mark.parametrize("method", ["index", "search"])  # the CPU path and the accelerators' path
@pytest.mark.parametrize("corruption", ["tail", "head"])
def test_filtered_shared_negatives_mask_equals_bruteforce(corruption, method):
    kg = small_kg(seed=3, num_entities=8, num_relations=2)
    dm = KGDataModule(kg, UniformSampler(8, corruption=corruption, mode="shared", filtered=True, filter_method=method),
                      LoaderSettings(batch_size=16), seed=1)
    train = {tuple(t) for t in kg.triples("train").tolist()}
    masked = 0
    for b in dm.train_dataloader():
        neg, mask = b["negatives"], b["negative_mask"]
        assert mask.shape == (b["positive"].shape[0], neg.numel())
        for i, (h, r, t) in enumerate(b["positive"].tolist()):
            for j, e in enumerate(neg.tolist()):
                candidate = (h, r, e) if corruption == "tail" else (e, r, t)
                assert bool(mask[i, j]) == (candidate not in train)
        masked += int((~mask).sum())
    assert masked > 0  # the case is dense enough that some negatives are true triples


def test_invalid_options():
    with pytest.raises(TypeError, match="valid_filter"):
        KGDataModule(small_kg(), valid_filter="none")  # FedLU's rule, not the datamodule's


def test_bernoulli_probability_hand_case():
    t = torch.tensor([[0, 0, 1], [0, 0, 2], [0, 0, 3], [1, 1, 0], [2, 1, 0], [2, 1, 0]])
    p = bernoulli_head_probability(t, 3)
    # r0: one head, three tails -> tph 3, hpt 1; r1: tph 1, hpt 2; r2 unused
    assert torch.allclose(p, torch.tensor([0.75, 1 / 3, 0.5]))


def test_bernoulli_head_rate_matches_tph_over_tph_plus_hpt():
    kg = load_kg("umls")
    dm = KGDataModule(kg, BernoulliSampler(1), seed=11)
    p = dm.sampler.head_probability
    assert ((p > 0.2) & (p < 0.8)).sum() < p.numel()  # the rates really differ per relation
    reps = 60
    pos = kg.triples("train").repeat(reps, 1)
    b = dm.make_batch(pos, "mixed")
    assert b["mode"] == "mixed" and b["negatives"].shape == (pos.shape[0], 1)
    r = pos[:, 1]
    count = torch.bincount(r, minlength=kg.num_relations).double()
    heads = torch.bincount(r, weights=b["head_mask"].double(), minlength=kg.num_relations)
    seen = count > 0
    rate = heads[seen] / count[seen]
    expect = p[seen].double()
    tol = 4 * torch.sqrt(expect * (1 - expect) / count[seen]) + 1e-9
    assert ((rate - expect).abs() <= tol).all()


# ---- training epochs --------------------------------------------------------------------

def test_both_sides_each_triple_once_per_side():
    kg = small_kg(3)
    dm = KGDataModule(kg, UniformSampler(2, corruption="both"), LoaderSettings(batch_size=16))
    batches = list(dm.train_dataloader())
    n = kg.triples("train").shape[0]
    assert len(batches) == len(dm.train_dataloader()) == 2 * math.ceil(n / 16)
    assert [b["mode"] for b in batches[:4]] == ["tail", "head", "tail", "head"]
    key = lambda t: sorted(map(tuple, t.tolist()))
    for mode in ("tail", "head"):
        seen = torch.cat([b["positive"] for b in batches if b["mode"] == mode])
        assert key(seen) == key(kg.triples("train"))


def flatten(batches):
    return [torch.cat([b["positive"].flatten(), b["negatives"].flatten()]) for b in batches]


def test_generator_state_round_trip():
    kg = small_kg(4)
    kw = dict(sampler=UniformSampler(5, corruption="both", filtered=True), loader=LoaderSettings(batch_size=20))
    a = KGDataModule(kg, seed=1, **kw)
    list(a.train_dataloader())  # epoch 1
    state = a.state_dict()
    epoch2 = flatten(a.train_dataloader())
    b = KGDataModule(kg, seed=99, **kw)
    assert not all(torch.equal(x, y) for x, y in zip(flatten(b.train_dataloader()), epoch2))
    b.load_state_dict(state)
    assert all(torch.equal(x, y) for x, y in zip(flatten(b.train_dataloader()), epoch2))


class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch["positive"].clone(), batch["negatives"].clone()))
        return (self.w * batch["negatives"].float().mean()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(module, dm, epochs, ckpt=None, tmp=None):
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_checkpointing=False, enable_model_summary=False,
                         limit_val_batches=0, default_root_dir=tmp)
    trainer.fit(module, datamodule=dm, ckpt_path=ckpt)
    return trainer


def test_lightning_resume_draws_the_same_batches(tmp_path):
    kg = small_kg(5)
    kw = dict(sampler=BernoulliSampler(4), loader=LoaderSettings(batch_size=32))
    straight = Recorder()
    fit(straight, KGDataModule(kg, seed=7, **kw), 2, tmp=tmp_path)
    first = Recorder()
    trainer = fit(first, KGDataModule(kg, seed=7, **kw), 1, tmp=tmp_path)
    ckpt = tmp_path / "epoch1.ckpt"
    trainer.save_checkpoint(ckpt)
    resumed = Recorder()
    fit(resumed, KGDataModule(kg, seed=12345, **kw), 2, ckpt=str(ckpt), tmp=tmp_path)
    want = [(p, n) for e, p, n in straight.seen if e == 1]
    got = [(p, n) for e, p, n in resumed.seen if e == 1]
    assert len(got) == len(want) > 0
    assert all(torch.equal(p, q) and torch.equal(n, m) for (p, n), (q, m) in zip(got, want))


def test_subsampling_weights_by_hand_and_against_counting():
    from lightning_fedkg.data.datamodule import subsampling_weights

    # (0,r0) occurs twice as (head, relation), (1,r0) as (tail, relation) twice:
    # triple (0,0,1): c(h,r) = 3+2, c(t,r^-1) = 3+2 -> 1/sqrt(10); (2,1,1): 4 + 4 -> 1/sqrt(8)
    t = torch.tensor([[0, 0, 1], [0, 0, 1], [2, 1, 1]])
    assert subsampling_weights(t, 3, 2).tolist() == pytest.approx([10 ** -0.5, 10 ** -0.5, 8 ** -0.5])
    # oracle: Python counters with the RotatE code's start value 4 on a first occurrence
    t = random_triples(3, 200, 9, 4)
    counts = {}
    for h, r, o in t.tolist():
        for key in ((h, r), (o, -r - 1)):
            counts[key] = counts.get(key, 3) + 1
    want = [(counts[(h, r)] + counts[(o, -r - 1)]) ** -0.5 for h, r, o in t.tolist()]
    assert subsampling_weights(t, 9, 4).tolist() == pytest.approx(want, rel=1e-6)


def test_subsampling_batches_carry_the_weights_of_their_rows():
    kg = small_kg()
    dm = KGDataModule(kg, UniformSampler(4, corruption="both"), LoaderSettings(batch_size=16, subsampling=True), seed=1)
    weight_of = {tuple(row): w for row, w in zip(kg.triples("train").tolist(), dm.train_weights.tolist())}
    batches = list(dm.train_dataloader())
    assert len(batches) == dm.num_train_batches
    for batch in batches:
        assert batch["weight"].tolist() == [weight_of[tuple(row)] for row in batch["positive"].tolist()]
    assert "weight" not in next(iter(KGDataModule(kg, UniformSampler(4),
                                                  LoaderSettings(batch_size=16)).train_dataloader()))


def test_train_subsampling_reaches_the_datamodule():
    from lightning_fedkg.config import load_config
    from lightning_fedkg.builders import build_datamodule

    kg = small_kg()
    assert build_datamodule(kg, load_config(None, ["train.subsampling=true"]), seed=0).loader.subsampling
    assert not build_datamodule(kg, load_config(None, []), seed=0).loader.subsampling


def batch_tensors(batch):
    return [batch[k] for k in sorted(batch) if isinstance(batch[k], torch.Tensor)]


def same_batches(a, b):
    return len(a) == len(b) and all(
        x["mode"] == y["mode"] and sorted(x) == sorted(y)
        and all(torch.equal(s, t) for s, t in zip(batch_tensors(x), batch_tensors(y)))
        for x, y in zip(a, b))


@pytest.mark.parametrize("sampler,subsampling", [
    (UniformSampler(5, corruption="both", filtered=True), True),
    (UniformSampler(5, mode="shared", filtered=True, corruption="both"), False),
    (BernoulliSampler(5), False),
])
def test_fixed_negatives_replay_one_epoch_that_the_seed_determines(sampler, subsampling):
    kg = small_kg(6)
    fixed = LoaderSettings(batch_size=16, fixed_negatives=True, subsampling=subsampling)
    dm = KGDataModule(kg, sampler, fixed, seed=3)
    epoch1, epoch2 = list(dm.train_dataloader()), list(dm.train_dataloader())
    assert len(epoch1) == dm.num_train_batches and same_batches(epoch1, epoch2)
    # the live generator neither feeds nor disturbs the fixed epoch: a resumed run (new
    # datamodule, any loaded sampler state) replays the same batches
    other = KGDataModule(kg, sampler, fixed, seed=3)
    other.load_state_dict(KGDataModule(kg, seed=42).state_dict())
    assert same_batches(list(other.train_dataloader()), epoch1)
    fresh = KGDataModule(kg, sampler, replace(fixed, fixed_negatives=False), seed=3)
    assert not same_batches(list(fresh.train_dataloader()), list(fresh.train_dataloader()))
    assert not same_batches(list(KGDataModule(kg, sampler, fixed, seed=4).train_dataloader()), epoch1)


def test_fixed_negatives_are_filtered_and_survive_training(tmp_path):
    kg = small_kg(7)
    kw = dict(sampler=UniformSampler(6, corruption="both", filtered=True),
              loader=LoaderSettings(batch_size=16, fixed_negatives=True), seed=2)
    dm = KGDataModule(kg, **kw)
    recorder = Recorder()
    fit(recorder, dm, 3, tmp=tmp_path)
    per_epoch = [[(p, n) for e, p, n in recorder.seen if e == epoch] for epoch in range(3)]
    assert len(per_epoch[0]) == dm.num_train_batches
    assert all(torch.equal(p, q) and torch.equal(n, m)
               for epoch in per_epoch[1:] for (p, n), (q, m) in zip(epoch, per_epoch[0]))
    train = {tuple(t) for t in kg.triples("train").tolist()}
    for batch in KGDataModule(kg, **kw).train_dataloader():
        for (h, r, t), negatives in zip(batch["positive"].tolist(), batch["negatives"].tolist()):
            made = [(e, r, t) if batch["mode"] == "head" else (h, r, e) for e in negatives]
            assert not train.intersection(made)


def test_fixed_negatives_draw_only_the_batches_trained():
    kg = small_kg(8)
    dm = KGDataModule(kg, UniformSampler(3), LoaderSettings(batch_size=8, fixed_negatives=True), seed=1)
    loader = iter(dm.train_dataloader())
    first_two = [next(loader), next(loader)]
    assert len(dm._fixed_epoch[0]) == 2
    assert same_batches(first_two, list(dm.train_dataloader())[:2])
    assert len(dm._fixed_epoch[0]) == dm.num_train_batches


def test_train_fixed_negatives_reaches_the_datamodule():
    from lightning_fedkg.config import load_config
    from lightning_fedkg.builders import build_datamodule

    kg = small_kg()
    assert build_datamodule(kg, load_config(None, ["train.fixed_negatives=true"]), seed=0).loader.fixed_negatives
    assert not build_datamodule(kg, load_config(None, []), seed=0).loader.fixed_negatives
