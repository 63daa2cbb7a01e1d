"""Supervised DP alignment: the translation ``W`` fitted on the known aligned pairs, under DP.

Beyond the FKGE paper. The client sends its aligned rows' directions under a secret random
rotation ``W0``; the host answers once with their cross-covariance with its own rows plus
Gaussian noise calibrated to ``dp_epsilon`` at ``delta`` under ``dp_neighbours``, charged
to its :class:`~lightning_fedkg.methods.fkge.ledger.PrivacyLedger`; the client sets ``W = V W0`` with
``V`` the orthogonal Procrustes solution. ``dp_epsilon: null`` releases the exact
cross-covariance (not private). The unit protected is one aligned entity's row of the
host, not a triple. Derivation and threat model: docs/methods/fkge.md.
"""

from __future__ import annotations

import secrets
from functools import lru_cache

import torch
from torch import Tensor

from lightning_fedkg.federated.message import Message

from .gaussian import calibrate_gaussian_noise, sampled_gaussian_log_moments

__all__ = ["ROWS", "CROSSCOV", "SENSITIVITY", "AlignmentHost", "procrustes", "release_cost", "release_moments",
           "unit_rows"]

#: Wire names: the client's rotated unit rows (client -> host), the noisy cross-covariance (host -> client).
ROWS, CROSSCOV = "align_rows", "dp_crosscov"

#: ``M``'s Frobenius sensitivity under each neighbouring relation on the host's aligned rows.
SENSITIVITY = {"replace": 2.0, "add_remove": 1.0}


def unit_rows(rows: Tensor) -> Tensor:
    """Rows scaled to unit length (zero rows stay zero)."""
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-12)


def release_moments(sigma: float, neighbours: str, max_order: int = 32) -> Tensor:
    """Log moments of one release of ``M`` with noise std ``sigma`` under ``neighbours``:
    the Gaussian at noise multiplier ``sigma / sensitivity``."""
    if neighbours not in SENSITIVITY:
        raise ValueError(f"neighbours must be one of {sorted(SENSITIVITY)}, got {neighbours!r}")
    return sampled_gaussian_log_moments(1.0, sigma / SENSITIVITY[neighbours], max_order)


@lru_cache(maxsize=None)
def release_cost(epsilon: float | None, delta: float, max_order: int,
                 neighbours: str = "replace") -> tuple[float, Tensor, Tensor]:
    """``(sigma, log moments under neighbours, log moments under add_remove)`` of one release
    calibrated to cost ``(epsilon, delta)`` under ``neighbours``; ``sigma`` is the noise's
    standard deviation per entry. ``epsilon`` None: no noise, ``sigma = 0``, infinite
    moments. Cached: every handshake of a run asks for the same one."""
    if epsilon is None:
        sigma = 0.0
    else:
        sigma = SENSITIVITY[neighbours] * calibrate_gaussian_noise(epsilon, delta, max_order=max_order)
    return sigma, release_moments(sigma, neighbours, max_order), release_moments(sigma, "add_remove", max_order)


def procrustes(crosscov: Tensor) -> Tensor:
    """The orthogonal ``V`` maximising ``trace(V^T M)`` = ``sum_i <V z_i, y_i>`` for
    ``M = sum_i y_i z_i^T``: ``U Vh`` of ``svd(M)``."""
    u, _, vh = torch.linalg.svd(crosscov.double())
    return (u @ vh).to(crosscov.dtype)


class AlignmentHost:
    """The host's side: its aligned rows and the DP release of the cross-covariance.

    Args:
        y: ``[m, d]``, the host's rows of the aligned items (only their directions are used).
        epsilon: what the release costs at ``delta`` under ``neighbours``; ``None`` = no
            noise (not private).
        delta: the ledger's ``delta``.
        max_order: the ledger's orders.
        noise_seed: ``None`` (default) draws the noise from the operating system's secure
            randomness; a seed only for reproducible tests (the noise is then not secret).
        neighbours: ``replace`` (one aligned row replaced, sensitivity 2) or ``add_remove``
            (one aligned pair added or removed, sensitivity 1).

    ``log_moments`` is the release's cost under ``neighbours``, ``log_moments_add_remove``
    under add/remove (equal when ``neighbours`` is ``add_remove``).
    """

    def __init__(self, y: Tensor, epsilon: float | None, delta: float = 1e-5, max_order: int = 32,
                 noise_seed: int | None = None, neighbours: str = "replace"):
        if y.dim() != 2:
            raise ValueError(f"Y must be [m, d], got shape {tuple(y.shape)}")
        self.y = unit_rows(y.detach().float())
        if neighbours not in SENSITIVITY:
            raise ValueError(f"neighbours must be one of {sorted(SENSITIVITY)}, got {neighbours!r}")
        self.epsilon, self.neighbours = epsilon, neighbours
        self.sigma, self.log_moments, self.log_moments_add_remove = release_cost(epsilon, delta, max_order, neighbours)
        self.generator = torch.Generator().manual_seed(secrets.randbits(63) if noise_seed is None else int(noise_seed))

    def on_rows(self, message: Message) -> Message:
        """``M~ = Y^T unit(Z) + N(0, sigma^2)`` for the client's rows ``Z``."""
        if set(message.arrays) != {ROWS}:
            raise ValueError(f"expected only {ROWS!r}, got {sorted(message.arrays)}")
        z = message.arrays[ROWS].float()
        if z.shape != self.y.shape:
            raise ValueError(f"{ROWS} of shape {tuple(z.shape)} for {tuple(self.y.shape)} aligned rows")
        d = self.y.shape[1]
        crosscov = self.y.T @ unit_rows(z) + self.sigma * torch.randn(d, d, generator=self.generator)
        return Message(arrays={CROSSCOV: crosscov}, config={"sigma": self.sigma})
