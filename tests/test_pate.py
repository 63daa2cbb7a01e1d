"""PATE voting and the moments accountant (FKGE's pate and accountant modules).

Expected values are computed here from the published formulas with plain ``math``
(Papernot et al., ICLR 2017, Thm 2-3; Abadi et al., CCS 2016, Thm 2.2), or taken from an
independent accountant (Google's ``dp-accounting``), never from the implementation.
"""

from __future__ import annotations

import math

import pytest
import torch

from lightning_fedkg.privacy.mechanisms.pate_moments import PateMomentsAccountant
from lightning_fedkg.privacy.mechanisms.pate import noisy_argmax, split_teacher_partitions, teacher_votes

LOG_INV_DELTA = math.log(1e5)


def _dd(lam: float, gap: int, l: int) -> float:
    """PATE Thm 3 for two classes, written out independently of the implementation."""
    q = (2 + lam * gap) / (4 * math.exp(lam * gap))
    assert q < (math.exp(2 * lam) - 1) / (math.exp(4 * lam) - 1), "Thm 3's condition must hold here"
    return math.log((1 - q) * ((1 - q) / (1 - math.exp(2 * lam) * q)) ** l + q * math.exp(2 * lam * l))


# ----------------------------------------------------------------------------- accountant


def test_fkge_paper_budget_29_queries_any_votes():
    """FKGE's setting (Peng et al., CIKM 2021): lambda=0.05, delta=1e-5, 4 teachers, 29
    queries -> 2.729 at l=9.

    With 4 teachers the gap is 0, 2 or 4; only a unanimous vote meets Thm 3's condition and
    even then dd > di for l <= 17, so at the orders that matter every query costs
    2 * 0.05^2 * l(l+1) = 0.005 l(l+1) whatever the votes: alpha(9) = 29 * 0.45 = 13.05 and
    (13.05 + ln 1e5) / 9 = 2.7292. (dd > di does not hold at every order for unanimous
    votes: from l = 18 on dd is smaller, which does not move the minimum.)
    """
    for gaps in ([0] * 29, [4] * 29, [0, 2, 4] * 9 + [2, 4]):
        acc = PateMomentsAccountant(lam=0.05, delta=1e-5)
        acc.accumulate(torch.tensor(gaps))
        assert acc.queries == 29
        assert round(acc.epsilon(), 3) == 2.729
        assert acc.best_order() == 9
        assert acc.log_moments[8].item() == pytest.approx(13.05, rel=1e-12)
        assert acc.log_moments[0].item() == pytest.approx(0.29, rel=1e-12)  # the paper's "0.29"
        assert acc.log_moments[:17].tolist() == pytest.approx([29 * 0.005 * l * (l + 1) for l in range(1, 18)])
    # Without unanimous votes dd never applies; past 1/lambda - 1 = 19 the pure-DP bound
    # 2*lambda*l per query is the smaller one.
    acc = PateMomentsAccountant(lam=0.05, delta=1e-5)
    acc.accumulate(torch.tensor([0, 2] * 14 + [2]))
    expected = [29 * min(0.005 * l * (l + 1), 0.1 * l) for l in range(1, 33)]
    assert acc.log_moments.tolist() == pytest.approx(expected, rel=1e-12)


def test_per_sample_budgets_for_1000_queries():
    """Per-sample accounting (one query per label) for 1000 labels, any vote pattern with
    few teachers (dd never helps): alpha(l) = 1000 * 2 lambda^2 l (l+1).
    lambda=0.05: l=2 gives (1000 * 0.005 * 6 + ln 1e5) / 2 = (30 + 11.513) / 2 = 20.756;
    lambda=0.025 (noise Lap(40)): l=3 gives (1000 * 0.00125 * 12 + 11.513) / 3 = 8.838 <= 10."""
    for lam, eps, order in ((0.05, 20.756, 2), (0.025, 8.838, 3)):
        acc = PateMomentsAccountant(lam=lam, delta=1e-5)
        acc.accumulate(torch.tensor([0, 2] * 500))
        assert round(acc.epsilon(), 3) == eps and acc.best_order() == order


