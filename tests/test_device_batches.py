"""Training batches made on the module's device, and training steps that read nothing back.

On a GPU every value read back to the host (``.item()``, ``bool(tensor)``, a ``nonzero``
whose size the host must know, ...) stalls the queue of kernels. This machine has no GPU,
so the tests count, with a ``TorchDispatchMode``, the aten operators that would
synchronise a CUDA device while the sampler makes a batch and the module computes its
losses; the accelerators' filter (``filter_method="search"``) must need none. Where CUDA
exists the same epoch also runs under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from itertools import islice

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lightning_fedkg.config import load_config
from lightning_fedkg.data import BernoulliSampler, KGDataModule, LoaderSettings, UniformSampler, load_kg
from lightning_fedkg.federated.party import build_party, load_federated_kg
from lightning_fedkg.federated.tasks import LinkPrediction

#: aten operators whose result size or value the host must wait for on a CUDA device
SYNCING = ("_local_scalar_dense", "nonzero", "masked_select", "repeat_interleave", "unique", "_unique",
           "equal", "is_nonzero", "item")


class SyncCounter(TorchDispatchMode):
    """Counts the operators of :data:`SYNCING` run inside the ``with`` block."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name.startswith(SYNCING):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def counted(obj, name: str, counter: SyncCounter) -> None:
    """Run ``obj.name`` under ``counter`` from now on."""
    original = getattr(obj, name)

    def wrapper(*args, **kwargs):
        with counter:
            return original(*args, **kwargs)

    setattr(obj, name, wrapper)


@pytest.mark.parametrize("overrides", [
    [],                                                         # FedE: shared filtered negatives
    ["train.negative_mode=per_triple"],                         # per-triple, filtered
    ["train.fixed_negatives=true", "train.subsampling=true"],   # FedLU's parity sampling
], ids=["shared", "per_triple", "fixed_subsampled"])
@pytest.mark.parametrize("strategy", ["fede", "fedlu"])
@pytest.mark.slow
def test_a_training_epoch_reads_nothing_back_per_step(strategy, overrides):
    cfg = load_config("configs/fede/umls_fede.yaml", [
        f"federated.strategy={strategy}", "model.dim=8", "train.batch_size=64", "train.num_negatives=16",
        "train.filter_negatives=true", "train.corruption=both", "trainer.threads=1", "trainer.progress_bar=false",
        "trainer.accelerator=cpu", *overrides])
    kg = load_federated_kg(cfg).clients[0]
    party = build_party(cfg, LinkPrediction(), "client_0", kg, names={})
    dm, module = party.datamodule, party.module
    dm.sampler.filter_method = "search"
    counter = SyncCounter()
    counted(dm, "make_batch", counter)
    counted(module, "training_loss", counter)
    if hasattr(module, "global_loss"):
        module.distill_local = module.distill_global = True  # the KL terms run too
        counted(module, "global_loss", counter)
    party.fit(1)  # the first epoch builds the indexes and the device copies (once per run)
    counter.seen.clear()
    stats = party.fit(1)
    assert dm.num_train_batches >= 6 and stats["loss"] == stats["loss"]  # trained, finite
    assert counter.seen == [], f"host reads in a training step: {sorted(set(counter.seen))}"


def test_the_counter_sees_what_would_synchronise():
    """The CPU's own filter path (``index``) gathers known answers with data-dependent
    sizes: the counter must flag it, or the test above could not fail."""
    kg = load_kg("nations")
    dm = KGDataModule(kg, UniformSampler(8, mode="shared", filtered=True, filter_method="index"),
                      LoaderSettings(batch_size=32))
    counter = SyncCounter()
    with counter:
        next(iter(dm.train_dataloader()))
    assert counter.seen


@pytest.mark.parametrize("corruption", ["tail", "both"])
def test_shared_masks_of_both_filter_methods_are_identical(corruption):
    """Shared negatives are drawn the same way by both methods, so whole epochs match."""
    kg = load_kg("umls")
    epochs = []
    for method in ("index", "search"):
        dm = KGDataModule(kg, UniformSampler(64, corruption=corruption, mode="shared", filtered=True,
                                             filter_method=method),
                          LoaderSettings(batch_size=128), seed=4)
        epochs.append(list(dm.train_dataloader()))
    assert len(epochs[0]) == len(epochs[1])
    masked = 0
    for a, b in zip(*epochs):
        assert torch.equal(a["negatives"], b["negatives"]) and torch.equal(a["negative_mask"], b["negative_mask"])
        masked += int((~a["negative_mask"]).sum())
    assert masked > 0


