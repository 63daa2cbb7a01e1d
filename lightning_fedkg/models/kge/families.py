"""The two score families the models share: distance models (``gamma - distance``, the
Trans* family a special case) and bilinear models (``<query, candidate>``)."""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_fedkg.models.kge.base import KGEModel
from lightning_fedkg.models.kge.native_l1 import native_l1_distances

__all__ = ["CPU_COMPILE_MIN_ELEMENTS", "DistanceModel", "TranslationalModel", "BilinearModel", "compiling_pays",
           "fused_l1_distances", "relation_space_width", "soft_unit_norm"]

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
    #: :func:`compiling_pays`), False never (cdist everywhere), True when the module compiles
    #: its whole training loss (the distances are then traced in their broadcast form).
    compile_distances: bool | None = None
    #: ``trainer.compile_cpu``: also compile them on a CPU (see :func:`compiling_pays`).
    compile_on_cpu: bool = False
    #: ``trainer.native_l1``: on a CPU, L1 distances to shared candidates (training and
    #: evaluation) go through the library's own kernel (:mod:`lightning_fedkg.models.kge.native_l1`),
    #: ahead of the compiled form.
    native_l1: bool = False

    def _distance(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.linalg.vector_norm(x - y, ord=self.p_norm, dim=-1)

    def _compare_shared(self, query: Tensor, cand: Tensor) -> Tensor:
        if self.p_norm == 1.0 and torch.compiler.is_compiling():
            # inside a compiled loss: the form the compiler fuses into one loop (it cannot
            # look into cdist, which it calls as it is)
            return self.gamma - _l1_distances(query, cand)
        if self.p_norm == 1.0 and self.native_l1 and query.device.type == "cpu":
            dist = native_l1_distances(query, cand)
            if dist is not None:
                return self.gamma - dist
        if (self.p_norm == 1.0 and self.compile_distances is not False and torch.is_grad_enabled()
                and compiling_pays(query, cand, cpu=self.compile_on_cpu)):
            dist = fused_l1_distances(query, cand)
            if dist is not None:
                return self.gamma - dist
        # cdist never materialises [B, n, w] and is ~20x faster than broadcasting; its
        # matmul shortcut for p=2 trades exactness, so it is disabled.
        dist = torch.cdist(query, cand, p=self.p_norm, compute_mode="donot_use_mm_for_euclid_dist")
        return self.gamma - dist

    def extra_repr(self) -> str:
        return super().extra_repr() + f", p_norm={self.p_norm:g}"


def _l1_distances(query: Tensor, cand: Tensor) -> Tensor:
    return (query.unsqueeze(1) - cand.unsqueeze(0)).abs().sum(-1)


_FUSED_L1: dict = {}

#: With ``trainer.compile_cpu``, a CPU compiles a training batch's L1 distances from this
#: many elements in its ``[B, n, w]`` block up: compiling costs a process 3-8 s (measured on 2 cores), which small
#: steps and the short runs they belong to do not win back (the UMLS quick starts' blocks
#: are 256 x 64 x 64 = 1M elements; FB15k-237-Fed10 at dim 32, 512 x 256 x 32 = 4.2M).
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
    bits could differ between machines). Measured (``scripts/benchmarks/bench_kernels.py --cpu``), one
    thread, 512 x 256 candidates, forward and backward: cdist 5.5 ms against 2.6 ms compiled
    at dim 32, 49.5 against 25.0 ms at dim 256; gradients equal, distances within 3e-4. A CPU keeps cdist by default: its results
    stay bit for bit those of earlier versions, and over 20 UMLS seeds the compiled runs'
    test MRR was .0065 lower on average (docs/results/speed.md), not yet told apart from
    chance."""
    if query.is_cuda:
        return True
    if not cpu or query.device.type != "cpu" or torch.are_deterministic_algorithms_enabled():
        return False
    return query.shape[0] * cand.shape[0] * query.shape[-1] >= CPU_COMPILE_MIN_ELEMENTS and _cpu_compiler_found()


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