def test_data_dependent_bound_wins_single_query_by_hand():
    """lambda=0.1, 50 unanimous teachers (gap 50): q = 7 / (4 e^5) = 0.0117914, below Thm 3's
    bound (e^0.2 - 1)/(e^0.4 - 1) = 0.45017, so dd applies and beats di.

    By hand at l=1: (1-q)^2 / (1 - e^0.2 q) = 0.976558 / 0.985598 = 0.990823, plus
    q e^0.2 = 0.014402, gives 1.005225 and dd(1) = log 1.005225 = 0.005215 < di(1) = 0.04.
    """
    acc = PateMomentsAccountant(lam=0.1, delta=1e-5)
    acc.accumulate(torch.tensor([50]))
    assert acc.log_moments[0].item() == pytest.approx(0.0052146, abs=1e-6)
    expected = [min(_dd(0.1, 50, l), 2 * 0.01 * l * (l + 1), 0.2 * l) for l in range(1, 33)]
    assert all(_dd(0.1, 50, l) < 2 * 0.01 * l * (l + 1) for l in range(1, 33))
    assert acc.log_moments.tolist() == pytest.approx(expected, rel=1e-12)
    eps = [(a + LOG_INV_DELTA) / l for l, a in enumerate(expected, start=1)]
    assert acc.epsilon() == pytest.approx(min(eps), rel=1e-12)
    assert acc.best_order() == eps.index(min(eps)) + 1


def test_validity_condition_is_enforced():
    """Thm 3 needs q < (e^{2 lambda}-1)/(e^{4 lambda}-1), which FKGE Eq. 10 omits.

    lambda=0.05: gap 2 gives q = 0.475040 > 0.475021 (invalid: it must cost
    min(di, 2 lambda l)), gap 4 gives q = 0.450302 (valid: min(di, dd, 2 lambda l), and
    dd > di exactly for l <= 17). lambda=0.5, gap 1: q = 0.3791, so 1 - e^{2 lambda} q < 0
    and the unchecked formula takes a fractional power / the log of a negative number.
    """
    lam = 0.05
    bound = (math.exp(2 * lam) - 1) / (math.exp(4 * lam) - 1)
    assert (2 + lam * 4) / (4 * math.exp(lam * 4)) < bound < (2 + lam * 2) / (4 * math.exp(lam * 2))
    acc = PateMomentsAccountant(lam=lam, max_order=32)
    terms = acc.per_query(torch.tensor([0, 2, 4]))
    capped_di = [min(2 * lam * lam * l * (l + 1), 2 * lam * l) for l in range(1, 33)]
    assert terms[0].tolist() == pytest.approx(capped_di, rel=1e-12)
    assert terms[1].tolist() == pytest.approx(capped_di, rel=1e-12)
    assert terms[2].tolist() == pytest.approx([min(c, _dd(lam, 4, l)) for l, c in enumerate(capped_di, 1)])
    assert [l for l in range(1, 33) if _dd(lam, 4, l) < 2 * lam * lam * l * (l + 1)] == list(range(18, 33))

    lam = 0.5
    q = (2 + lam * 1) / (4 * math.exp(lam * 1))
    assert 1 - math.exp(2 * lam) * q < 0  # the naive dd is undefined here
    t = PateMomentsAccountant(lam=lam, max_order=8).per_query(torch.tensor([1]))[0]
    assert torch.isfinite(t).all()
    assert t.tolist() == pytest.approx([min(0.5 * l * (l + 1), 1.0 * l) for l in range(1, 9)], rel=1e-12)


