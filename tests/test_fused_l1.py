"""The L1 distances a training step compiles (``fused_l1_distances``): same values and
gradients as ``torch.cdist``, a failing compiled call falls back to cdist, where they are
compiled (``compiling_pays``, ``trainer.compile``, ``trainer.compile_cpu``), and a CPU keeps
cdist's scores bit for bit unless asked."""

from __future__ import annotations

import logging

import pytest
import torch

from lightning_fedkg.models.captured import make_capturable
from lightning_fedkg.models.kge import families
from lightning_fedkg.models.kge.families import (CPU_COMPILE_MIN_ELEMENTS, _l1_distances, compiling_pays,
                                                 fused_l1_distances)
from lightning_fedkg.models.kge.transe import TransE


def _pair(seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(7, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    c = torch.randn(4, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    return q, c


def _values_and_grads(fn, q, c, g):
    q.grad = c.grad = None
    out = fn(q, c)
    out.backward(g)
    return out.detach(), q.grad.clone(), c.grad.clone()


def test_the_distances_the_gpu_compiles_equal_cdist_in_values_and_gradients():
    q, c = _pair()
    g = torch.randn(7, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mine = _values_and_grads(_l1_distances, q, c, g)
    oracle = _values_and_grads(lambda x, y: torch.cdist(x, y, p=1.0), q, c, g)
    for a, b in zip(mine, oracle):
        torch.testing.assert_close(a, b)
    # hand-checked: |1-0| + |2-4| = 3
    assert _l1_distances(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.0, 4.0]])).item() == 3.0


@pytest.mark.slow
def test_the_compiled_distances_equal_cdist(monkeypatch):
    monkeypatch.setattr(families, "_FUSED_L1", {})
    q, c = _pair()
    g = torch.randn(7, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    probe = fused_l1_distances(q.detach(), c.detach())
    if probe is None:
        pytest.skip("torch.compile cannot build kernels on this machine (no C++ compiler)")
    mine = _values_and_grads(fused_l1_distances, q, c, g)
    oracle = _values_and_grads(lambda x, y: torch.cdist(x, y, p=1.0), q, c, g)
    for a, b in zip(mine, oracle):
        torch.testing.assert_close(a, b)


def test_a_compiler_failure_is_warned_once_and_leaves_cdist_in_place(monkeypatch, caplog):
    built = []

    def broken_compile(fn, **kwargs):
        built.append(fn)

        def run(*args):
            raise RuntimeError("no backend")
        return run

    monkeypatch.setattr(families, "_FUSED_L1", {})
    monkeypatch.setattr(torch, "compile", broken_compile)
    q, c = _pair()
    with caplog.at_level(logging.WARNING, logger="lightning_fedkg"):
        assert fused_l1_distances(q, c) is None
        assert fused_l1_distances(q, c) is None
    assert len(built) == 1  # not rebuilt after the failure
    assert [r.getMessage() for r in caplog.records if "cdist" in r.getMessage()] == [
        "compiled L1 distances unavailable (RuntimeError: no backend); using torch.cdist"]


def test_small_cpu_blocks_train_with_cdist_bit_for_bit(monkeypatch):
    def not_here(*args):
        raise AssertionError("a 3 x 4 x 6 block is below the CPU's threshold")

    monkeypatch.setattr(families, "fused_l1_distances", not_here)
    torch.manual_seed(0)
    model = TransE(20, 3, 6)
    query = model._tail_query(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))
    cand = model.entity_emb[torch.tensor([3, 4, 5, 6])]
    scores = model._compare_shared(query, cand)
    assert torch.equal(scores, model.gamma - torch.cdist(query, cand, p=1.0,
                                                         compute_mode="donot_use_mm_for_euclid_dist"))


def test_make_capturable_fuses_adam_only_for_cuda_tensors():
    param = torch.nn.Parameter(torch.ones(4))
    adam = torch.optim.Adam([param], lr=0.1)
    make_capturable(adam)
    assert adam.param_groups[0]["capturable"] is True
    assert not adam.param_groups[0].get("fused")  # a CPU Adam keeps its implementation


def test_with_dynamo_disabled_cdist_serves(monkeypatch):
    # torch.compile would then run the broadcast eagerly, slower than cdist
    monkeypatch.setattr(families, "_FUSED_L1", {})
    q, c = _pair()
    # torch's own patch: monkeypatch's undo leaves dynamo's config module broken for later tests
    with torch._dynamo.config.patch(disable=True):
        assert fused_l1_distances(q, c) is None


def _block(rows, cands, width):
    return torch.empty(rows, width), torch.empty(cands, width)


def test_a_cpu_compiles_large_blocks_only_when_asked_with_a_compiler_and_never_when_deterministic(monkeypatch):
    assert CPU_COMPILE_MIN_ELEMENTS == 2 ** 21
    monkeypatch.setattr(families, "_cpu_compiler_found", lambda: True)
    assert not compiling_pays(*_block(512, 256, 32))             # not asked (the default): cdist
    assert compiling_pays(*_block(512, 256, 32), cpu=True)       # FB15k-237-Fed10 at dim 32: 4.2M
    assert compiling_pays(*_block(512, 128, 32), cpu=True)       # exactly 2M
    assert not compiling_pays(*_block(511, 128, 32), cpu=True)   # one row under
    assert not compiling_pays(*_block(256, 64, 64), cpu=True)    # the UMLS quick starts: 1M
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert not compiling_pays(*_block(512, 256, 32), cpu=True)
    finally:
        torch.use_deterministic_algorithms(previous)
    monkeypatch.setattr(families, "_cpu_compiler_found", lambda: False)
    assert not compiling_pays(*_block(512, 256, 32), cpu=True)


def _large_transe():
    torch.manual_seed(0)
    model = TransE(600, 3, 32)
    query = model._tail_query(torch.arange(512) % 600, torch.arange(512) % 3)
    return model, query, model.entity_emb[torch.arange(256)]


def _record_compiled_calls(monkeypatch) -> list:
    """Pretend a C++ compiler exists and record the shapes each compiled-distance call gets
    (the eager broadcast stands in for the compiled kernel)."""
    calls = []

    def fused(q, c):
        calls.append((tuple(q.shape), tuple(c.shape)))
        return _l1_distances(q, c)

    monkeypatch.setattr(families, "_cpu_compiler_found", lambda: True)
    monkeypatch.setattr(families, "fused_l1_distances", fused)
    return calls


def test_large_cpu_blocks_train_through_the_compiled_distances_only_with_compile_cpu(monkeypatch):
    calls = _record_compiled_calls(monkeypatch)
    model, query, cand = _large_transe()
    cdist = model.gamma - torch.cdist(query, cand, p=1.0, compute_mode="donot_use_mm_for_euclid_dist")
    assert torch.equal(model._compare_shared(query, cand), cdist)  # the default: cdist, bit for bit
    assert calls == []
    model.compile_on_cpu = True  # trainer.compile_cpu=true
    torch.testing.assert_close(model._compare_shared(query, cand), cdist)
    assert calls == [((512, 32), (256, 32))]
    with torch.no_grad():  # evaluation: cdist
        model._compare_shared(query, cand)
    model.compile_distances = False  # trainer.compile=false: nothing compiled
    assert torch.equal(model._compare_shared(query, cand), model.gamma - torch.cdist(
        query, cand, p=1.0, compute_mode="donot_use_mm_for_euclid_dist"))
    assert len(calls) == 1


def test_inside_a_compiled_loss_the_distances_are_the_broadcast_form(monkeypatch):
    # trainer.compile=true traces the whole loss; the compiler fuses the broadcast, not cdist
    def no_cdist(*args, **kwargs):
        raise AssertionError("cdist traced inside a compiled loss")

    model, query, cand = _large_transe()
    expected = model.gamma - _l1_distances(query, cand)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(torch, "cdist", no_cdist)
    assert torch.equal(model._compare_shared(query, cand), expected)


@pytest.mark.parametrize("flag,expected,cpu", [(None, None, False), ("false", False, False), ("true", True, False),
                                               (None, None, True)])
def test_trainer_compile_reaches_every_trans_model_fedlus_avatar_included(flag, expected, cpu):
    from lightning_fedkg.builders import build_module
    from lightning_fedkg.config import load_config
    from lightning_fedkg.methods.fedlu.distillation import DistillationModule

    overrides = ([] if flag is None else [f"trainer.compile={flag}"]) + (["trainer.compile_cpu=true"] if cpu else [])
    cfg = load_config("configs/fedlu/umls_fedlu.yaml", overrides)
    module = build_module(cfg, 30, 4, DistillationModule)
    models = [m for m in module.modules() if isinstance(m, families.TranslationalModel)]
    assert len(models) == 2  # the local model and the avatar
    assert all(m.compile_distances is expected and m.compile_on_cpu is cpu for m in models)
    assert module.compile_training is (expected is True)


def _gqe_batch(k):
    """A GQE over 300 entities at width 32 and a batch of 256 queries with ``k`` alternatives
    each: a [256k, 300, 32] block, above the CPU threshold for k = 1."""
    from lightning_fedkg.methods.fedcqa.encoders import GQE

    torch.manual_seed(0)
    gqe = GQE(300, 8, 32)
    return gqe, torch.randn(256, k, 32, requires_grad=True)


@pytest.mark.parametrize("k", [1, 2])  # 2: a union's two alternatives, the best one scoring
def test_gqe_scores_train_through_the_compiled_distances_only_where_asked(monkeypatch, k):
    calls = _record_compiled_calls(monkeypatch)
    gqe, q = _gqe_batch(k)
    g = torch.randn(256, 300, generator=torch.Generator().manual_seed(1))

    def scores_and_grads():
        gqe.zero_grad()
        q.grad = None
        out = gqe.score(q)
        out.backward(g)
        return out.detach(), q.grad.clone(), gqe.entity_emb.grad.clone()

    oracle = scores_and_grads()  # the default on a CPU: cdist, as before
    expected = (gqe.gamma - torch.cdist(q.detach().reshape(-1, 32), gqe.entity_emb.detach(), p=1)
                .view(256, k, 300)).max(1).values
    assert torch.equal(oracle[0], expected) and calls == []
    gqe.compile_on_cpu = True  # trainer.compile_cpu=true
    for a, b in zip(scores_and_grads(), oracle):  # float32 sums in another order: last bits
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)
    assert calls == [((256 * k, 32), (300, 32))]
    with torch.no_grad():  # evaluation: cdist
        gqe.score(q)
    gqe.score(q.detach()[:4])  # a block under the threshold: cdist
    gqe.compile_distances = False  # trainer.compile=false
    assert torch.equal(scores_and_grads()[0], oracle[0])
    assert len(calls) == 1


