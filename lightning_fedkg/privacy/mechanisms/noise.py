"""Gaussian noise for DP releases: a cryptographic source, and outputs snapped to a grid.

Uniform bits come fresh from ``os.urandom`` (no generator state to reconstruct), and a
release is a point of the grid ``Λ·ℤ`` (``Λ = C·2^-20``): the clipped update is rounded to
the grid before ``round(Y/Λ)`` is added, so low-order float bits carry nothing (Mironov,
CCS 2012) and the release is post-processing of the Gaussian mechanism on the rounded
update; :func:`grid_slack` gives the extra sensitivity the ledger accounts. The sample is
Box-Muller in float64 with a radius whose tail reaches about 37.7 σ (:data:`CUT_RADIUS`);
:func:`tail_delta` bounds what that cut adds to δ, and docs/privacy.md lists what the float
arithmetic leaves uncovered.
"""

from __future__ import annotations

import math
import os

import torch
from torch import Tensor

__all__ = ["GRID_BITS", "CUT_RADIUS", "grid", "grid_slack", "urandom_gaussian", "snapped_release", "tail_delta"]

#: The release grid is the clip scaled down by ``2^GRID_BITS`` (to a power of two).
GRID_BITS = 20
_MANTISSA = 53
_LN2 = math.log(2.0)
#: 64-bit words drawn at most for one geometric variate (:func:`_geometric`): that all of
#: them are zero, the only case where the draw is cut, has probability 2^-(64·16) = 2^-1024.
_GEOMETRIC_WORDS = 16
#: The largest geometric variate the sampler returns (all its words zero).
_GEOMETRIC_MAX = 64 * _GEOMETRIC_WORDS
#: The radius no Box-Muller pair of :func:`urandom_gaussian` reaches, in standard deviations:
#: ``√(2·1025·ln 2) ≈ 37.7`` (the exponential variate stays below ``(1024 + 1)·ln 2``).
CUT_RADIUS = math.sqrt(2.0 * (_GEOMETRIC_MAX + 1) * _LN2)


def grid(clip: float) -> float:
    """``Λ``: the largest power of two not above ``clip · 2^-GRID_BITS``."""
    return 2.0 ** (math.floor(math.log2(clip)) - GRID_BITS)


def grid_slack(clip: float, coordinates: int) -> float:
    """How much rounding to the grid can add to a sensitivity, in units of ``clip``:
    ``Λ·√d / C`` for ``d`` coordinates clipped together."""
    return grid(clip) * math.sqrt(max(int(coordinates), 1)) / clip


def _words(n: int) -> Tensor:
    """``n`` random 64-bit words (int64) from ``os.urandom``."""
    return torch.frombuffer(bytearray(os.urandom(8 * n)), dtype=torch.int64)


def _uniforms(n: int) -> Tensor:
    """``n`` float64 uniforms on ``(0, 1]``, 53 bits each, from ``os.urandom``."""
    mantissa = _words(n) & ((1 << _MANTISSA) - 1)  # the low 53 bits, as a non-negative integer
    return (mantissa.double() + 1.0) * 2.0 ** -_MANTISSA


def _trailing_zeros32(x: Tensor) -> Tensor:
    """Trailing zero bits of each of ``x`` (int64 holding values in ``[1, 2^32)``): its
    lowest set bit ``x & -x`` is a power of two below 2^32, which float32 holds exactly, and
    the float's exponent field is the count (no log, no rounding). Zero gives -127."""
    lowest = (x & -x).float()
    return ((lowest.view(torch.int32) >> 23) - 127).long()


def _trailing_zeros(words: Tensor) -> Tensor:
    """Trailing zero bits of each int64 word, 0-64 (64 for a zero word). Done on the two
    32-bit halves, so that no negation can overflow (``-x`` of ``-2^63`` would); the high
    half is read only where the low one is zero (one word in 2^32)."""
    out = _trailing_zeros32(words & 0xFFFFFFFF)
    rare = torch.nonzero(out < 0).flatten()
    if rare.numel():
        high = (words[rare] >> 32) & 0xFFFFFFFF
        out[rare] = torch.where(high != 0, 32 + _trailing_zeros32(high), torch.full_like(high, 64))
    return out


def _geometric(n: int) -> Tensor:
    """``n`` draws of ``G`` with ``P(G ≥ g) = 2^-g``: the trailing zero bits of a random
    64-bit word, a zero word adding 64 and drawing another. Exact for ``g ≤ 1024``; only
    when all :data:`_GEOMETRIC_WORDS` words of an entry are zero (probability 2^-1024) is
    ``G`` cut at 1024. The loop runs over the rare zero entries only."""
    words = _words(n)
    extra = torch.zeros(n, dtype=torch.long)
    zero = torch.nonzero(words == 0).flatten()
    for _ in range(_GEOMETRIC_WORDS - 1):
        if zero.numel() == 0:
            break
        extra[zero] += 64
        fresh = _words(zero.numel())
        words[zero] = fresh
        zero = zero[fresh == 0]
    return extra + _trailing_zeros(words)


