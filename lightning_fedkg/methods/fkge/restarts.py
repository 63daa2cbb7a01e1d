"""PPAT restarts in both components of O(d), chosen by a fit the host scores without pairs.

A generator kept near-orthogonal by small steps cannot cross from det +1 to det -1, so the
starts come in pairs ``(Q, Q F)`` with ``F`` flipping one axis. After each restart the
client sends ``G(X)`` once more (what the host receives every epoch anyway); the host
scores it with :func:`pair_free_fit`, which ignores the row ids, and no teacher is asked,
so scoring charges no PATE label. What each restart costs is its PPAT run's labels, all
charged to one accountant; the index of the chosen restart is a function of ``Y`` that no
mechanism covers (see docs/methods/fkge.md).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.privacy.mechanisms.pate_moments import PateMomentsAccountant
from .ppat import PPATClient, PPATHost, initial_generator, run_ppat

__all__ = ["pair_free_fit", "restart_start", "run_ppat_restarts"]


def pair_free_fit(translated: Tensor, y: Tensor) -> float:
    """Chamfer fit of two point sets (lower is better): the mean squared distance from each
    translated row to its nearest row of ``y``, plus the same from each ``y`` row to its
    nearest translated row. Row order is ignored, so no aligned pair is used."""
    dist = torch.cdist(translated.float(), y.float(), compute_mode="donot_use_mm_for_euclid_dist").square()
    return float(dist.min(dim=1).values.mean() + dist.min(dim=0).values.mean())


def restart_start(d: int, k: int, seed: int) -> Tensor:
    """Start ``k``: a Haar-random orthogonal ``Q`` (drawn from ``seed + k // 2``) for even
    ``k`` and ``Q`` with its first column negated for odd ``k`` (the other determinant)."""
    w = initial_generator(d, "orthogonal", seed + k // 2)
    if k % 2:
        w[:, 0] = -w[:, 0]
    return w


def run_ppat_restarts(x: Tensor, y: Tensor, starts: int, channel, client_kw: dict, host_kw: dict,
                      epochs: int = 1, batch_size: int = 32, seed: int = 0) -> dict:
    """PPAT from ``starts`` starts (:func:`restart_start`); returns the chosen client and
    ``{"chosen", "fits", "epsilons"}`` where ``epsilons[k]`` is the host's epsilon after
    restart ``k`` (one accountant over all restarts; ``host_kw["lam"]`` sets its noise).

    Restart ``k`` uses a fresh host game (teachers, student; ``host_kw["seed"] + k``, and
    ``host_kw["noise_seed"] + k`` when a noise seed is given) and a fresh client whose ``W``
    starts at :func:`restart_start`."""
    if starts < 1:
        raise ValueError(f"starts must be >= 1, got {starts}")
    lam = float(host_kw.get("lam", 0.05))
    accountant = PateMomentsAccountant(lam, delta=host_kw.get("delta", 1e-5),
                                       max_order=host_kw.get("max_order", 32))
    clients, fits, epsilons = [], [], []
    for k in range(starts):
        client = PPATClient(x, **client_kw)
        with torch.no_grad():
            client.w.copy_(restart_start(x.shape[1], k, seed))
        kw = {**host_kw, "seed": host_kw.get("seed", 0) + k, "accountant": accountant}
        if kw.get("noise_seed") is not None:
            kw["noise_seed"] = kw["noise_seed"] + k
        host = PPATHost(y, **kw)
        run_ppat(client, host, channel, epochs=epochs, batch_size=batch_size, seed=seed + k)
        fits.append(pair_free_fit(client.translate(x), y))  # the host's score of one more G(X)
        epsilons.append(host.epsilon())
        clients.append(client)
    chosen = min(range(starts), key=fits.__getitem__)
    return {"client": clients[chosen], "chosen": chosen, "fits": fits, "epsilons": epsilons}
