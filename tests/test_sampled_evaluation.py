"""Sampled filtered evaluation (``train.eval_candidates``): with K at least the entity count it
is the full ranking, with fewer it ranks against the drawn candidates exactly (a brute-force
oracle) and ``(rank - 1) · M / K`` averages to the full rank minus one (the documented
estimator)."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lightning_fedkg.config import ConfigError
from lightning_fedkg.data import KGDataModule, LoaderSettings, UniformSampler, load_kg
from lightning_fedkg.evaluation.ranking import TIE_MODES, draw_candidates, filtered_ranks, sampled_ranks
from lightning_fedkg.models import KGEModule

from conftest import make_small_config

pytestmark = pytest.mark.filterwarnings("ignore:.*does not have many workers")


@pytest.fixture(scope="module")
def umls():
    return load_kg("umls")


def trainer():
    return L.Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)


def datamodule(kg):
    return KGDataModule(kg, UniformSampler(8), LoaderSettings(eval_batch_size=100, eval_sides="both"), seed=0)


def module(kg, **options):
    torch.manual_seed(0)
    return KGEModule("transe", num_entities=kg.num_entities, num_relations=kg.num_relations, dim=16, **options)


def eval_batches(kg, split="valid"):
    return list(datamodule(kg).eval_dataloader(split))


@pytest.mark.parametrize("k", [135, 136, 10_000])
def test_k_at_least_the_entities_is_the_full_ranking(umls, k):
    full, sampled = module(umls), module(umls, eval_candidates=k)
    for batch in eval_batches(umls):
        assert torch.equal(full.rank_batch(batch), sampled.rank_batch(batch))
    trainer().validate(full, datamodule=datamodule(umls), verbose=False)
    trainer().validate(sampled, datamodule=datamodule(umls), verbose=False)
    assert full.last_metrics["val"] == sampled.last_metrics["val"]


def test_k_at_least_the_candidate_pool_is_the_full_ranking(umls):
    allowed = torch.zeros(umls.num_entities, dtype=torch.bool)
    allowed[::2] = True
    full, sampled = module(umls), module(umls, eval_candidates=68)  # 68 even ids
    full.eval_candidate_mask, sampled.eval_candidate_mask = allowed, allowed.clone()
    for batch in eval_batches(umls):
        assert torch.equal(full.rank_batch(batch), sampled.rank_batch(batch))


def oracle_ranks(scores: torch.Tensor, targets, sample, answers: list[set[int]], ties: str) -> list[float]:
    """Rank of each target among the sampled entities that are neither it nor a known answer."""
    out = []
    for i, target in enumerate(targets.tolist()):
        s_t = scores[i, target].item()
        competitors = [e for e in sample.tolist() if e != target and e not in answers[i]]
        better = sum(scores[i, e].item() > s_t for e in competitors)
        equal = [e for e in competitors if scores[i, e].item() == s_t]
        tie = {"optimistic": 0, "pessimistic": len(equal), "mean": len(equal) / 2,
               "arbitrary": sum(e < target for e in equal)}[ties]
        out.append(1 + better + tie)
    return out


@pytest.mark.parametrize("ties", TIE_MODES)
def test_sampled_ranks_equal_a_brute_force_count(ties):
    gen = torch.Generator().manual_seed(1)
    scores = torch.randint(0, 6, (12, 40), generator=gen).float()  # many ties
    scores[3, 7] = float("nan")
    targets = torch.randint(0, 40, (12,), generator=gen)
    sample = draw_candidates(40, 15, gen)
    row = torch.randint(0, 12, (30,), generator=gen)
    col = torch.randint(0, 40, (30,), generator=gen)
    answers = [set(col[row == i].tolist()) for i in range(12)]
    got = sampled_ranks(scores[:, sample], scores[torch.arange(12), targets], sample, targets, row, col, ties=ties)
    scores[3, 7] = float("-inf")  # a competitor scoring NaN counts as -inf
    assert got.tolist() == oracle_ranks(scores, targets, sample, answers, ties)


@pytest.mark.parametrize("mode_index", [0, 1])
def test_the_module_ranks_against_its_drawn_candidates_exactly(umls, mode_index):
    sampled = module(umls, eval_candidates=20, ties="mean")
    batch = eval_batches(umls)[mode_index * 7]  # a tail and a head batch
    sampled.reset_eval_candidates()
    sample = sampled.draw_eval_candidates()
    assert sample.numel() == 20 and sample.unique().numel() == 20
    sampled.reset_eval_candidates()
    ranks = sampled.rank_batch(batch)
    triples, mode = batch["triples"], batch["mode"]
    with torch.no_grad():
        if mode == "tail":
            scores, targets = sampled.model.score_tails(triples[:, 0], triples[:, 1]), triples[:, 2]
        else:
            scores, targets = sampled.model.score_heads(triples[:, 1], triples[:, 2]), triples[:, 0]
    answers = [set(batch["filter_col"][batch["filter_row"] == i].tolist()) for i in range(len(triples))]
    assert ranks.tolist() == oracle_ranks(scores, targets, sample, answers, "mean")


def test_the_sampled_rank_estimates_the_full_rank(umls, one_thread):
    """E[(rank_K - 1) · M / K] = full rank - 1: averaged over 100 seeds of the draws."""
    full = module(umls)
    every = eval_batches(umls)
    batches = every[:2] + every[7:9]  # 200 tail and 200 head queries
    full_minus_one = torch.cat([full.rank_batch(b) for b in batches]) - 1
    k, m = 20, umls.num_entities
    sampled = module(umls, eval_candidates=k)
    estimates = []
    for seed in range(100):
        sampled.hparams.eval_seed = seed
        sampled.reset_eval_candidates()
        estimates.append((torch.cat([sampled.rank_batch(b) for b in batches]) - 1) * m / k)
    mean = torch.stack(estimates).mean(0)
    assert mean.mean().item() == pytest.approx(full_minus_one.mean().item(), rel=0.02)
    # per query too, within the noise of 100 draws (std about 1.5 here)
    assert (mean - full_minus_one).abs().mean() < 0.1 * full_minus_one.mean()
    # and the sampled MRR overstates the full one (what the docs say)
    assert (1 / (1 + torch.stack(estimates) * k / m)).mean() > (1 / (1 + full_minus_one)).mean()


def test_every_evaluation_draws_the_same_candidates(umls):
    first = module(umls, eval_candidates=30)
    dm = datamodule(umls)
    trainer().validate(first, datamodule=dm, verbose=False)
    again = dict(first.last_metrics["val"])
    first.draw_eval_candidates()  # a stray draw between evaluations changes nothing
    trainer().validate(first, datamodule=dm, verbose=False)
    assert first.last_metrics["val"] == again
    other = module(umls, eval_candidates=30, eval_seed=5)
    trainer().validate(other, datamodule=dm, verbose=False)
    assert other.last_metrics["val"] != again


@pytest.mark.parametrize("size,k", [(1000, 50), (1000, 900), (10, 9)])
def test_draw_candidates_is_a_uniform_subset(size, k):
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(size)
    for _ in range(300):
        drawn = draw_candidates(size, k, gen)
        assert drawn.numel() == k and drawn.unique().numel() == k and 0 <= drawn.min() and drawn.max() < size
        counts[drawn] += 1
    expected = 300 * k / size
    assert (counts - expected).abs().max() < 6 * expected ** 0.5 + 1


def test_the_config_key_and_its_limits():
    assert make_small_config("fede", "train.eval_candidates=500").train.eval_candidates == 500
    with pytest.raises(ConfigError, match="train.eval_candidates"):
        make_small_config("fede", "train.eval_candidates=0")
    with pytest.raises(ValueError, match="eval_candidates"):
        KGEModule(num_entities=3, num_relations=1, eval_candidates=0)


def test_filtered_ranks_are_unchanged_by_the_shared_counting():
    # the full ranking's result on hand-made ties, as before the counting moved into a helper
    scores = torch.tensor([[3.0, 1.0, 3.0, 2.0], [0.5, 0.5, 0.5, 0.5]])
    targets = torch.tensor([2, 1])
    assert filtered_ranks(scores, targets, ties="arbitrary").tolist() == [2.0, 2.0]
    assert filtered_ranks(scores, targets, ties="mean").tolist() == [1.5, 2.5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampled_evaluation_on_a_gpu(umls):
    full, sampled = module(umls).cuda(), module(umls, eval_candidates=20).cuda()
    batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in eval_batches(umls)[0].items()}
    sampled.reset_eval_candidates()
    sample = sampled.draw_eval_candidates()
    assert sample.is_cuda and sample.unique().numel() == 20
    sampled.reset_eval_candidates()
    ranks = sampled.rank_batch(batch).cpu()
    triples = batch["triples"]
    with torch.no_grad():
        scores = sampled.model.score_tails(triples[:, 0], triples[:, 1]).cpu()
    answers = [set(batch["filter_col"][batch["filter_row"] == i].tolist()) for i in range(len(triples))]
    assert ranks.tolist() == oracle_ranks(scores, triples[:, 2].cpu(), sample.cpu(), answers, "mean")
    big = module(umls, eval_candidates=1000).cuda()
    assert torch.equal(full.rank_batch(batch), big.rank_batch(batch))
