"""The DP noise sampler (lightning_fedkg/privacy/mechanisms/noise.py) against the review's finding on its
tail: Box-Muller's radius ``√(-2 ln U)`` of a 53-bit uniform ``U`` never exceeded
``√(2·53·ln 2) ≈ 8.57``, so an output beyond it had probability zero under one neighbour
and not under the other, a δ floor of about ``Q(8.57 - Δ/σ)`` per coordinate that no
report stated. Each test says what it measured on the code before the fix; the checks of
the distribution pass on both and are there so that the new construction can be wrong
only where a test would see it."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fedkg.privacy.mechanisms import noise

pytestmark = pytest.mark.usefixtures("one_thread")

#: The old sampler's largest radius: ``-2 ln U`` at ``U = 2^-53``.
OLD_CUT = math.sqrt(2 * 53 * math.log(2))


def _phi(x: torch.Tensor) -> torch.Tensor:
    """The standard normal CDF."""
    return 0.5 * torch.erfc(-x / math.sqrt(2))


def _ks(samples: torch.Tensor, cdf) -> float:
    """The Kolmogorov-Smirnov distance between ``samples`` and ``cdf``."""
    x, _ = torch.sort(samples.double())
    n = x.numel()
    f = cdf(x)
    above = torch.arange(1, n + 1, dtype=torch.float64) / n - f
    below = f - torch.arange(0, n, dtype=torch.float64) / n
    return float(torch.maximum(above, below).max())


def _ks_critical(n: int, alpha: float = 1e-6) -> float:
    """The KS distance a correct sampler exceeds with probability about ``alpha``."""
    return math.sqrt(math.log(2 / alpha) / (2 * n))


def test_the_radius_goes_beyond_the_old_cut(monkeypatch):
    """With every random bit zero (the sampler's most extreme draw) the old code gave a pair
    of radius exactly 8.5717 (``U = 2^-53``), its largest; now a zero word adds 64 to the
    geometric part, up to the cap of 16 words (probability 2^-1024), and the radius reaches
    ``√(2·1024·ln 2) = 37.68``. The loop ends at the cap even when the source never gives a
    non-zero word."""
    monkeypatch.setattr(noise.os, "urandom", lambda n: bytes(n))
    z = noise.urandom_gaussian((2,))
    radius = float(torch.hypot(z[0], z[1]))
    assert radius > OLD_CUT + 1, f"the radius stops at {radius:.4f} (the old cut is {OLD_CUT:.4f})"
    assert radius == pytest.approx(math.sqrt(2 * 1024 * math.log(2)), rel=1e-12)
    assert radius < noise.CUT_RADIUS


def test_a_zero_word_adds_64_and_the_rest_is_still_exponential(monkeypatch):
    """The first word of every geometric draw forced to zero: each pair's ``X = r²/2`` must
    then be ``64·ln 2`` plus a fresh Exp(1) (memorylessness), so every radius exceeds
    ``√(128·ln 2) = 9.42``. On the old code the same zero bytes (its two uniforms) gave
    radius 8.57 for every pair."""
    real = noise.os.urandom
    calls = []

    def first_call_zero(n):
        calls.append(n)
        return bytes(n) if len(calls) == 1 else real(n)

    monkeypatch.setattr(noise.os, "urandom", first_call_zero)
    pairs = 20_000
    z = noise.urandom_gaussian((2 * pairs,))
    x = (z[:pairs] ** 2 + z[pairs:] ** 2) / 2
    assert float(x.min()) > 64 * math.log(2), f"smallest radius {math.sqrt(2 * float(x.min())):.4f}"
    rest = x - 64 * math.log(2)
    assert float(rest.mean()) == pytest.approx(1.0, abs=5 / math.sqrt(pairs))
    assert _ks(rest, lambda t: 1 - torch.exp(-t)) < _ks_critical(pairs)


def test_the_geometric_part_halves_at_every_step():
    """``G``, the trailing zero bits of random words, has ``P(G = g) = 2^-(g+1)``: its
    frequencies for g = 0..15 within 5 standard errors over 10^6 draws, mean 1, variance 2
    (a count of leading zeros, an off-by-one or a 32-bit mask would fail). New code."""
    n = 1_000_000
    g = noise._geometric(n)
    assert int(g.min()) >= 0
    counts = torch.bincount(g, minlength=16)[:16].double()
    for k in range(16):
        p = 2.0 ** -(k + 1)
        assert abs(float(counts[k]) / n - p) < 5 * math.sqrt(p * (1 - p) / n) + 1 / n, (k, float(counts[k]))
    assert float(g.double().mean()) == pytest.approx(1.0, abs=5 * math.sqrt(2 / n))
    assert float(g.double().var()) == pytest.approx(2.0, abs=0.05)
    # the exact trailing-zero count, on words with known answers (-2^63 has 63, 0 has 64)
    words = torch.tensor([1, 2, 12, -(2 ** 63), 2 ** 40, -1, 0, 3 << 33], dtype=torch.int64)
    assert noise._trailing_zeros(words).tolist() == [0, 1, 2, 63, 40, 0, 64, 33]


def test_the_squared_radius_is_exponential_to_its_far_tail():
    """``r²/2`` of each pair against Exp(1): the KS distance over 5·10^5 pairs, and
    ``P(X > k·ln 2) = 2^-k`` for k = 1..12 within 5 standard errors (the geometric part and
    the truncated exponential joined right). Both hold on the old code too (its cut, at
    ``53·ln 2``, is far beyond what 10^6 samples see)."""
    pairs = 500_000
    z = noise.urandom_gaussian((2 * pairs,))
    x = (z[:pairs] ** 2 + z[pairs:] ** 2) / 2
    assert _ks(x, lambda t: 1 - torch.exp(-t)) < _ks_critical(pairs)
    for k in range(1, 13):
        p = 2.0 ** -k
        freq = float((x > k * math.log(2)).double().mean())
        assert abs(freq - p) < 5 * math.sqrt(p * (1 - p) / pairs), (k, freq, p)


def test_the_samples_are_standard_normal():
    """10^6 samples: mean, variance, the KS distance to Φ, and the tail ``P(|Z| > 4) =
    6.334e-5`` within 5 standard errors over 4·10^6 samples. Passes on the old code too;
    guards the new construction."""
    n = 1_000_000
    z = noise.urandom_gaussian((n,))
    assert z.dtype == torch.float64 and z.shape == (n,)
    assert abs(float(z.mean())) < 5 / math.sqrt(n)
    assert float(z.var()) == pytest.approx(1.0, abs=5 * math.sqrt(2 / n))
    assert _ks(z, _phi) < _ks_critical(n)
    big = 4 * n
    tail = math.erfc(4 / math.sqrt(2))  # P(|Z| > 4)
    hits = int((z.abs() > 4).sum()) + int((noise.urandom_gaussian((big - n,)).abs() > 4).sum())
    assert abs(hits / big - tail) < 5 * math.sqrt(tail * (1 - tail) / big), (hits, tail * big)


def test_no_value_repeats_within_or_between_calls():
    """Fresh bits for every call (no generator state): two calls share no value, and one
    call repeats none. Holds on the old code too."""
    a = noise.urandom_gaussian((200_000,))
    b = noise.urandom_gaussian((200_000,))
    assert torch.unique(torch.cat([a, b])).numel() == 400_000
    assert noise.urandom_gaussian((3, 5)).shape == (3, 5)
    assert noise.urandom_gaussian((7,), dtype=torch.float32).dtype == torch.float32


def test_the_tail_delta_is_astronomically_small_now():
    """:func:`noise.tail_delta` per release of a row: at the review's σ (replace-one, Δ = 2)
    the old cut gave ``Q(8.57 - Δ/σ)`` = 0.017 (σ = 0.31), 2.6e-8 (0.64), 2.5e-11 (1.0) per
    coordinate; the bound for the new sampler is below 1e-200 for a row of 1000 values, and
    1.0 (no bound) once Δ/σ reaches the new cut at 37.7. New code."""
    def q(x):
        return 0.5 * math.erfc(x / math.sqrt(2))

    old = {s: q(OLD_CUT - 2 / s) for s in (0.31, 0.64, 1.0)}
    assert old[0.31] == pytest.approx(0.0170, rel=1e-2)
    assert old[0.64] == pytest.approx(2.57e-8, rel=1e-2)
    assert old[1.0] == pytest.approx(2.49e-11, rel=1e-2)
    for s in old:
        bound = noise.tail_delta(s, 2.0, 1000)
        assert 0 < bound < 1e-200, (s, bound)
        assert bound == pytest.approx(1000 * (2.0 ** -1025 + math.exp(-(noise.CUT_RADIUS - 2 / s) ** 2 / 2)))
    assert noise.CUT_RADIUS == pytest.approx(37.6955, abs=1e-4)
    assert noise.tail_delta(2 / 37.7, 2.0, 16) == 1.0
    # more coordinates, a smaller σ: never a smaller bound
    assert noise.tail_delta(0.31, 2.0, 32) < noise.tail_delta(0.31, 2.0, 64) < noise.tail_delta(0.2, 2.0, 64)
    # distributed noise: the coupling bound, which needs the run's ε (and is 1 past ε ≈ 700)
    with pytest.raises(ValueError, match="epsilon"):
        noise.tail_delta(1.0, 2.0, 16, holders=3)
    assert 0 < noise.tail_delta(1.0, 2.0, 16, holders=3, epsilon=50.0) < 1e-280
    assert noise.tail_delta(1.0, 2.0, 16, holders=3, epsilon=800.0) == 1.0


def test_the_dp_report_states_the_tail_delta_beside_delta():
    """``metrics.json``'s ``privacy`` block gives ``delta_tail_per_row`` beside δ: the bound
    at the least σ a client reported and the sensitivity the ledger accounts (2 + the grid's
    slack, a row of DIM values); None before any upload. Before the fix the report had no
    such figure (and the cut's δ floor, at σ = 1, was 2.5e-11 per coordinate)."""
    from lightning_fedkg.privacy.dp_uploads import DPServer
    from lightning_fedkg.federated.federation import FederatedRun

    from test_protocol import DIM, umls_config

    sensitivity = 2.0 + noise.grid_slack(0.3, DIM)
    run = FederatedRun(umls_config(federated__dp__enabled=True, federated__dp__noise_multiplier=1.0,
                                   federated__dp__clip=0.3), run_dir=None)
    run.align()
    assert isinstance(run.server, DPServer)
    assert run.server.report()["privacy"]["delta_tail_per_row"] is None  # nothing released yet
    run.train_round(1)
    privacy = run.server.report()["privacy"]
    expected = noise.tail_delta(1.0, sensitivity, DIM)
    assert privacy["delta_tail_per_row"] == expected and 0 < expected < 1e-250
    assert privacy["delta"] == 1e-5
    # distributed noise: the coupling bound over the n = 3 holders at the run's ε, and the
    # local bound of one share (σ/√3) for the deviating-server figure
    run = FederatedRun(umls_config(federated__dp__enabled=True, federated__dp__noise_multiplier=1.0,
                                   federated__dp__clip=0.3, federated__dp__placement="distributed",
                                   federated__secure_aggregation__enabled=True), run_dir=None)
    run.align()
    run.train_round(1)
    privacy = run.server.report()["privacy"]
    assert privacy["epsilon"] > 0
    assert privacy["delta_tail_per_row"] == noise.tail_delta(1.0, sensitivity, DIM, holders=3,
                                                             epsilon=privacy["epsilon"])
    assert privacy["delta_tail_per_row_deviating_server"] == noise.tail_delta(1 / math.sqrt(3), sensitivity, DIM)
    assert 0 < privacy["delta_tail_per_row"] < 1e-250 and 0 < privacy["delta_tail_per_row_deviating_server"] < 1e-250
