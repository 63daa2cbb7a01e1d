"""Gaussian noise for DP releases: a cryptographic source, and outputs snapped to a grid.

Uniform bits come fresh from ``os.urandom`` (no generator state to reconstruct), and a
release is a point of the grid ``Λ·ℤ`` (``Λ = C·2^-20``): the clipped update is rounded to
the grid before ``round(Y/Λ)`` is added, so low-order float bits carry nothing (Mironov,
CCS 2012) and the release is post-processing of the Gaussian mechanism on the rounded
update; :func:`grid_slack` gives the extra sensitivity the ledger accounts. The sample is
Box-Muller in float64, not an exact Gaussian; what that leaves uncovered: docs/privacy.md.
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
