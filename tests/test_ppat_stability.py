"""PPAT started at the answer must stay there (issue 35, finding 1).

The task is the clusters task of scripts/benchmarks/bench_ppat_synthetic.py at a smaller size
(d = 8, m = 256, 10 epochs; about 3 s on one thread): a zero-mean, anisotropic, clustered
``X`` and ``Y = X R^T + 0.05 noise``. A game whose equilibrium is ``W = R`` should not
push ``W`` away from ``R``; the plain GAN of the bench stays within 0.03 of it.
"""

from __future__ import annotations

import pytest
import torch

from lightning_fedkg.federated.channel import Channel
from lightning_fedkg.methods.fkge.ppat import PPATClient, PPATHost, run_ppat


def clusters_task(seed: int, m: int = 256, d: int = 8, k: int = 6):
    """``(X, Y, R)`` drawn as the bench's ``clusters_task`` draws them."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g) * 2.0
    x = centres[torch.randint(0, k, (m,), generator=g)] + 0.3 * torch.randn(m, d, generator=g)
    x = (x - x.mean(0)) * torch.linspace(0.5, 1.5, d)
    q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
    rot = (q * torch.sign(torch.diagonal(r))).float()
    return x, x @ rot.T + 0.05 * torch.randn(m, d, generator=g), rot


def drift_from_truth(seed: int, epochs: int = 10, client_kw: dict | None = None, host_kw: dict | None = None) -> float:
    """``‖W − R‖/‖R‖`` after ``epochs`` of PPAT started at ``W = R`` (noiseless labels)."""
    x, y, rot = clusters_task(seed)
    client = PPATClient(x, **{**dict(lr=0.01, momentum=0.9, orthogonalize=0.01, seed=seed + 100), **(client_kw or {})})
    with torch.no_grad():
        client.w.copy_(rot)
    host_kw = {**dict(hidden=64, lam=100.0, seed=seed, noise_seed=seed, smoothing=0.1, dropout=0.1), **(host_kw or {})}
    host = PPATHost(y, **host_kw)
    with torch.random.fork_rng(devices=[]):  # dropout draws from the global generator
        torch.manual_seed(seed)
        run_ppat(client, host, Channel(), epochs=epochs, seed=seed)
    return float((client.w.detach() - rot).norm() / rot.norm())


def test_ppat_started_at_the_rotation_stays_within_5_percent(one_thread):
    """With the generator's SGD at lr 0.005 without momentum (effective step 0.005, 20x below
    the former recipe's) the game holds W at R: measured 0.025, 0.014, 0.014, 0.014, 0.020
    for seeds 0-4 (lr 0.01 without momentum: 0.050, 0.027, 0.027; the teachers stay fooled
    about half the time). The bench at full size: docs/results/fkge.md."""
    assert drift_from_truth(0, client_kw={"lr": 0.005, "momentum": 0.0}) <= 0.05


def test_the_papers_generator_momentum_pushes_w_off_the_rotation(one_thread):
    """The control of the test above, finding 1 of issue 35: the same game with the
    generator's momentum 0.9 (effective step 0.1, the bench's former recipe) leaves R,
    measured 0.455, 0.477, 0.601, 0.212, 0.574 for seeds 0-4. Neither more rows per teacher
    (one teacher: 0.52, 0.43, 0.56) nor PATE-GAN's teachers that see every fake (0.67, 0.73,
    0.73) hold it; momentum 0 does, and so does lr 0.001 with momentum 0.9 (0.055, 0.024,
    0.029): the cause is the generator's effective step against the noise of the student's
    gradient."""
    assert drift_from_truth(0) > 0.3


# ----------------------------------------------------------------------------- restarts


def test_restart_starts_alternate_between_the_two_components_of_o_d():
    from lightning_fedkg.methods.fkge.restarts import restart_start

    dets = [float(torch.linalg.det(restart_start(6, k, seed=3))) for k in range(6)]
    for k in range(0, 6, 2):
        assert dets[k] == pytest.approx(-dets[k + 1], abs=1e-5) and abs(dets[k]) == pytest.approx(1.0, abs=1e-5)
        w, v = restart_start(6, k, 3), restart_start(6, k + 1, 3)
        assert torch.equal(w[:, 1:], v[:, 1:]) and torch.equal(w[:, 0], -v[:, 0])
    assert restart_start(6, 2, 3).sub(restart_start(6, 0, 3)).abs().max() > 0.1  # a new draw per pair


def test_pair_free_fit_ignores_row_order_and_is_zero_only_at_the_same_set():
    from lightning_fedkg.methods.fkge.restarts import pair_free_fit

    x, y, rot = clusters_task(0, m=64)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    assert pair_free_fit(y[perm], y) == pytest.approx(0.0, abs=1e-8)
    assert pair_free_fit((x @ rot.T)[perm], y) == pytest.approx(pair_free_fit(x @ rot.T, y), rel=1e-5)
    # brute force: the Chamfer sum of squared nearest distances
    t = x  # the untranslated rows
    fwd = sum(min(float((a - b).square().sum()) for b in y) for a in t) / 64
    back = sum(min(float((a - b).square().sum()) for a in t) for b in y) / 64
    assert pair_free_fit(t, y) == pytest.approx(fwd + back, rel=1e-4)
    assert pair_free_fit(x @ rot.T, y) < 0.05 < pair_free_fit(t, y)


def test_restarts_choose_the_best_fit_and_charge_one_accountant():
    from lightning_fedkg.privacy.mechanisms.pate_moments import PateMomentsAccountant
    from lightning_fedkg.methods.fkge.restarts import pair_free_fit, run_ppat_restarts

    x, y, _ = clusters_task(0, m=64)
    out = run_ppat_restarts(x, y, 3, Channel(), client_kw=dict(lr=0.001, momentum=0.9, orthogonalize=0.01),
                            host_kw=dict(hidden=8, lam=0.5, seed=0, noise_seed=0), epochs=1, seed=0)
    assert out["chosen"] == min(range(3), key=out["fits"].__getitem__)
    assert pair_free_fit(out["client"].translate(x), y) == pytest.approx(out["fits"][out["chosen"]])
    # three runs of 64 labels each, all on one accountant: its epsilon after 64, 128, 192 worst-case
    # labels bounds each restart's, and the epsilons only rise
    eps = out["epsilons"]
    assert eps == sorted(eps) and eps[0] < eps[2]
    worst = PateMomentsAccountant(0.5)
    worst.accumulate(torch.zeros(192, dtype=torch.long))
    assert eps[2] <= worst.epsilon() + 1e-9
