"""The library's own CPU kernel for L1 distances to shared candidates (``trainer.native_l1``).

``l1_kernel.c`` does the forward in one vectorised pass over the ``[B, n, w]`` block and both
gradients in one more (``torch.cdist``'s backward writes that block once per input): at FedE's
batch, 512 x 256 x 256 on 2 threads, 3.5 ms against cdist's 20.7 (docs/results/scale.md). The C
file ships with the package; its first use on a machine builds it with the system compiler
(``$CC``, else ``cc``/``gcc``/``clang``; :data:`FLAGS`) into ``$LIGHTNING_FEDKG_CACHE`` (default
``~/.cache/lightning_fedkg``), named by a hash of source, compiler, flags and CPU, and loads it
with :mod:`ctypes`; it links the OpenMP runtime torch already loaded (same soname), so it runs
on torch's threads. No compiler: one warning, and cdist serves.

Not bit for bit cdist's: the forward sums in another order (distances agree to about one part
in a million) and the candidates' gradient adds the threads' parts in thread order, so results
repeat exactly for a given thread count on a given machine, not across them.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["FLAGS", "kernel_library", "native_l1_distances", "native_l1_usable"]

log = logging.getLogger("lightning_fedkg")

SOURCE = Path(__file__).with_name("l1_kernel.c")
#: How the kernel is built: ``-march=native`` vectorises for the machine it runs on (the cache
#: key holds the CPU, so a shared home folder does not hand one machine's build to another).
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")


def _compiler() -> str | None:
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and (path := shutil.which(name)):
            return path
    return None


def _cpu_identity() -> str:
    """The CPU's model and feature flags (what ``-march=native`` compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() + platform.machine()
    keep = [line for line in lines if line.split(":")[0].strip() in ("model name", "flags", "Features")]
    return "\n".join(sorted(set(keep)))


def _cache_dir() -> Path:
    root = os.environ.get("LIGHTNING_FEDKG_CACHE")
    if root:
        return Path(root) / "kernels"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lightning_fedkg" / "kernels"


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # another process may build the same file: each writes its own and renames it into place
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{compiler} {' '.join(FLAGS)} failed: {proc.stderr.strip()[-500:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.lru_cache(maxsize=1)
def kernel_library() -> ctypes.CDLL | None:
    """The built kernel (built and cached at the first call on a machine), or None where it
    cannot be built or loaded (warned once; ``torch.cdist`` serves then)."""
    compiler = _compiler()
    if compiler is None:
        log.warning("trainer.native_l1: no C compiler found ($CC, cc, gcc, clang); using torch.cdist")
        return None
    key = hashlib.sha256("\0".join([SOURCE.read_text(), compiler, *FLAGS, _cpu_identity()]).encode()).hexdigest()
    target = _cache_dir() / f"l1_kernel_{key[:20]}.so"
    try:
        if not target.exists():
            log.info("trainer.native_l1: building the L1 kernel with %s into %s", compiler, target)
            _build(compiler, target)
        lib = ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as exc:
        log.warning("trainer.native_l1: the L1 kernel could not be built or loaded (%s); using torch.cdist", exc)
        return None
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.l1_forward.argtypes = [p, p, p, i64, i64, i64, i32]
    lib.l1_forward.restype = None
    lib.l1_backward.argtypes = [p, p, p, p, p, p, i64, i64, i64, i32]
    lib.l1_backward.restype = None
    return lib


def native_l1_usable(query: Tensor, cand: Tensor) -> bool:
    """Whether :func:`native_l1_distances` takes these inputs: float32 on a CPU, 2-d, and
    deterministic algorithms off (the kernel's last bits follow the machine's vector width)."""
    return (query.device.type == "cpu" and cand.device.type == "cpu" and query.dtype == torch.float32
            and cand.dtype == torch.float32 and query.dim() == 2 and cand.dim() == 2
            and query.shape[1] == cand.shape[1] and not torch.are_deterministic_algorithms_enabled())


class _NativeL1(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query: Tensor, cand: Tensor, lib: ctypes.CDLL) -> Tensor:
        q, c = query.contiguous(), cand.contiguous()
        b, w = q.shape
        n = c.shape[0]
        out = q.new_empty(b, n)
        lib.l1_forward(q.data_ptr(), c.data_ptr(), out.data_ptr(), b, n, w, torch.get_num_threads())
        ctx.save_for_backward(q, c)
        ctx.lib = lib
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        q, c = ctx.saved_tensors
        g = grad.contiguous().float()
        (b, w), n = q.shape, c.shape[0]
        threads = torch.get_num_threads()
        gq, gc = torch.empty_like(q), torch.empty_like(c)
        scratch = q.new_empty(threads, n, w)
        ctx.lib.l1_backward(q.data_ptr(), c.data_ptr(), g.data_ptr(), gq.data_ptr(), gc.data_ptr(),
                            scratch.data_ptr(), b, n, w, threads)
        return gq, gc, None


def native_l1_distances(query: Tensor, cand: Tensor) -> Tensor | None:
    """``[B, n]`` L1 distances of ``query [B, w]`` to ``cand [n, w]`` by the library's kernel,
    differentiable in both; None where it does not apply (:func:`native_l1_usable`) or cannot
    be built (then cdist serves)."""
    if not native_l1_usable(query, cand):
        return None
    lib = kernel_library()
    if lib is None:
        return None
    return _NativeL1.apply(query, cand, lib)
