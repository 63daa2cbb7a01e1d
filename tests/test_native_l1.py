"""The library's own CPU L1 kernel (``trainer.native_l1``): values and both gradients against a
float64 broadcast oracle (widths off the vector length, exact ties, several thread counts),
repeatable bits for a thread count, a cached build, cdist where no compiler is found, and the
Trans* models using it only when asked."""

from __future__ import annotations

import logging

import pytest
import torch

from lightning_fedkg.models.kge import native_l1
from lightning_fedkg.models.kge.native_l1 import kernel_library, native_l1_distances, native_l1_usable
from lightning_fedkg.models.kge.transe import TransE


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("LIGHTNING_FEDKG_CACHE", str(tmp_path_factory.mktemp("cache")))
    kernel_library.cache_clear()
    built = kernel_library()
    if built is None:
        mp.undo()
        pytest.skip("no C compiler with OpenMP on this machine: the kernel cannot be built")
    yield built
    kernel_library.cache_clear()
    mp.undo()


def _oracle(q, c, g):
    """Distances and gradients by the definition, in float64: d_ij = sum_k |q_ik - c_jk|,
    dq_ik = sum_j g_ij sign(q_ik - c_jk), dc_jk = -sum_i g_ij sign(q_ik - c_jk)."""
    diff = q.double()[:, None, :] - c.double()[None, :, :]
    s = torch.sign(diff) * g.double()[:, :, None]
    return diff.abs().sum(-1), s.sum(1), -s.sum(0)


def _run(q, c, g):
    q = q.clone().requires_grad_()
    c = c.clone().requires_grad_()
    out = native_l1_distances(q, c)
    out.backward(g)
    return out.detach(), q.grad, c.grad