#: The first three batches of each sampler on Nations (seed 7, batch 64, 8 negatives, filtered),
#: summarised as (sum of heads, position-weighted sum of negatives[, mask sum][, head rows]),
#: computed with the code before batches moved to the device (commit 9d0c6ec): the CPU must
#: keep drawing exactly those batches.
CPU_BATCHES_BEFORE = {
    "shared": [[376, 146, 342], [400, 192, 306], [364, 200, 334]],
    "per_triple": [[376, 891268], [400, 926644], [364, 950338]],
    "bernoulli": [[376, 902930, 25], [364, 893571, 33], [376, 878478, 36]],
}


@pytest.mark.parametrize("sampler", sorted(CPU_BATCHES_BEFORE))
def test_cpu_batches_are_those_of_the_code_before_device_batches(sampler):
    negatives = {"shared": UniformSampler(8, mode="shared", corruption="both", filtered=True),
                 "per_triple": UniformSampler(8, mode="per_triple", corruption="both", filtered=True),
                 "bernoulli": BernoulliSampler(8, filtered=True)}[sampler]
    dm = KGDataModule(load_kg("nations"), negatives, LoaderSettings(batch_size=64), seed=7)
    seen = []
    for b in islice(dm.train_dataloader(), 3):
        negatives = b["negatives"].double()
        weights = torch.arange(1, negatives.numel() + 1, dtype=torch.float64).view(negatives.shape)
        row = [int(b["positive"][:, 0].sum()), int((negatives * weights).sum())]
        row += [int(b[k].sum()) for k in ("negative_mask", "head_mask") if k in b]
        seen.append(row)
    assert seen == CPU_BATCHES_BEFORE[sampler]


def test_sampler_state_names_its_device_and_restores():
    kg = load_kg("nations")
    b = KGDataModule(kg, UniformSampler(4), LoaderSettings(batch_size=16), seed=2)
    assert b.to_device("cpu") is b and b.state_dict()["device"] == "cpu"
    list(b.train_dataloader())
    c = KGDataModule(kg, UniformSampler(4), LoaderSettings(batch_size=16), seed=9)
    c.load_state_dict(b.state_dict())
    assert torch.equal(next(iter(c.train_dataloader()))["negatives"], next(iter(b.train_dataloader()))["negatives"])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_epoch_runs_under_sync_debug_error():
    kg = load_kg("umls")
    dm = KGDataModule(kg, UniformSampler(64, corruption="both", mode="shared", filtered=True),
                      LoaderSettings(batch_size=128)).to_device("cuda")
    list(islice(dm.train_dataloader(), 1))  # device copies made outside the checked block
    torch.cuda.set_sync_debug_mode("error")
    try:
        batches = list(dm.train_dataloader())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert batches[0]["negatives"].is_cuda and batches[0]["negative_mask"].is_cuda


