"""Negative samplers: the batches of the sampler classes are, byte for byte, those the data
module drew before sampling was its own concern (digests recorded from that code)."""

import hashlib

import pytest
import torch

from lightning_fedkg.data import (BernoulliSampler, KGDataModule, LoaderSettings, NegativeSampler, UniformSampler,
                                  load_kg)

# SHA-256 of two epochs of train batches on Nations (every key, dtype, shape and value),
# recorded with the 19-argument KGDataModule of commit 9b395d2 from the same settings.
GOLDEN = {
    "tail": ("144e03406e06bb6e096e2b93530a60fdf82ab5785b5325e6de5f3aa9cb53073d",
             UniformSampler(8, corruption="tail"), LoaderSettings(batch_size=64), 1),
    "head_filtered": ("8f1116e17e4caeb887b676d278004fe2a5cf187385a3cd223bee695062cedde7",
                      UniformSampler(8, corruption="head", filtered=True), LoaderSettings(batch_size=64), 2),
    "both_search": ("257fff0411f08f13334208cb5646faef169a7da874be8ed6182f55d1664f2ccb",
                    UniformSampler(16, corruption="both", filtered=True, filter_method="search",
                                   max_filter_retries=3), LoaderSettings(batch_size=100), 3),
    "bernoulli": ("10f460de4cadbcacb00a22b0d123e8886ed8197b0986d9839513699669259765",
                  BernoulliSampler(5, filtered=True), LoaderSettings(batch_size=50), 4),
    "shared_index": ("45c86d044a99b01ca566092ac50f914e2d7207e718a6e6f4f1a8a759e3ef6b92",
                     UniformSampler(12, corruption="both", mode="shared", filtered=True),
                     LoaderSettings(batch_size=64), 5),
    "shared_search": ("e8a08a3f33ad85bdd5b880b4c2a7d2628e090c90bad19ac8c7455d17e28bba2f",
                      UniformSampler(12, mode="shared", filtered=True, filter_method="search"),
                      LoaderSettings(batch_size=64), 6),
    "pool_weights": ("ae4790a1038b4752fc18ee7f1c1bc5fc2ddc6581f7e0c6cde1f491fce0cdad40",
                     UniformSampler(6, corruption="both", pool=torch.arange(0, 14, 2)),
                     LoaderSettings(batch_size=80, subsampling=True), 7),
    "fixed_steps": ("29606cbc591c6373679f6e2797040b249dcfd7c13accf15d318c0777d993832e",
                    UniformSampler(4, corruption="both"),
                    LoaderSettings(batch_size=90, fixed_negatives=True, batches_per_step=3, shuffle=False), 8),
}


def digest(items) -> str:
    h = hashlib.sha256()
    for item in items:
        for batch in item if isinstance(item, list) else [item]:
            for key in sorted(batch):
                value = batch[key]
                h.update(key.encode())
                if isinstance(value, torch.Tensor):
                    h.update(f"{value.dtype}{tuple(value.shape)}".encode())
                    h.update(value.contiguous().numpy().tobytes())
                else:
                    h.update(repr(value).encode())
    return h.hexdigest()


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_batches_are_the_old_data_modules(case):
    want, sampler, loader, seed = GOLDEN[case]
    dm = KGDataModule(load_kg("nations"), sampler, loader, seed=seed)
    assert digest(list(dm.train_dataloader()) + list(dm.train_dataloader())) == want


def test_the_digest_sees_a_changed_batch():
    _, sampler, loader, seed = GOLDEN["tail"]
    batches = list(KGDataModule(load_kg("nations"), sampler, loader, seed=seed).train_dataloader())
    before = digest(batches)
    batches[-1]["negatives"][0, 0] += 1
    assert digest(batches) != before


def test_one_sampler_serves_several_data_modules_each_with_its_own_kg():
    nations, umls = load_kg("nations"), load_kg("umls")
    sampler = BernoulliSampler(3, filtered=True)
    a, b = KGDataModule(nations, sampler), KGDataModule(umls, sampler)
    assert a.sampler is not sampler and a.sampler is not b.sampler and sampler.kg is None
    assert a.sampler.head_probability.numel() == nations.num_relations
    assert b.sampler.head_probability.numel() == umls.num_relations
    assert len(a.sampler.train_index) == nations.triples("train").shape[0]


def test_an_unbound_sampler_says_so():
    with pytest.raises(RuntimeError, match="bind"):
        UniformSampler().train_index


@pytest.mark.parametrize("sampler,sides", [(UniformSampler(corruption="tail"), ("tail",)),
                                           (UniformSampler(corruption="head"), ("head",)),
                                           (UniformSampler(corruption="both"), ("tail", "head")),
                                           (BernoulliSampler(), ("mixed",))])
def test_sides_of_an_epoch(sampler, sides):
    assert sampler.sides == sides
    n = load_kg("nations").triples("train").shape[0]
    dm = KGDataModule(load_kg("nations"), sampler, LoaderSettings(batch_size=100))
    assert dm.num_train_batches == -(-n // 100) * len(sides)
    assert [b["mode"] for b in dm.train_dataloader()][: len(sides)] == list(sides)


@pytest.mark.parametrize("make", [
    lambda: BernoulliSampler(mode="shared"),
    lambda: UniformSampler(corruption="sideways"),
    lambda: NegativeSampler(mode="per_batch"),
    lambda: NegativeSampler(filter_method="fast"),
    lambda: NegativeSampler(num_negatives=-1),
    lambda: NegativeSampler(pool=torch.zeros(0, dtype=torch.long)),
    lambda: LoaderSettings(eval_sides="head"),
    lambda: LoaderSettings(batch_size=0),
    lambda: LoaderSettings(batches_per_step=0),
])
def test_invalid_settings_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_index_filtering_refuses_another_device_before_changing_anything():
    dm = KGDataModule(load_kg("nations"), UniformSampler(filtered=True, filter_method="index"))
    state = dm.generator.get_state()
    with pytest.raises(ValueError, match="index"):
        dm.to_device("meta")
    assert dm.device.type == "cpu" and torch.equal(dm.generator.get_state(), state)


def test_the_config_selects_the_sampler():
    from lightning_fedkg.builders import build_datamodule
    from lightning_fedkg.config import load_config

    kg = load_kg("nations")
    dm = build_datamodule(kg, load_config(None, ["train.negative_sampler=bernoulli", "train.num_negatives=7",
                                                 "train.filter_negatives=true"]), seed=0)
    assert type(dm.sampler) is BernoulliSampler and dm.sampler.num_negatives == 7 and dm.sampler.filtered
    dm = build_datamodule(kg, load_config(None, ["train.corruption=head", "train.negative_mode=shared",
                                                 "train.batch_size=33"]), seed=0, batch_size=11)
    assert type(dm.sampler) is UniformSampler and dm.sampler.sides == ("head",) and dm.sampler.mode == "shared"
    assert dm.loader.batch_size == 11 and not dm.sampler.filtered