def test_state_dict_round_trip_and_batching_is_irrelevant():
    gaps = torch.randint(0, 60, (500,), generator=torch.Generator().manual_seed(3))
    one = PateMomentsAccountant(lam=0.1)
    one.accumulate(gaps)
    several = PateMomentsAccountant(lam=0.1)
    for chunk in gaps.split(37):
        several.accumulate(chunk)
    assert several.queries == one.queries == 500
    assert torch.allclose(several.log_moments, one.log_moments, rtol=1e-12, atol=0)
    assert several.epsilon() == pytest.approx(one.epsilon(), rel=1e-12)

    import json

    state = json.loads(json.dumps(one.state_dict()))  # plain data, survives a JSON checkpoint
    resumed = PateMomentsAccountant(lam=0.1)
    resumed.load_state_dict(state)
    assert resumed.queries == 500 and torch.equal(resumed.log_moments, one.log_moments)
    assert resumed.epsilon() == one.epsilon() and resumed.best_order() == one.best_order()
    resumed.accumulate(gaps[:10])
    one.accumulate(gaps[:10])
    assert torch.equal(resumed.log_moments, one.log_moments) and resumed.queries == 510
    with pytest.raises(ValueError, match="lam"):
        PateMomentsAccountant(lam=0.2).load_state_dict(state)


def test_data_independent_branch_matches_dp_accounting():
    """Against Google's ``dp-accounting`` (an independent, maintained accountant).

    The exact correspondence: each answer is pure 2*lambda-DP, hence rho-zCDP with
    rho = (2 lambda)^2 / 2 = 2 lambda^2 (Bun & Steinke 2016, Prop. 3.3), i.e. RDP of order
    a = l+1 equal to rho * a; a log moment is alpha(l) = l * RDP(l+1) = 2 lambda^2 l (l+1),
    which is PATE Thm 2's data-independent bound. So T queries with no data-dependent
    saving (gap 0) must equal ``SelfComposedDpEvent(ZCDpEvent(rho), T)`` in an
    ``RdpAccountant``, order by order. dp-accounting turns RDP into epsilon with the
    improved conversion (Canonne-Kamath-Steinke 2020 / Asoodeh et al. 2020): at order a,
    eps = RDP + log1p(-1/a) - log(delta * a) / (a - 1), whereas ours is Abadi's
    (alpha(l) + log(1/delta)) / l = RDP + log(1/delta) / (a - 1); we compare at each single
    order with that known difference added, to 1e-9 relative (float64 rounding only).
    The comparison stops at l = 19 = 1/lambda - 1: beyond it our pure-DP cap 2 lambda l is
    smaller than the zCDP moment (checked to be no larger than dp-accounting's value).
    """
    dp_accounting = pytest.importorskip(
        "dp_accounting", reason="dp-accounting (test extra) is not installed in this environment"
    )
    from dp_accounting import dp_event
    from dp_accounting.rdp import RdpAccountant

    lam, delta = 0.05, 1e-5
    for queries in (29, 1000):
        ours = PateMomentsAccountant(lam=lam, delta=delta, max_order=32)
        ours.accumulate(torch.zeros(queries, dtype=torch.long))
        event = dp_event.SelfComposedDpEvent(dp_event.ZCDpEvent(rho=2 * lam * lam), queries)
        for l in range(1, 33):
            a = l + 1
            theirs = RdpAccountant(orders=[a]).compose(event).get_epsilon(delta)
            ours_converted = (ours.log_moments[l - 1].item() + math.log(1 / delta)) / l
            ours_converted += math.log1p(-1 / a) - math.log(a) / (a - 1)
            if l <= 19:
                assert ours_converted == pytest.approx(theirs, rel=1e-9), (queries, l)
            else:
                assert ours_converted <= theirs + 1e-9, (queries, l)
        best = RdpAccountant(orders=list(range(2, 21))).compose(event).get_epsilon(delta)
        assert best <= ours.epsilon()  # the improved conversion is never looser


# ----------------------------------------------------------------------------- voting


def test_teacher_votes_hard_counts():
    probs = torch.tensor([[0.9, 0.2, 0.5], [0.7, 0.6, 0.4], [0.1, 0.8, 0.51], [0.6, 0.3, 0.2]])  # [T=4, B=3]
    votes = teacher_votes(probs)
    # column b: count of p <= 0.5 (class 0) and p > 0.5 (class 1)
    assert votes.tolist() == [[1, 3], [2, 2], [3, 1]]
    scores = torch.tensor([[[0.1, 0.7, 0.2]], [[0.5, 0.3, 0.2]], [[0.0, 0.9, 0.1]]])  # [T=3, B=1, C=3]
    assert teacher_votes(scores).tolist() == [[1, 2, 0]]
    ids = torch.tensor([[2, 0], [2, 1], [0, 1]])
    assert teacher_votes(ids, num_classes=3).tolist() == [[1, 0, 2], [1, 2, 0]]
    assert teacher_votes(torch.rand(7, 5)).sum(dim=1).tolist() == [7] * 5