@pytest.mark.parametrize("overrides,expected", [([], (None, False)), (["trainer.compile_cpu=true"], (None, True)),
                                                (["trainer.compile=false"], (False, False))])
def test_the_trainer_settings_reach_the_query_encoder(overrides, expected):
    from lightning_fedkg.config import load_config
    from lightning_fedkg.methods.fedcqa.task import QueryAnswering

    cfg = load_config("configs/fedcqa/umls_fedcqa_gqe.yaml", overrides)

    class KG:
        num_entities, num_relations = 30, 4

    encoder = QueryAnswering().build_module(cfg, KG()).encoder
    assert (encoder.compile_distances, encoder.compile_on_cpu) == expected


def test_a_gqe_query_without_alternatives_scores_as_the_max_over_one_bit_for_bit():
    # score() skips the max over alternatives when there is one; values and gradients must
    # be those of the max form (which costs a pass over [B, n] and a scatter in backward)
    from lightning_fedkg.methods.fedcqa.encoders import GQE

    torch.manual_seed(0)
    gqe = GQE(400, 8, 16)
    q = torch.randn(64, 1, 16, requires_grad=True)
    target = torch.randint(400, (64,))

    def run(score):
        gqe.zero_grad()
        q.grad = None
        out = score(q)
        torch.nn.functional.cross_entropy(out, target, label_smoothing=0.1).backward()
        return out.detach(), q.grad.clone(), gqe.entity_emb.grad.clone()

    def max_form(x):
        return (gqe.gamma - torch.cdist(x.reshape(64, 16), gqe.entity_emb, p=1).view(64, 1, -1)).max(1).values

    assert all(torch.equal(a, b) for a, b in zip(run(gqe.score), run(max_form)))
