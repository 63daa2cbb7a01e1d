"""PPAT started at the answer must stay there (issue 35, finding 1).

The task is the clusters task of scripts/bench_ppat_synthetic.py at a smaller size
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
    run_ppat(client, host, Channel(), epochs=epochs, seed=seed)
    return float((client.w.detach() - rot).norm() / rot.norm())


@pytest.mark.xfail(strict=True, reason="issue 35 finding 1: measured 0.508 on the game as it stands")
def test_ppat_started_at_the_rotation_stays_within_5_percent(one_thread):
    assert drift_from_truth(0) <= 0.05
