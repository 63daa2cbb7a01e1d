"""The two score families the models share: distance models (``gamma - distance``, the
Trans* family a special case) and bilinear models (``<query, candidate>``)."""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.models.kge.base import KGEModel

__all__ = ["CPU_COMPILE_MIN_ELEMENTS", "DistanceModel", "TranslationalModel", "BilinearModel",
           "backward_compiling_pays", "cdist_l1_compiled_backward", "compiling_pays", "fused_l1_distances",
           "relation_space_width", "soft_unit_norm"]

log = logging.getLogger("lightning_fedkg")


def relation_space_width(dim: int, relation_dim: int | None) -> int:
    """Relation-space width of TransR/TransD: ``relation_dim`` or, by default, ``dim``."""
    rdim = dim if relation_dim is None else int(relation_dim)
    if rdim < 1:
        raise ValueError(f"relation_dim must be positive, got {relation_dim}")
    return rdim


def soft_unit_norm(x: Tensor) -> Tensor:
    """``sum_i max(0, ||x_i||_2^2 - 1)``: the soft form of the constraint ``||x_i|| <= 1``."""
    return F.relu(x.pow(2).sum(-1) - 1.0).sum()


class DistanceModel(KGEModel):
    """Models scored as ``gamma - distance(query, candidate)``."""

    def _distance(self, x: Tensor, y: Tensor) -> Tensor:
        raise NotImplementedError

    def _compare(self, query: Tensor, cand: Tensor) -> Tensor:
        if cand.dim() == 2:
            cand = cand.unsqueeze(0)
        return self.gamma - self._distance(query.unsqueeze(1), cand)


