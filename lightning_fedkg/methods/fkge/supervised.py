"""Supervised DP alignment: the translation ``W`` fitted on the known aligned pairs, under DP.

Beyond the FKGE paper. The client sends its aligned rows' directions under a secret random
rotation ``W0``, optionally whitened by its own covariance (:func:`precondition`); the host
answers once with their cross-covariance with its own rows plus Gaussian noise calibrated
exactly (:func:`~.gaussian.gaussian_mu`) to ``dp_epsilon`` at ``delta`` under
``dp_neighbours``, charged to its :class:`~lightning_fedkg.methods.fkge.ledger.PrivacyLedger`;
the client undoes the whitening from its own rows and sets ``W = V W0`` (:func:`decode`).
``dp_epsilon: null`` releases the exact cross-covariance (not private). The unit protected
is one aligned entity's row of the host, not a triple. Whitening spreads the singular values
of the client's cross-matrix ``B``, which set the first-order error
(:func:`predicted_error`); it fixes near-isometric spaces and hurt on UMLS, so it is off by
default. Derivation, measurements and threat model: docs/methods/fkge.md.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from lightning_fedkg.federated.message import Message

from lightning_fedkg.privacy.mechanisms.gaussian import gaussian_mu, sampled_gaussian_log_moments

__all__ = ["ROWS", "CROSSCOV", "SENSITIVITY", "AlignmentHost", "ReleaseCost", "procrustes", "release_cost",
           "release_moments", "unit_rows", "precondition", "whitening_power", "predicted_error", "decode",
           "POWERS"]

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


@dataclass(frozen=True)
class ReleaseCost:
    """What one release of ``M`` costs: its noise std ``sigma`` per entry, ``mu`` (sensitivity
    / ``sigma``: the release is ``mu``-GDP, composed exactly by the ledger) under the
    configured relation and under add/remove, and the log moments of each (for composing
    with PATE labels). ``sigma = 0``: exact, ``mu`` and the moments infinite."""

    sigma: float
    mu: float
    mu_add_remove: float
    log_moments: Tensor
    log_moments_add_remove: Tensor


@lru_cache(maxsize=None)
def release_cost(epsilon: float | None, delta: float, max_order: int, neighbours: str = "replace") -> ReleaseCost:
    """One release calibrated to cost exactly ``(epsilon, delta)`` under ``neighbours``: the
    largest noise-free ``mu`` (:func:`~.gaussian.gaussian_mu`) gives ``sigma = sensitivity /
    mu``. ``epsilon`` None: no noise. Cached: every handshake of a run asks for the same one."""
    if neighbours not in SENSITIVITY:
        raise ValueError(f"neighbours must be one of {sorted(SENSITIVITY)}, got {neighbours!r}")
    if epsilon is None:
        sigma, mu, mu_ar = 0.0, math.inf, math.inf
    else:
        mu = gaussian_mu(epsilon, delta)
        sigma = SENSITIVITY[neighbours] / mu
        mu_ar = SENSITIVITY["add_remove"] / sigma
    return ReleaseCost(sigma, mu, mu_ar, release_moments(sigma, neighbours, max_order),
                       release_moments(sigma, "add_remove", max_order))


def procrustes(crosscov: Tensor) -> Tensor:
    """The orthogonal ``V`` maximising ``trace(V^T M)`` = ``sum_i <V z_i, y_i>`` for
    ``M = sum_i y_i z_i^T``: ``U Vh`` of ``svd(M)``."""
    u, _, vh = torch.linalg.svd(crosscov.double())
    return (u @ vh).to(crosscov.dtype)


#: The whitening powers :func:`whitening_power` chooses among (0: the rows as they are).
POWERS = tuple(i / 20 for i in range(21))


def precondition(z: Tensor, power: float) -> tuple[Tensor, Tensor]:
    """The rows the client sends and the matrix it decodes with: ``(U, B)``.

    ``U = unit(Z C^-power)`` for ``C = Z^T Z`` (``Z``: the client's unit rotated rows; power
    1/2 whitens them), and ``B = Z^T U``, so that the host's ``Y^T U = R B`` for rows related
    by ``y_i = R z_i``. The host normalises ``U`` again, so this cannot raise its sensitivity."""
    z = z.double()
    if power == 0:
        u = unit_rows(z)
    else:
        values, vectors = torch.linalg.eigh(z.T @ z)
        floor = values.max().clamp_min(1e-300) * 1e-12  # a rank-deficient C: no infinite weights
        u = unit_rows(z @ (vectors * values.clamp_min(floor).pow(-power)) @ vectors.T)
    return u.float(), (z.T @ u).float()


def predicted_error(b: Tensor, sigma: float, weighted: bool = True) -> float:
    """First-order ``|W - R| / |R|`` of :func:`decode` for ``M = R B + N(0, sigma^2)``.

    ``weighted`` (``polar(M B^T)``): ``sqrt(sigma^2 / d * sum_{i != j} 1/(s_i^2 + s_j^2))``;
    plain Procrustes (``polar(M)``, ``B`` symmetric): ``sqrt(2 sigma^2 / d * sum_{i != j}
    1/(s_i + s_j)^2)``; ``s`` the singular values of ``B``."""
    s = torch.linalg.svdvals(b.double())
    d = s.numel()
    pair = (s[:, None] ** 2 + s[None, :] ** 2) if weighted else (s[:, None] + s[None, :]) ** 2 / 2
    off = ~torch.eye(d, dtype=torch.bool)
    return float(torch.sqrt(sigma**2 / d * (1 / pair.clamp_min(1e-300))[off].sum()))


def whitening_power(z: Tensor, powers: tuple[float, ...] = POWERS) -> float:
    """The power of :func:`precondition` with the smallest predicted error, from the client's
    rows alone (``sigma`` scales every candidate's error alike, so it is not needed). Power 0
    decodes by plain Procrustes, the others by the weighted form."""
    costs = [predicted_error(precondition(z, p)[1], 1.0, weighted=p > 0) for p in powers]
    return powers[min(range(len(powers)), key=costs.__getitem__)]


def decode(crosscov: Tensor, b: Tensor, power: float) -> Tensor:
    """``V`` from the host's noisy ``M``: ``polar(M B^T)`` (the maximum-likelihood orthogonal
    ``V`` for ``M = V B + N``), or plain Procrustes ``polar(M)`` for power 0."""
    return procrustes(crosscov if power == 0 else crosscov.double() @ b.double().T).to(crosscov.dtype)


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

    ``cost`` is what the release costs (:class:`ReleaseCost`); ``log_moments`` under
    ``neighbours``, ``log_moments_add_remove`` under add/remove (equal when ``neighbours``
    is ``add_remove``).
    """

    def __init__(self, y: Tensor, epsilon: float | None, delta: float = 1e-5, max_order: int = 32,
                 noise_seed: int | None = None, neighbours: str = "replace"):
        if y.dim() != 2:
            raise ValueError(f"Y must be [m, d], got shape {tuple(y.shape)}")
        self.y = unit_rows(y.detach().float())
        if neighbours not in SENSITIVITY:
            raise ValueError(f"neighbours must be one of {sorted(SENSITIVITY)}, got {neighbours!r}")
        self.epsilon, self.neighbours = epsilon, neighbours
        self.cost = release_cost(epsilon, delta, max_order, neighbours)
        self.sigma, self.log_moments, self.log_moments_add_remove = (self.cost.sigma, self.cost.log_moments,
                                                                     self.cost.log_moments_add_remove)
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
