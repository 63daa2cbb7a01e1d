"""The Poisson-subsampled Gaussian mechanism's log moments, and noise calibration.

Exact RDP at integer orders (Mironov, Talwar & Zhang, 2019, §3.3) returned as log moments
``alpha(l) = l * RDP(l + 1)``, the form of
:class:`~lightning_fedkg.methods.fkge.accountant.PateMomentsAccountant`, so one ledger adds PATE's
data-dependent moments and the Gaussian's order by order (which ``dp-accounting``'s public
API does not expose). ``tests/test_privacy_ledger.py`` checks it against ``dp-accounting``.
See docs/privacy.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["sampled_gaussian_log_moments", "epsilon_from_log_moments", "calibrate_gaussian_noise"]


def sampled_gaussian_log_moments(q: float, sigma: float, max_order: int = 32, steps: int = 1) -> Tensor:
    """``float64 [max_order]``: ``alpha(l)`` for ``l = 1 .. max_order`` of ``steps``
    compositions of the ``q``-subsampled Gaussian with noise multiplier ``sigma``.

    ``sigma = 0`` (no noise) gives ``+inf`` at every order (no privacy); ``q = 0`` gives 0.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"sample rate q must lie in [0, 1], got {q}")
    if sigma < 0:
        raise ValueError(f"sigma must be >= 0, got {sigma}")
    if q == 0 or steps == 0:
        return torch.zeros(max_order, dtype=torch.float64)
    if sigma == 0:
        return torch.full((max_order,), math.inf, dtype=torch.float64)
    out = torch.empty(max_order, dtype=torch.float64)
    for l in range(1, max_order + 1):
        a = l + 1
        if q == 1:
            log_a = a * (a - 1) / (2 * sigma**2)
        else:
            terms = [math.lgamma(a + 1) - math.lgamma(k + 1) - math.lgamma(a - k + 1)
                     + (a - k) * math.log1p(-q) + k * math.log(q) + (k * k - k) / (2 * sigma**2)
                     for k in range(a + 1)]
            top = max(terms)
            log_a = top + math.log(sum(math.exp(t - top) for t in terms))
        out[l - 1] = steps * log_a  # alpha(l) = l * RDP(l+1) = log A_{l+1}
    return out


def epsilon_from_log_moments(log_moments: Tensor, delta: float) -> float:
    """``min_l (alpha(l) + log(1/delta)) / l`` (Abadi et al., CCS 2016, Thm 2.2)."""
    orders = torch.arange(1, log_moments.numel() + 1, dtype=torch.float64)
    return float(((log_moments + math.log(1.0 / delta)) / orders).min())


def calibrate_gaussian_noise(epsilon: float, delta: float, q: float = 1.0, steps: int = 1,
                             max_order: int = 32, tolerance: float = 1e-4) -> float:
    """The smallest noise multiplier ``sigma`` (to ``tolerance``, relative) whose ``steps``
    ``q``-subsampled releases stay within ``(epsilon, delta)`` by :func:`epsilon_from_log_moments`."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")

    def eps(sigma: float) -> float:
        return epsilon_from_log_moments(sampled_gaussian_log_moments(q, sigma, max_order, steps), delta)

    low, high = 1e-3, 1.0
    while eps(high) > epsilon:
        low, high = high, high * 2
        if high > 1e6:
            raise ValueError(f"no sigma below 1e6 reaches epsilon={epsilon} at delta={delta} "
                             f"with orders up to {max_order + 1}")
    while (high - low) > tolerance * high:
        mid = (low + high) / 2
        low, high = (low, mid) if eps(mid) <= epsilon else (mid, high)
    return high
