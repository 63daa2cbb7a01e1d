"""The L1 distances a training step compiles (``fused_l1_distances``): same values and
gradients as ``torch.cdist``, a failing compiled call falls back to cdist, where they are
compiled (``compiling_pays``, ``trainer.compile``, ``trainer.compile_cpu``), and a CPU keeps
cdist's scores bit for bit unless asked; by default a CPU compiles only their backward
(``cdist_l1_compiled_backward``), whose gradients are cdist's bit for bit, checked per shape."""

from __future__ import annotations

import logging

import pytest
import torch

from lightning_fedkg.models.captured import make_capturable
from lightning_fedkg.models.kge import families
from lightning_fedkg.models.kge.families import (CPU_COMPILE_MIN_ELEMENTS, _l1_distances, backward_compiling_pays,
                                                 cdist_l1_compiled_backward, compiling_pays, fused_l1_distances)
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


def test_large_cpu_blocks_train_through_the_compiled_distances_only_with_compile_cpu(monkeypatch):
    calls = []

    def fused(q, c):
        calls.append((tuple(q.shape), tuple(c.shape)))
        return _l1_distances(q, c)

    monkeypatch.setattr(families, "_cpu_compiler_found", lambda: True)
    monkeypatch.setattr(families, "fused_l1_distances", fused)
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


def _cdist(x, y):
    return torch.cdist(x, y, p=1.0, compute_mode="donot_use_mm_for_euclid_dist")


def _float_block(rows, cands, width, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, width, generator=gen, requires_grad=True)
    c = torch.randn(cands, width, generator=gen, requires_grad=True)
    with torch.no_grad():
        c[0] = q[0]  # a zero difference: sign 0 in both backwards
    return q, c, torch.randn(rows, cands, generator=gen)


@pytest.mark.slow
def test_cdist_with_a_compiled_backward_is_cdist_bit_for_bit_in_values_and_gradients(monkeypatch):
    if not families._cpu_compiler_found():
        pytest.skip("torch.compile cannot build CPU kernels on this machine (no C++ compiler)")
    monkeypatch.setattr(families, "_COMPILED_GRAD", {"checked": set()})
    # a full batch, the short last batch (a second shape: dynamo recompiles), odd widths
    for rows, cands, width in [(512, 256, 32), (137, 256, 32), (300, 64, 33), (17, 5, 3)]:
        q, c, g = _float_block(rows, cands, width)
        mine = _values_and_grads(cdist_l1_compiled_backward, q, c, g)
        oracle = _values_and_grads(_cdist, q, c, g)
        assert all(torch.equal(a, b) for a, b in zip(mine, oracle)), (rows, cands, width)
    assert families._COMPILED_GRAD["fn"] is not False  # every shape passed its check
    assert len(families._COMPILED_GRAD["checked"]) == 8  # two inputs per shape
    # a TransE's training scores: the entity table's gradient equals cdist's bit for bit
    grads = []
    for flag in (None, False):
        model, query, cand = _large_transe()
        model.compile_distances = flag
        monkeypatch.setattr(families, "_cpu_compiler_found", lambda: True)
        model._compare_shared(query, cand).logsumexp(-1).sum().backward()
        grads.append(model.entity_emb.grad.clone())
    assert torch.equal(grads[0], grads[1])


def _exact_grads(q, c, g):
    return _values_and_grads(_cdist, q, c, g)


def test_a_compiled_backward_that_is_not_cdists_bit_for_bit_is_retired(monkeypatch, caplog):
    calls = []

    def almost(x, y, grad):  # what another code generator might do: the right sum in another order
        calls.append(tuple(x.shape))
        return families._l1_grad_first(x, y, grad) * (1 + 1e-6)

    monkeypatch.setattr(families, "_COMPILED_GRAD", {"checked": set(), "fn": almost})
    q, c, g = _float_block(6, 4, 3)
    with caplog.at_level(logging.WARNING, logger="lightning_fedkg"):
        mine = _values_and_grads(cdist_l1_compiled_backward, q, c, g)
        again = _values_and_grads(cdist_l1_compiled_backward, q, c, g)
    oracle = _exact_grads(q, c, g)
    assert all(torch.equal(a, b) for a, b in zip(mine, oracle))
    assert all(torch.equal(a, b) for a, b in zip(again, oracle))
    assert calls == [(6, 3)]  # retired at its first check, never called again
    assert families._COMPILED_GRAD["fn"] is False
    assert len([r for r in caplog.records if "differs from cdist's" in r.getMessage()]) == 1


