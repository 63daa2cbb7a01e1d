"""Gaussian noise for DP releases: a cryptographic source, and outputs snapped to a grid.

Two weaknesses of ``torch.randn`` as a DP noise source, and what this module does about each:

* **The source.** ``torch.randn`` draws from MT19937, whose state follows from 624 outputs,
  and whose seed we took from the OS: anyone who learns the state predicts every later
  sample. We take uniform bits from ``os.urandom`` (the kernel's CSPRNG, ChaCha20 on Linux),
  fresh for every draw, so there is no state for a party to reconstruct, and seeding torch
  changes nothing.
* **Floating point.** A Gaussian computed in floating point and added to a value in floating
  point leaks that value through the low-order bits of the sum: which floats are reachable
  depends on the value (Mironov, "On Significance of the Least Significant Bits for
  Differential Privacy", CCS 2012). We release only points of a grid ``Λ·ℤ`` (a power of two,
  ``C·2^-20``): the clipped update is rounded to the grid, then ``round(Y/Λ)`` is added.
  Because the rounded update is on the grid, ``round(x/Λ) + round(Y/Λ) = round(round(x/Λ) +
  Y/Λ)``: the release is a deterministic function of the Gaussian mechanism applied to the
  rounded update, so it is exactly as private as that mechanism (post-processing). Rounding
  moves each coordinate by at most ``Λ/2``, so two neighbouring updates differ by at most
  ``Δ + Λ·√d`` after it (``d`` coordinates under one clip); :func:`grid_slack` gives
  ``Λ·√d/C`` and the ledger accounts the larger sensitivity.

What is not covered by the post-processing argument: the sample itself is Box-Muller on
53-bit uniforms in float64, not an exact Gaussian. Its tail is cut at ``√(2·53·ln 2) ≈ 8.6``
standard deviations and its values carry float64 rounding (relative error about 1e-16);
the grid is ``2^20`` times coarser than the clip, so a rounding error can move a release to
the next grid point only when the exact sample falls within about 1e-15·σC of a grid
boundary. We state this and do not add it to δ. An exact discrete Gaussian (OpenDP's
``make_gaussian``, Canonne, Kamath & Steinke 2020) removes it at a cost we measured at
about 36 µs a coordinate, two minutes a client for an FB15k-237 table (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

__all__ = ["GRID_BITS", "grid", "grid_slack", "urandom_gaussian", "snapped_release"]

#: The release grid is the clip scaled down by ``2^GRID_BITS`` (to a power of two).
GRID_BITS = 20
_MANTISSA = 53


def grid(clip: float) -> float:
    """``Λ``: the largest power of two not above ``clip · 2^-GRID_BITS``."""
    return 2.0 ** (math.floor(math.log2(clip)) - GRID_BITS)


def grid_slack(clip: float, coordinates: int) -> float:
    """How much rounding to the grid can add to a sensitivity, in units of ``clip``:
    ``Λ·√d / C`` for ``d`` coordinates clipped together."""
    return grid(clip) * math.sqrt(max(int(coordinates), 1)) / clip


def _uniforms(n: int) -> Tensor:
    """``n`` float64 uniforms on ``(0, 1]``, 53 bits each, from ``os.urandom``."""
    words = torch.frombuffer(bytearray(os.urandom(8 * n)), dtype=torch.int64)
    mantissa = words & ((1 << _MANTISSA) - 1)  # the low 53 bits, as a non-negative integer
    return (mantissa.double() + 1.0) * 2.0 ** -_MANTISSA


def urandom_gaussian(shape, dtype=torch.float64) -> Tensor:
    """Standard normal samples of ``shape`` by Box-Muller on ``os.urandom`` uniforms (no
    generator state: two calls never repeat, seeding torch has no effect)."""
    n = math.prod(shape)
    pairs = (n + 1) // 2
    u = _uniforms(2 * pairs).view(2, pairs)
    radius = torch.sqrt(-2.0 * torch.log(u[0]))
    angle = (2.0 * math.pi) * u[1]
    z = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]
    return z.view(shape).to(dtype)


def snapped_release(update: Tensor, std: Tensor | float, step: float) -> Tensor:
    """``update`` rounded to the grid ``step·ℤ`` plus Gaussian noise of standard deviation
    ``std`` (a number, or a tensor broadcast against ``update``) rounded to the same grid;
    float64. Every value is an integer multiple of ``step``."""
    noise = urandom_gaussian(tuple(update.shape)) * std
    return (torch.round(update.double() / step) + torch.round(noise / step)) * step
