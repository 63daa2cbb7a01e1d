"""The L1 distances a CUDA training step compiles (``fused_l1_distances``): same values and
gradients as ``torch.cdist``, a failing compiled call falls back to cdist, and on a CPU the
shared-candidate scores stay cdist's bit for bit."""

from __future__ import annotations

import logging

import pytest
import torch

from lightning_fedkg.models.captured import make_capturable
from lightning_fedkg.models.kge import families
from lightning_fedkg.models.kge.families import _l1_distances, fused_l1_distances
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


def test_on_a_cpu_training_scores_are_cdists_bit_for_bit(monkeypatch):
    def not_here(*args):
        raise AssertionError("the compiled distances are for CUDA only")

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
    monkeypatch.setattr(torch._dynamo.config, "disable", True)
    q, c = _pair()
    assert fused_l1_distances(q, c) is None
