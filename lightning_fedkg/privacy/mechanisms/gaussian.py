"""The Gaussian mechanism's privacy: exact (epsilon, delta) of composed releases, RDP log
moments for composing with PATE, and noise calibration.

Exact (:func:`gaussian_epsilon`, :func:`gaussian_mu`): a release of sensitivity ``S`` with
noise std ``sigma`` is ``mu``-GDP, ``mu = S / sigma``; releases compose to
``sqrt(sum mu_i^2)``-GDP, and ``mu``-GDP is ``(epsilon, delta)``-DP exactly for ``delta =
Phi(-epsilon/mu + mu/2) - e^epsilon Phi(-epsilon/mu - mu/2)`` (Dong, Roth & Su, JRSS-B 2022;
Balle & Wang, ICML 2018). RDP (Mironov, Talwar & Zhang, 2019, §3.3), returned as log moments
``alpha(l) = l * RDP(l + 1)``, the form of
:class:`~lightning_fedkg.privacy.mechanisms.pate_moments.PateMomentsAccountant`, so one ledger adds
PATE's moments and the Gaussian's order by order. ``tests/test_privacy_ledger.py`` checks
both against ``dp-accounting`` (PLD, RDP). See docs/privacy.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["sampled_gaussian_log_moments", "epsilon_from_log_moments", "calibrate_gaussian_noise",
           "gaussian_delta", "gaussian_epsilon", "gaussian_mu"]


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


def _log_ndtr(x: float) -> float:
    """``log Phi(x)`` for the standard normal CDF, accurate far into the lower tail."""
    if x > -20:
        return math.log(0.5 * math.erfc(-x / math.sqrt(2.0)))
    # asymptotic series of Mills' ratio: Phi(x) ~ phi(x) / |x| * (1 - 1/x^2 + 3/x^4 - 15/x^6)
    x2 = x * x
    return -x2 / 2 - math.log(-x) - 0.5 * math.log(2 * math.pi) + math.log1p(-1 / x2 + 3 / x2**2 - 15 / x2**3)


def gaussian_delta(epsilon: float, mu: float) -> float:
    """The smallest ``delta`` for which a ``mu``-GDP mechanism (a Gaussian release with
    sensitivity / noise std ``= mu``) is ``(epsilon, delta)``-DP (Balle & Wang 2018, Thm 8)."""
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return 1.0
    first = _log_ndtr(-epsilon / mu + mu / 2)
    second = epsilon + _log_ndtr(-epsilon / mu - mu / 2)
    if second >= first:  # equal up to rounding: no privacy loss above epsilon
        return 0.0
    return math.exp(first) * -math.expm1(second - first)


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact ``epsilon`` at ``delta`` of a ``mu``-GDP mechanism (0 for ``mu = 0``, inf
    for ``mu = inf``: a release without noise)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    if mu <= 0:
        return 0.0
    if math.isinf(mu):
        return math.inf
    if gaussian_delta(0.0, mu) <= delta:
        return 0.0
    low, high = 0.0, 1.0
    while gaussian_delta(high, mu) > delta:
        low, high = high, high * 2
    for _ in range(200):  # bisection to float precision: delta(epsilon) is decreasing
        mid = (low + high) / 2
        low, high = (mid, high) if gaussian_delta(mid, mu) > delta else (low, mid)
        if high - low <= 1e-12 * high:
            break
    return high


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The largest ``mu`` (sensitivity / noise std) whose ``mu``-GDP is ``(epsilon, delta)``-DP:
    the noise of one release at ``(epsilon, delta)`` is ``sigma = sensitivity / mu``. Every
    ``epsilon > 0`` is reachable (``mu -> 0`` as ``epsilon -> 0``)."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")
    low, high = 0.0, 1.0
    while gaussian_delta(epsilon, high) <= delta:
        low, high = high, high * 2
    for _ in range(200):  # delta(epsilon; mu) increases with mu
        mid = (low + high) / 2
        low, high = (mid, high) if gaussian_delta(epsilon, mid) <= delta else (low, mid)
        if high - low <= 1e-12 * high:
            break
    return low