def _exponentials(n: int) -> Tensor:
    """``n`` float64 Exp(1) variates ``X = G·ln 2 + Y``: ``G = ⌊X / ln 2⌋`` is geometric
    (:func:`_geometric`) and, by memorylessness, ``Y = X - G·ln 2`` is Exp(1) truncated to
    ``[0, ln 2)`` and independent of ``G``, drawn by inversion, ``Y = -log1p(-V/2)`` for a
    53-bit uniform ``V`` on ``[0, 1)``. Unlike ``-ln U`` of a 53-bit uniform ``U`` (at most
    ``53·ln 2``), the tail goes on to ``1025·ln 2``."""
    g = _geometric(n)
    v = (_words(n) & ((1 << _MANTISSA) - 1)).double() * 2.0 ** -_MANTISSA
    return g.double() * _LN2 - torch.log1p(-0.5 * v)


def urandom_gaussian(shape, dtype=torch.float64) -> Tensor:
    """Standard normal samples of ``shape`` by Box-Muller on ``os.urandom`` bits (no
    generator state: two calls never repeat, seeding torch has no effect). The squared
    radius is ``2X`` for an exponential ``X`` whose tail is exact to 2^-1024
    (:func:`_exponentials`), so no pair exceeds :data:`CUT_RADIUS` (≈ 37.7) and none is cut
    below it; the old radius ``√(-2 ln U)`` of a 53-bit uniform stopped at 8.57."""
    n = math.prod(shape)
    pairs = (n + 1) // 2
    radius = torch.sqrt(2.0 * _exponentials(pairs))
    angle = (2.0 * math.pi) * _uniforms(pairs)
    z = torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:n]
    return z.view(shape).to(dtype)


def snapped_release(update: Tensor, std: Tensor | float, step: float) -> Tensor:
    """``update`` rounded to the grid ``step·ℤ`` plus Gaussian noise of standard deviation
    ``std`` (a number, or a tensor broadcast against ``update``) rounded to the same grid;
    float64. Every value is an integer multiple of ``step``."""
    noise = urandom_gaussian(tuple(update.shape)) * std
    return (torch.round(update.double() / step) + torch.round(noise / step)) * step


def tail_delta(noise_multiplier: float, sensitivity: float, coordinates: int, holders: int = 1,
               epsilon: float | None = None) -> float:
    """A bound on what the sampler's cut adds to δ per release of one clipped unit (a row,
    or a client's whole upload under ``unit: client``): the run is ``(ε, δ + uploads ×
    this)``-DP where dp-accounting's exact Gaussian gives ``(ε, δ)``.

    ``noise_multiplier`` σ and ``sensitivity`` Δ (with the grid's slack) are in units of the
    clip; ``coordinates`` d the values clipped together. Derivation: a pair of
    :func:`urandom_gaussian` has the Gaussian's density times ``h``, where ``h = 1`` for a
    squared radius below ``2·1024·ln 2``, ``2`` on the shell up to ``2·1025·ln 2`` (the mass
    2^-1025 of the cut tail, moved there) and ``0`` beyond :data:`CUT_RADIUS`. Pairs without
    a coordinate of the unit are alike under both neighbours and independent of the rest, so
    only ``m ≤ d`` pairs count. For neighbours ``x``, ``x'`` and any set ``S`` of outputs:

    1. the sampler is within total variation ``η = m·2^-1025`` of the Gaussian:
       ``P'_x(S) ≤ P_x(S) + η``;
    2. ``A``, the outputs at which every such pair minus ``x'``'s update lies inside
       ``CUT_RADIUS·σ``, is where ``h ≥ 1``, so ``P_x'(S ∩ A) ≤ P'_x'(S)``; and ``x``'s
       Gaussian leaves ``A`` only if a pair's noise exceeds ``CUT_RADIUS - Δ/σ`` (its shift is
       at most Δ), probability at most ``m·exp(-(CUT_RADIUS - Δ/σ)²/2)`` (a pair's squared
       radius is χ²₂: ``P(R > r) = e^(-r²/2)``).

    So ``P'_x(S) ≤ P_x(S ∩ A) + P_x(not A) + η ≤ e^ε P'_x'(S) + δ + m·(2^-1025 +
    exp(-(CUT_RADIUS - Δ/σ)²/2))``, with no ``e^ε`` factor, and per release (the sets are
    taken given the earlier releases, so the terms add over a run). 1.0 (no bound) once
    ``Δ/σ ≥ CUT_RADIUS``. At Δ = 2, σ = 0.31 it is ``1e-212·d``; the old cut at 8.57 gave
    about ``Q(8.57 - Δ/σ) = 0.017`` per coordinate there.

    ``holders`` k > 1 (distributed noise: the sum of k shares, each cut on its own): step 2
    has no set of outputs to work with, and the coupling alone gives ``(1 + e^ε)·k·m·2^-1025``
    with ``epsilon`` the run's ε (required then). Given for ``holders = 1`` too, the smaller
    bound is returned.
    """
    d = max(int(coordinates), 1)
    bounds = []
    if holders <= 1:
        gap = CUT_RADIUS - sensitivity / noise_multiplier
        bounds.append(d * (2.0 ** -(_GEOMETRIC_MAX + 1) + math.exp(-gap * gap / 2)) if gap > 0 else 1.0)
    elif epsilon is None:
        raise ValueError("tail_delta: distributed noise (holders > 1) needs the run's epsilon")
    if epsilon is not None:
        # log((1 + e^ε)·k·m·2^-1025), kept in logs: e^ε alone overflows for ε > 709
        log_bound = (epsilon + math.log1p(math.exp(-epsilon)) + math.log(max(int(holders), 1) * d)
                     - (_GEOMETRIC_MAX + 1) * _LN2)
        bounds.append(math.exp(log_bound) if log_bound < 0 else 1.0)
    return min(1.0, *bounds)
