"""Supervised DP alignment: the translation ``W`` fitted on the known aligned pairs, under DP.

An alternative to PPAT's GAN (beyond the FKGE paper). The two parties of a handshake
already know which rows describe the same item (that is how PPAT pairs its batches), so the
host can supervise the client's translation directly instead of through a discriminator.

Loss: over orthogonal maps ``V``, maximise ``sum_i <V z_i, y_i>`` (equivalently minimise
``sum_i ||V z_i - y_i||^2``) on unit rows: ``y_i`` the host's, ``z_i = W0 x_i`` the
client's rows under its secret random orthogonal start ``W0``. Its optimum is orthogonal
Procrustes (Schoenemann 1966): ``V = U Vh`` for ``U S Vh = svd(M)``, with the cross-
covariance ``M = sum_i y_i z_i^T`` (``d x d``) the only thing it needs from the host. One
handshake:

1. client -> host, ``align_rows``: ``Z`` (``[m, d]``, unit rows). The host learns ``X``
   only up to the unknown ``W0``: the same as from the translated rows it receives after
   any alignment (PPAT's included), i.e. ``X``'s Gram matrix of directions.
2. host -> client, ``dp_crosscov``: ``M~ = Y^T Z + N(0, sigma^2)`` per entry, the Gaussian
   mechanism with ``sigma`` calibrated so that the release costs ``dp_epsilon`` at ``delta``
   (:func:`~lightning_fedkg.privacy.calibrate_gaussian_noise`) under the neighbouring
   relation ``dp_neighbours``, charged to the host's
   :class:`~lightning_fedkg.privacy.PrivacyLedger`. The host normalises both sides itself,
   so nothing the client sends can raise the sensitivity: *replacing* one of the host's
   aligned rows ``y_j`` changes ``M`` by ``(y_j - y_j') z_j^T``, of Frobenius norm up to 2
   (exactly 2 for ``y_j' = -y_j``): ``replace``, the default, calibrates at sensitivity 2;
   *adding or removing* one aligned pair changes it by ``y_j z_j^T``, norm exactly 1:
   ``add_remove`` calibrates at sensitivity 1 (half the noise). Either way the ledger also
   keeps the release's cost under add/remove, reported beside the configured one.
3. The client sets ``W = V W0`` with ``V`` = Procrustes on ``M~`` and sends its translated
   rows as after PPAT.

Why one release and not DP-SGD's many subsampled steps: the loss is linear in ``V``'s
data term, so every gradient step is a function of ``M``, and for the Gaussian mechanism
``T`` releases at noise ``sigma`` carry exactly the information of one at ``sigma /
sqrt(T)`` (Renyi DP composes exactly): iterating costs messages and buys nothing. The noise
does not grow with the number of aligned rows ``m`` while the signal does (``M``'s
singular values are about ``m/d`` for well-spread rows), so the alignment improves with
``m``: weak on UMLS's ~130 shared entities at ``d = 64``, good at FB15k-237 scale
(``tests/test_fkge_supervised.py`` and ``docs/BENCHMARKS.md``).

``dp_epsilon: null`` releases ``M`` exactly (not private; the host declares it): the exact
supervised alignment, the upper bound for any translation learnt from these pairs.

What this protects and what it does not. Threat model: the client is curious (it sees
``M~`` and everything after it) and may send any rows it likes; the host runs the
mechanism honestly. The unit is **one aligned entity's row of the host** (its direction;
norms are never used): whether the host's row of that entity is this one or any other,
the client's view changes by at most ``epsilon`` (``replace``), or whether the pair is
in the alignment at all (``add_remove``). It is *not* a bound on what the host's
knowledge graph reveals at the level of its triples: one triple of the host's training
data can move every row of its embedding (training couples all rows), so changing one
triple may change all ``m`` aligned rows at once, and group privacy over ``m`` rows gives
no useful bound. The client's rows are not protected by it either: ``Z`` and the later
translated rows are declared on the client's ledger.
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