@pytest.mark.parametrize("b,n,w", [(1, 1, 1), (7, 11, 17), (33, 5, 16), (64, 48, 100)])
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_values_and_both_gradients_equal_the_definition(lib, b, n, w, threads):
    gen = torch.Generator().manual_seed(b * 1000 + n * 10 + w)
    q, c, g = torch.randn(b, w, generator=gen), torch.randn(n, w, generator=gen), torch.randn(b, n, generator=gen)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        mine = _run(q, c, g)
    finally:
        torch.set_num_threads(before)
    for got, want in zip(mine, _oracle(q, c, g)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_hand_checked_values_and_ties_give_no_gradient(lib):
    # |1-0| + |2-4| = 3 and |1-1| + |2-2| = 0; a tie (q == c in a coordinate) contributes 0,
    # as torch's sign(0) = 0, not +-g
    q = torch.tensor([[1.0, 2.0]])
    c = torch.tensor([[0.0, 4.0], [1.0, 2.0]])
    out, gq, gc = _run(q, c, torch.tensor([[1.0, 10.0]]))
    assert out.tolist() == [[3.0, 0.0]]
    assert gq.tolist() == [[1.0, -1.0]]  # from the first candidate only
    assert gc.tolist() == [[-1.0, 1.0], [0.0, 0.0]]


def test_a_thread_count_repeats_its_bits(lib):
    gen = torch.Generator().manual_seed(3)
    q, c, g = torch.randn(96, 40, generator=gen), torch.randn(50, 40, generator=gen), torch.randn(96, 50, generator=gen)
    first, again = _run(q, c, g), _run(q, c, g)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_the_build_is_cached_and_reused(lib, monkeypatch):
    built = list(native_l1._cache_dir().glob("l1_kernel_*.so"))
    assert len(built) == 1
    monkeypatch.setattr(native_l1, "_build", lambda *a: pytest.fail("rebuilt a cached kernel"))
    kernel_library.cache_clear()
    try:
        assert kernel_library() is not None
    finally:
        kernel_library.cache_clear()


def test_no_compiler_warns_once_and_leaves_cdist(monkeypatch, caplog):
    monkeypatch.setattr(native_l1, "_compiler", lambda: None)
    kernel_library.cache_clear()
    try:
        model = TransE(10, 2, 4)
        model.native_l1 = True
        q, c = torch.randn(3, 4), torch.randn(10, 4)
        with caplog.at_level(logging.WARNING, logger="lightning_fedkg"):
            first = model._compare_shared(q, c)
            model._compare_shared(q, c)
        assert torch.equal(first, model.gamma - torch.cdist(q, c, p=1.0, compute_mode="donot_use_mm_for_euclid_dist"))
        assert sum("no C compiler" in r.getMessage() for r in caplog.records) == 1
    finally:
        kernel_library.cache_clear()


def test_what_the_kernel_takes():
    f32 = torch.zeros(2, 3)
    assert native_l1_usable(f32, torch.zeros(4, 3))
    assert not native_l1_usable(f32.double(), torch.zeros(4, 3).double())
    assert not native_l1_usable(f32, torch.zeros(2, 4, 3))  # per-query candidates: cdist
    torch.use_deterministic_algorithms(True)
    try:
        assert not native_l1_usable(f32, torch.zeros(4, 3))
    finally:
        torch.use_deterministic_algorithms(False)


def test_transe_uses_the_kernel_only_when_asked(lib, monkeypatch):
    calls = []
    real = native_l1._NativeL1.apply
    monkeypatch.setattr(native_l1._NativeL1, "apply", lambda *a: calls.append(1) or real(*a))
    model = TransE(20, 3, 8)
    q, c = torch.randn(5, 8), torch.randn(20, 8)
    cdist_scores = model._compare_shared(q, c)
    assert calls == []
    model.native_l1 = True
    torch.testing.assert_close(model._compare_shared(q, c), cdist_scores)
    assert calls == [1]


def test_trainer_native_l1_reaches_every_trans_model():
    from lightning_fedkg.builders import build_module
    from lightning_fedkg.config import load_config
    from lightning_fedkg.methods.fedlu.distillation import DistillationModule
    from lightning_fedkg.models.kge.families import TranslationalModel

    for flag in (False, True):
        cfg = load_config("configs/fedlu/umls_fedlu.yaml", [f"trainer.native_l1={str(flag).lower()}"])
        module = build_module(cfg, 30, 4, DistillationModule)
        models = [m for m in module.modules() if isinstance(m, TranslationalModel)]
        assert len(models) == 2 and all(m.native_l1 is flag for m in models)


def test_a_transe_trained_through_the_kernel_learns_umls_as_cdist_does(lib, monkeypatch):
    """Same seed, same batches: the kernel's run ends within a hair of cdist's (the two differ
    only in summation order) and learns."""
    import lightning as L

    from lightning_fedkg.data import KGDataModule, LoaderSettings, UniformSampler, load_kg
    from lightning_fedkg.models import KGEModule

    from lightning_fedkg.models.kge import families

    trained = []
    real = families.native_l1_distances
    monkeypatch.setattr(families, "native_l1_distances",
                        lambda q, c: trained.append(torch.is_grad_enabled()) or real(q, c))
    umls = load_kg("umls")
    mrr = {}
    for flag in (False, True):
        L.seed_everything(0, verbose=False)
        module = KGEModule("transe", num_entities=umls.num_entities, num_relations=umls.num_relations, dim=32,
                           gamma=8.0, lr=0.01)
        for m in module.modules():
            if hasattr(m, "native_l1"):
                m.native_l1 = flag
        dm = KGDataModule(umls, UniformSampler(32, corruption="both", mode="shared"),
                          LoaderSettings(batch_size=256, eval_batch_size=512), seed=0)
        t = L.Trainer(accelerator="cpu", devices=1, max_epochs=8, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0)
        t.fit(module, datamodule=dm)
        t.test(module, datamodule=dm, verbose=False)
        mrr[flag] = module.last_metrics["test"]["mrr"]
    assert sum(trained) == 8 * 2 * 21  # every training batch: 8 epochs x 2 sides x 21 batches
    assert mrr[True] > 0.6  # measured: .705 (cdist .695); untrained below .15
    assert abs(mrr[True] - mrr[False]) < 0.05, mrr