def test_split_teacher_partitions_disjoint_and_seeded():
    parts = split_teacher_partitions(103, 4, torch.Generator().manual_seed(0))
    assert sorted(len(p) for p in parts) == [25, 26, 26, 26]
    assert torch.cat(parts).sort().values.tolist() == list(range(103))  # disjoint and covering
    again = split_teacher_partitions(103, 4, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(parts, again))
    other = split_teacher_partitions(103, 4, torch.Generator().manual_seed(1))
    assert not all(torch.equal(a, b) for a, b in zip(parts, other))
    with pytest.raises(ValueError):
        split_teacher_partitions(3, 4, torch.Generator())


def test_noisy_argmax_tiny_noise_is_plurality():
    votes = torch.randint(0, 20, (1000, 3), generator=torch.Generator().manual_seed(0))
    plurality = votes.argmax(dim=1)
    unique = (votes == votes.max(dim=1, keepdim=True).values).sum(dim=1) == 1
    labels, gaps = noisy_argmax(votes, lam=1e6, generator=torch.Generator().manual_seed(1))
    assert torch.equal(labels[unique], plurality[unique])
    top2 = votes.sort(dim=1, descending=True).values
    assert torch.equal(gaps, top2[:, 0] - top2[:, 1])


def test_noisy_argmax_flip_rate_matches_closed_form():
    """Two classes, n0 = n1 + gap: the label flips iff V1 - V0 > gap. For V0, V1 iid Lap(b)
    the difference Z has density (1/4b)(1 + |z|/b) e^{-|z|/b}, so
    Pr[Z > g] = int_g^inf (1/4b)(1 + z/b) e^{-z/b} dz = (2 + g/b) e^{-g/b} / 4.
    With b = 1/lambda = 2 and g = 2: 3 / (4e) = 0.27591. 200,000 draws, 4 standard errors."""
    lam, gap, n = 0.5, 2, 200_000
    b = 1 / lam
    p_flip = (2 + gap / b) * math.exp(-gap / b) / 4
    votes = torch.tensor([[3 + gap, 3]]).expand(n, 2).contiguous()
    labels, gaps = noisy_argmax(votes, lam=lam, generator=torch.Generator().manual_seed(1234))
    assert (gaps == gap).all()
    rate = labels.double().mean().item()
    se = math.sqrt(p_flip * (1 - p_flip) / n)
    assert abs(rate - p_flip) < 4 * se, (rate, p_flip, se)
    # The same number bounds what the accountant calls q, and is exact for two classes.
    assert p_flip == pytest.approx((2 + lam * gap) / (4 * math.exp(lam * gap)))


def test_noisy_labels_depend_on_the_noise():
    """Tie-heavy votes: the labels are the noise's choice, so seeds must matter (the official
    FKGE code's student loss ignores the labels altogether, hetro_AGCN_mul_dataset_pate.py)."""
    votes = torch.tensor([[2, 2]] * 500 + [[3, 1]] * 500)
    a, _ = noisy_argmax(votes, lam=0.05, generator=torch.Generator().manual_seed(0))
    b, _ = noisy_argmax(votes, lam=0.05, generator=torch.Generator().manual_seed(1))
    a2, _ = noisy_argmax(votes, lam=0.05, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a, a2)  # reproducible from the generator
    assert (a != b).sum().item() > 300  # about half of 1000 differ: the labels follow the noise
    assert 0.4 < a[:500].double().mean().item() < 0.6


def test_a_huge_lambda_costs_the_pure_bound_without_overflow():
    acc = PateMomentsAccountant(lam=1e6, max_order=4)
    terms = acc.per_query(torch.tensor([0, 4]))
    expected = torch.tensor([2e6 * l for l in range(1, 5)], dtype=torch.float64)
    assert torch.equal(terms, expected.expand(2, 4))