class TranslationalModel(DistanceModel):
    """Trans* family: ``gamma - ||proj_r(h) + r - proj_r(t)||_p``."""

    def __init__(self, num_entities, num_relations, dim, gamma=10.0, epsilon=2.0, *,
                 p_norm: float = 1.0, **tables):
        if p_norm <= 0:
            raise ValueError(f"p_norm must be positive, got {p_norm}")
        super().__init__(num_entities, num_relations, dim, gamma, epsilon, **tables)
        self.p_norm = float(p_norm)

    #: ``trainer.compile`` (set by :func:`lightning_fedkg.builders.build_module`): None
    #: compiles the training step's L1 distances to shared candidates where that pays (see
    #: :func:`compiling_pays`; on a CPU by default only their backward, bit for bit cdist's:
    #: :func:`backward_compiling_pays`), False never (cdist everywhere), True when the module
    #: compiles its whole training loss (the distances are then traced in their broadcast form).
    compile_distances: bool | None = None
    #: ``trainer.compile_cpu``: also compile them on a CPU (see :func:`compiling_pays`).
    compile_on_cpu: bool = False

    def _distance(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.linalg.vector_norm(x - y, ord=self.p_norm, dim=-1)

    def _compare_shared(self, query: Tensor, cand: Tensor) -> Tensor:
        if self.p_norm == 1.0 and torch.compiler.is_compiling():
            # inside a compiled loss: the form the compiler fuses into one loop (it cannot
            # look into cdist, which it calls as it is)
            return self.gamma - _l1_distances(query, cand)
        if self.p_norm == 1.0 and self.compile_distances is not False and torch.is_grad_enabled():
            if compiling_pays(query, cand, cpu=self.compile_on_cpu):
                dist = fused_l1_distances(query, cand)
                if dist is not None:
                    return self.gamma - dist
            elif backward_compiling_pays(query, cand):
                return self.gamma - cdist_l1_compiled_backward(query, cand)
        # cdist never materialises [B, n, w] and is ~20x faster than broadcasting; its
        # matmul shortcut for p=2 trades exactness, so it is disabled.
        dist = torch.cdist(query, cand, p=self.p_norm, compute_mode="donot_use_mm_for_euclid_dist")
        return self.gamma - dist

    def extra_repr(self) -> str:
        return super().extra_repr() + f", p_norm={self.p_norm:g}"


def _l1_distances(query: Tensor, cand: Tensor) -> Tensor:
    return (query.unsqueeze(1) - cand.unsqueeze(0)).abs().sum(-1)


_FUSED_L1: dict = {}

#: A CPU compiles a training batch's L1 distances (with ``trainer.compile_cpu``) or their
#: backward (by default) from this many elements in its ``[B, n, w]`` block up: compiling
#: costs a process seconds (3-12 s measured on 2 cores, under 2 s from a warm inductor
#: cache), which small steps and the short runs they belong to do not win back (the UMLS
#: quick starts' blocks are 256 x 64 x 64 = 1M elements; FB15k-237-Fed10 at dim 32,
#: 512 x 256 x 32 = 4.2M).
CPU_COMPILE_MIN_ELEMENTS = 1 << 21


@functools.lru_cache(maxsize=1)
def _cpu_compiler_found() -> bool:
    """Whether inductor finds the C++ compiler that its CPU kernels need."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
        return True
    except Exception:  # noqa: BLE001 - none found (or an inductor without this function): cdist serves
        return False


def compiling_pays(query: Tensor, cand: Tensor, cpu: bool = False) -> bool:
    """Whether a training batch's L1 distances of ``query [B, w]`` to ``cand [n, w]`` go
    through :func:`fused_l1_distances` rather than cdist: always on CUDA; on a CPU only when
    asked (``cpu``, ``trainer.compile_cpu``), the block has at least
    :data:`CPU_COMPILE_MIN_ELEMENTS` elements, a C++ compiler is found, and deterministic
    algorithms are off (compiled CPU kernels follow the machine's vector width, so their last
    bits could differ between machines). Measured (``scripts/bench_kernels.py --cpu``), one
    thread, 512 x 256 candidates, forward and backward: cdist 5.5 ms against 2.6 ms compiled
    at dim 32, 49.5 against 25.0 ms at dim 256; gradients equal, distances within 3e-4. A CPU keeps cdist's forward by
    default (and compiles only the backward, :func:`backward_compiling_pays`): its results
    stay bit for bit those of earlier versions, and over 20 UMLS seeds the compiled runs'
    test MRR was .0065 lower on average (docs/results/speed.md), not yet told apart from
    chance."""
    if query.is_cuda:
        return True
    if not cpu or query.device.type != "cpu" or torch.are_deterministic_algorithms_enabled():
        return False
    return query.shape[0] * cand.shape[0] * query.shape[-1] >= CPU_COMPILE_MIN_ELEMENTS and _cpu_compiler_found()


def backward_compiling_pays(query: Tensor, cand: Tensor) -> bool:
    """Whether a CPU training batch's L1 distances go through
    :func:`cdist_l1_compiled_backward` (cdist's values, a compiled backward with cdist's
    gradients bit for bit): a CPU tensor, a block of at least
    :data:`CPU_COMPILE_MIN_ELEMENTS` elements, a C++ compiler found, deterministic
    algorithms off. Consulted where :func:`compiling_pays` declines, i.e. by default on a CPU."""
    return (query.device.type == "cpu" and not torch.are_deterministic_algorithms_enabled()
            and query.shape[0] * cand.shape[0] * query.shape[-1] >= CPU_COMPILE_MIN_ELEMENTS
            and _cpu_compiler_found())


def _l1_grad_first(x: Tensor, y: Tensor, grad: Tensor) -> Tensor:
    """``sum_j grad[i, j] * sign(x[i] - y[j])``: the gradient of ``[B, n]`` L1 distances
    with respect to ``x``, each row's terms added in ``j`` order as cdist's CPU backward
    adds them."""
    return (torch.sign(x.unsqueeze(1) - y.unsqueeze(0)) * grad.unsqueeze(-1)).sum(1)


_COMPILED_GRAD: dict = {"checked": set()}


def _cdist_l1_grad(x: Tensor, y: Tensor, grad: Tensor, dist: Tensor) -> Tensor:
    """cdist's L1 gradient with respect to ``x``, from the compiled kernel where it serves.

    Each distinct input shape is checked once against cdist's own backward: a compiled
    result that is not cdist's bit for bit (another torch, another code generator) is
    warned about and the compiled kernel retired, as after a failure; cdist's backward then
    serves from now on."""
    exact = functools.partial(torch.ops.aten._cdist_backward, grad, x, y, 1.0, dist)
    fn = _COMPILED_GRAD.get("fn")
    if fn is False or getattr(torch._dynamo.config, "disable", False):
        return exact()
    if fn is None:
        log.info("compiling the backward of the training L1 distances with torch.compile (cdist's gradients "
                 "bit for bit; the first batches of each shape wait for it; trainer.compile=false keeps "
                 "cdist's backward)")
        fn = _COMPILED_GRAD["fn"] = torch.compile(_l1_grad_first)
    try:
        out = fn(x, y, grad)
    except Exception as exc:  # noqa: BLE001 - whatever the compiler raised: cdist's backward is always there
        log.warning("compiled L1 backward unavailable (%s: %s); using cdist's", type(exc).__name__, exc)
        _COMPILED_GRAD["fn"] = False
        return exact()
    key = (tuple(x.shape), tuple(y.shape), x.dtype)
    if key not in _COMPILED_GRAD["checked"]:
        reference = exact()
        if not torch.equal(out, reference):
            log.warning("compiled L1 backward differs from cdist's at shapes %s and %s (largest difference "
                        "%.3g); using cdist's", tuple(x.shape), tuple(y.shape),
                        (out - reference).abs().max().item())
            _COMPILED_GRAD["fn"] = False
            return reference
        _COMPILED_GRAD["checked"].add(key)
    return out


class _CdistL1CompiledBackward(torch.autograd.Function):
    """``torch.cdist(query, cand, p=1)`` whose backward runs :func:`_l1_grad_first` compiled."""

    @staticmethod
    def forward(ctx, query: Tensor, cand: Tensor) -> Tensor:
        dist = torch.cdist(query, cand, p=1.0, compute_mode="donot_use_mm_for_euclid_dist")
        ctx.save_for_backward(query, cand, dist)
        return dist

    @staticmethod
    def backward(ctx, grad: Tensor):
        query, cand, dist = ctx.saved_tensors
        grad = grad.contiguous()
        # the roles of cdist's own derivative formulas: x2's gradient is x1's with the two
        # inputs and the transposed gradient and distances
        grad_query = _cdist_l1_grad(query, cand, grad, dist) if ctx.needs_input_grad[0] else None
        grad_cand = (_cdist_l1_grad(cand, query, grad.mT.contiguous(), dist.mT.contiguous())
                     if ctx.needs_input_grad[1] else None)
        return grad_query, grad_cand


def cdist_l1_compiled_backward(query: Tensor, cand: Tensor) -> Tensor:
    """``[B, n]`` L1 distances of ``query [B, w]`` to ``cand [n, w]``: cdist's values, and
    cdist's gradients bit for bit from a compiled kernel (each input shape checked once
    against cdist's backward; cdist's backward where the compiler fails or differs).

    The CPU's default in training (:func:`backward_compiling_pays`): the compiled
    forward of :func:`fused_l1_distances` is faster still but sums each distance in another
    order than cdist, so it changes results (``trainer.compile_cpu``); cdist's backward sums
    each gradient over the other input's rows in row order, which the compiled kernel
    reproduces. Measured (``scripts/bench_kernels.py --cpu``, one thread, 512 x 256
    candidates, forward and backward): 3.8 ms against cdist's 5.8 at dim 32, 43.0 against
    46.9 at dim 256."""
    return _CdistL1CompiledBackward.apply(query, cand)


def fused_l1_distances(query: Tensor, cand: Tensor) -> Tensor | None:
    """``[B, n]`` L1 distances of ``query [B, w]`` to ``cand [n, w]`` through
    :func:`torch.compile`, or None where the compiled call failed (then cdist serves from
    now on; warned once). torch compiles a static graph's backward at its first backward
    pass, outside this call: a failure there is raised, not caught here.

    Used in training where :func:`compiling_pays`: cdist's backward writes a ``[B, n, w]``
    buffer twice (once per input), where the compiled backward reduces the signs in registers
    (one H100, 512 x 256 x 256, forward and backward: 72 us against cdist's 484; a CPU thread
    at dim 256: 25 ms against 49.5). Batch shapes are left to dynamo's automatic dynamic
    shapes: one graph per shape (``dynamic=False``) ran the function eagerly in a measured
    run, and eagerly the broadcast is slower than cdist (632 us on the H100), so with dynamo
    disabled cdist serves.
    """
    fn = _FUSED_L1.get("fn")
    if fn is False or getattr(torch._dynamo.config, "disable", False):
        return None
    if fn is None:
        log.info("compiling the training L1 distances with torch.compile (the first batches of each shape wait "
                 "for it; trainer.compile=false keeps torch.cdist)")
        fn = _FUSED_L1["fn"] = torch.compile(_l1_distances)
    try:
        return fn(query, cand)
    except Exception as exc:  # noqa: BLE001 - whatever the compiler raised: cdist is always there
        log.warning("compiled L1 distances unavailable (%s: %s); using torch.cdist", type(exc).__name__, exc)
        _FUSED_L1["fn"] = False
        return None


class BilinearModel(KGEModel):
    """Models scored as ``<query, candidate>``."""

    def _compare(self, query: Tensor, cand: Tensor) -> Tensor:
        if cand.dim() == 2:
            return query @ cand.T
        return torch.bmm(cand, query.unsqueeze(-1)).squeeze(-1)

    def _compare_shared(self, query: Tensor, cand: Tensor) -> Tensor:
        return query @ cand.T