@pytest.mark.parametrize("strategy", ["fede", "fedlu"])
@pytest.mark.slow
def test_several_batches_per_step_give_the_same_updates(strategy):
    """``train.batches_per_step`` only changes how batches are handed to the module: after
    two epochs the weights equal those of one batch per step, bit for bit."""
    weights = []
    for k in (1, 4):
        cfg = load_config("configs/fede/umls_fede.yaml", [
            f"federated.strategy={strategy}", "model.dim=8", "train.batch_size=64", "train.num_negatives=16",
            "trainer.threads=1", "trainer.progress_bar=false", "trainer.accelerator=cpu",
            f"train.batches_per_step={k}"])
        party = build_party(cfg, LinkPrediction(), "client_0", load_federated_kg(cfg).clients[0], names={})
        assert len(party.datamodule.train_dataloader()) == -(-party.datamodule.num_train_batches // k)
        losses = [party.fit(1)["loss"] for _ in range(2)]
        weights.append((losses, {n: p.detach().clone() for n, p in party.module.named_parameters()}))
    (loss_a, a), (loss_b, b) = weights
    assert loss_a == pytest.approx(loss_b, rel=1e-6)
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


@pytest.mark.parametrize("shared", [False, True])
def test_mixed_batches_score_the_same_without_the_host_split(shared):
    """The accelerators' scoring of Bernoulli batches (both sides, then a select) equals the
    CPU's row split, and needs no host read."""
    from lightning_fedkg.models.kge_module import KGEModule, mixed_scores_on_device

    kg = load_kg("nations")
    dm = KGDataModule(kg, BernoulliSampler(8), LoaderSettings(batch_size=32))
    module = KGEModule("rotate", num_entities=kg.num_entities, num_relations=kg.num_relations, dim=8)
    batch = next(iter(dm.train_dataloader()))
    if shared:  # one set for every row, as negative_mode="shared" gives
        batch["negatives"] = batch["negatives"][0]
    assert 0 < int(batch["head_mask"].sum()) < 32  # both sides occur
    counter = SyncCounter()
    with counter:
        fast = mixed_scores_on_device(module.model, batch)
    assert counter.seen == []
    assert torch.allclose(fast, module.negative_scores(batch), atol=1e-6)


def test_shared_mask_of_distinct_queries_is_the_brute_force_one():
    """The CPU's index method gathers each distinct query's answers once and hands them to
    every row that repeats it (on either side, and in a batch mixing the sides): the mask
    must be the brute-force one, row by row."""
    kg = load_kg("nations")
    train = {tuple(t) for t in kg.triples("train").tolist()}
    dm = KGDataModule(kg, UniformSampler(8, corruption="both", mode="shared", filtered=True, filter_method="index"),
                      LoaderSettings(batch_size=64), seed=5)
    batches = list(islice(dm.train_dataloader(), 4))
    heads = [torch.full((64,), b["mode"] == "head") for b in batches]
    heads.append(torch.rand(64, generator=torch.Generator().manual_seed(0)) < 0.5)  # mixed sides
    batches.append(batches[0])
    repeated = masked = 0
    for b, head in zip(batches, heads):
        mask = dm.sampler.shared_negative_mask(b["positive"], head, b["negatives"])
        queries = [(r, t) if hd else (h, r) for (h, r, t), hd in zip(b["positive"].tolist(), head.tolist())]
        repeated += len(queries) - len(set(queries))
        for i, ((h, r, t), hd) in enumerate(zip(b["positive"].tolist(), head.tolist())):
            for j, e in enumerate(b["negatives"].tolist()):
                assert bool(mask[i, j]) == (((e, r, t) if hd else (h, r, e)) not in train)
        masked += int((~mask).sum())
    assert repeated > 0 and masked > 0  # the case the dedup is for, and a mask that masks


@pytest.mark.parametrize("strategy, losses", [("fede", {"training_loss"}), ("fedlu", {"training_loss", "global_loss"})])
@pytest.mark.slow
def test_compiled_training_goes_through_torch_compile_and_learns_the_same(strategy, losses, monkeypatch):
    """``trainer.compile=true`` hands every training loss of the module to ``torch.compile``
    (once per module) and changes nothing else: with dynamo's ``eager`` backend (the graph
    is captured, run as is: no C++ compiler needed here) the weights after two epochs equal
    the uncompiled run's up to rounding: the traced loss takes the L1 distances in their
    broadcast form, which sums in another order than cdist."""
    compiled = []

    def eager_compile(fn, **kwargs):
        compiled.append(fn.__name__)
        return torch._dynamo.optimize("eager")(fn)

    monkeypatch.setattr(torch, "compile", eager_compile)
    weights = []
    for flag in ("false", "true"):
        cfg = load_config("configs/fede/umls_fede.yaml", [
            f"federated.strategy={strategy}", "model.dim=8", "train.batch_size=256", "train.num_negatives=16",
            "trainer.threads=1", "trainer.progress_bar=false", "trainer.accelerator=cpu", f"trainer.compile={flag}"])
        party = build_party(cfg, LinkPrediction(), "client_0", load_federated_kg(cfg).clients[0], names={})
        if strategy == "fedlu":  # distillation on both ways: the whole objective is compiled
            party.module.distill_local = party.module.distill_global = True
        fit_losses = [party.fit(1)["loss"] for _ in range(2)]
        weights.append((fit_losses, {n: p.detach().clone() for n, p in party.module.named_parameters()}))
    assert set(compiled) == losses and len(compiled) == len(losses)  # compiled once, reused across fits
    (loss_a, a), (loss_b, b) = weights
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=0)
    assert a.keys() == b.keys()
    for n in a:
        torch.testing.assert_close(a[n], b[n], rtol=0, atol=1e-5)
    assert any(not torch.equal(a[n], b[n]) for n in a)  # the traced loss did take the other form


def test_compile_is_refused_where_it_would_do_nothing():
    from lightning_fedkg.config import ConfigError
    from lightning_fedkg.methods.fedcqa.task import QueryAnswering

    cfg = load_config("configs/fedcqa/umls_fedcqa_gqe.yaml", ["trainer.compile=true"])
    with pytest.raises(ConfigError, match="trainer.compile=true compiles the link-prediction"):
        QueryAnswering().build_module(cfg, load_federated_kg(cfg).clients[0])


def test_the_cpu_index_filter_is_refused_off_the_cpu():
    """``filter_method="index"`` builds its tables on the CPU: moving it to another device is
    a clear error naming the methods that work there, and changes nothing."""
    dm = KGDataModule(load_kg("nations"), UniformSampler(mode="shared", filtered=True, filter_method="index"))
    with pytest.raises(ValueError, match="'search' or 'auto'"):
        dm.to_device("meta")
    assert dm.device == torch.device("cpu")