def test_a_compiled_backward_that_fails_leaves_cdists_backward(monkeypatch, caplog):
    def broken(*args):
        raise RuntimeError("no backend")

    monkeypatch.setattr(families, "_COMPILED_GRAD", {"checked": set(), "fn": broken})
    q, c, g = _float_block(6, 4, 3)
    with caplog.at_level(logging.WARNING, logger="lightning_fedkg"):
        mine = _values_and_grads(cdist_l1_compiled_backward, q, c, g)
    assert all(torch.equal(a, b) for a, b in zip(mine, _exact_grads(q, c, g)))
    assert families._COMPILED_GRAD["fn"] is False
    assert [r.getMessage() for r in caplog.records if "backward" in r.getMessage()] == [
        "compiled L1 backward unavailable (RuntimeError: no backend); using cdist's"]


def test_a_checked_shape_takes_the_compiled_gradient_and_only_needed_inputs_are_computed(monkeypatch):
    calls = []

    def marked(x, y, grad):  # cdist's backward itself (the eager broadcast sums in another order)
        calls.append(tuple(x.shape))
        return torch.ops.aten._cdist_backward(grad, x, y, 1.0, torch.cdist(x, y, p=1.0))

    monkeypatch.setattr(families, "_COMPILED_GRAD", {"checked": set(), "fn": marked})
    q, c, g = _float_block(6, 4, 3)
    assert all(torch.equal(a, b) for a, b in zip(_values_and_grads(cdist_l1_compiled_backward, q, c, g),
                                                 _exact_grads(q, c, g)))
    assert calls == [(6, 3), (4, 3)] and families._COMPILED_GRAD["fn"] is marked
    cand = c.detach()  # candidates without gradients: only the query's is computed
    cdist_l1_compiled_backward(q, cand).backward(g)
    assert calls == [(6, 3), (4, 3), (6, 3)]


def test_with_dynamo_disabled_cdists_backward_serves(monkeypatch):
    def never(*args):
        raise AssertionError("the compiled backward ran with dynamo disabled")

    monkeypatch.setattr(families, "_COMPILED_GRAD", {"checked": set(), "fn": never})
    q, c, g = _float_block(6, 4, 3)
    with torch._dynamo.config.patch(disable=True):
        mine = _values_and_grads(cdist_l1_compiled_backward, q, c, g)
    assert all(torch.equal(a, b) for a, b in zip(mine, _exact_grads(q, c, g)))


def test_a_cpu_trains_large_blocks_through_the_compiled_backward_by_default(monkeypatch):
    routed = []

    def spy(q, c):
        routed.append("backward")
        return _cdist(q, c)

    def fused(q, c):
        routed.append("fused")
        return _l1_distances(q, c)

    monkeypatch.setattr(families, "_cpu_compiler_found", lambda: True)
    monkeypatch.setattr(families, "cdist_l1_compiled_backward", spy)
    monkeypatch.setattr(families, "fused_l1_distances", fused)
    model, query, cand = _large_transe()
    model._compare_shared(query, cand)
    assert routed == ["backward"]  # the default
    with torch.no_grad():  # evaluation: cdist
        model._compare_shared(query, cand)
    model._compare_shared(query[:100], cand)  # below the threshold: cdist
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        model._compare_shared(query, cand)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert routed == ["backward"]
    model.compile_on_cpu = True  # trainer.compile_cpu: the compiled forward and backward
    model._compare_shared(query, cand)
    assert routed == ["backward", "fused"]
    model.compile_distances = False  # trainer.compile=false: cdist
    model._compare_shared(query, cand)
    assert routed == ["backward", "fused"]
    monkeypatch.setattr(families, "_cpu_compiler_found", lambda: False)
    assert not backward_compiling_pays(query, cand)
