"""One party's privacy ledger: every mechanism it runs on its data, composed into one epsilon.

A party of a federation can release information about its private rows through several
channels. The ledger adds the log moments of each accounted mechanism order by order (log
moments, like Renyi DP, add under adaptive composition; Abadi et al., CCS 2016, Thm 2.1)
and turns the sum into one ``(epsilon, delta)``:

* ``pate`` -- PATE labels answered as a PPAT host
  (:class:`~lightning_fedkg.privacy.PateMomentsAccountant`, data-dependent);
* ``gaussian`` -- Poisson-subsampled Gaussian releases
  (:func:`~lightning_fedkg.privacy.gaussian.sampled_gaussian_log_moments`): the supervised
  DP alignment as a host, noised translated rows as a client.

Releases that no mechanism protects are not hidden: :meth:`declare` counts them by kind
(e.g. un-noised translated rows sent as a client, the accept/reject bit a broadcast
reveals), and :meth:`summary` reports them beside epsilon, so a reader sees what the
epsilon does *not* cover.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .accountant import PateMomentsAccountant
from .gaussian import epsilon_from_log_moments

__all__ = ["PrivacyLedger"]


class PrivacyLedger:
    """Log moments of every accounted release of one party, plus counts of unaccounted ones.

    Args:
        lam: PATE's noise parameter (the ``pate`` component's).
        delta: the ledger's ``delta``.
        max_order: moment orders ``l = 1 .. max_order`` (Renyi orders ``2 .. max_order + 1``).
    """

    def __init__(self, lam: float, delta: float = 1e-5, max_order: int = 32):
        self.delta = float(delta)
        self.max_order = int(max_order)
        self.pate = PateMomentsAccountant(lam, delta=delta, max_order=max_order)
        self.gaussian = torch.zeros(self.max_order, dtype=torch.float64)
        self.gaussian_releases = 0
        self.unprotected: dict[str, int] = {}

    @property
    def log_moments(self) -> Tensor:
        return self.pate.log_moments + self.gaussian

    def epsilon(self) -> float:
        """The party's ``epsilon`` at ``delta`` over every accounted release so far (0 before
        the first: the tail bound alone would report ``log(1/delta) / max_order``)."""
        if not (self.pate.queries or self.gaussian_releases):
            return 0.0
        return epsilon_from_log_moments(self.log_moments, self.delta)

    def epsilon_after_pate(self, queries: int) -> float:
        """``epsilon`` if ``queries`` more PATE labels were charged at the worst per-query cost."""
        worst = self.pate.per_query(torch.zeros(1)).squeeze(0) * queries
        return epsilon_from_log_moments(self.log_moments + worst, self.delta)

    def epsilon_after_gaussian(self, log_moments: Tensor) -> float:
        """``epsilon`` if a release with these log moments were added."""
        return epsilon_from_log_moments(self.log_moments + log_moments, self.delta)

    def charge_gaussian(self, log_moments: Tensor, releases: int = 1) -> None:
        """Add a Gaussian release's log moments (``releases`` counts what was charged)."""
        if log_moments.numel() != self.max_order:
            raise ValueError(f"expected {self.max_order} orders, got {log_moments.numel()}")
        self.gaussian = self.gaussian + log_moments.to(torch.float64)
        self.gaussian_releases += int(releases)

    def declare(self, kind: str, count: int = 1) -> None:
        """Record ``count`` releases of ``kind`` that no mechanism protects."""
        self.unprotected[kind] = self.unprotected.get(kind, 0) + int(count)

    def summary(self) -> dict:
        """``{"epsilon", "delta", "epsilon_pate", "epsilon_gaussian", "pate_queries",
        "gaussian_releases", "unprotected"}`` (per-mechanism epsilons alone, for reading;
        ``epsilon`` is the composed total, not their sum)."""
        eps = epsilon_from_log_moments
        return {"epsilon": self.epsilon(), "delta": self.delta,
                "epsilon_pate": eps(self.pate.log_moments, self.delta) if self.pate.queries else 0.0,
                "epsilon_gaussian": eps(self.gaussian, self.delta) if self.gaussian_releases else 0.0,
                "pate_queries": self.pate.queries, "gaussian_releases": self.gaussian_releases,
                "unprotected": dict(sorted(self.unprotected.items()))}

    def state_dict(self) -> dict:
        return {"pate": self.pate.state_dict(),
                "gaussian": [x if math.isfinite(x) else "inf" for x in self.gaussian.tolist()],
                "gaussian_releases": self.gaussian_releases, "unprotected": dict(self.unprotected)}

    def load_state_dict(self, state: dict) -> None:
        self.pate.load_state_dict(state["pate"])
        self.gaussian = torch.tensor([math.inf if x == "inf" else x for x in state["gaussian"]], dtype=torch.float64)
        self.gaussian_releases = int(state["gaussian_releases"])
        self.unprotected = dict(state["unprotected"])
