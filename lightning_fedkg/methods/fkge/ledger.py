"""One party's privacy ledger: every mechanism it runs on its data, composed into one epsilon.

Each accounted mechanism (``pate``: PATE labels as a PPAT host; ``gaussian``: the supervised
alignment's releases) is composed into one ``(epsilon, delta)`` under one neighbouring
relation, with the Gaussian releases' add/remove cost beside it. Gaussian releases alone are
composed exactly (Gaussian DP: :func:`~.gaussian.gaussian_epsilon`); with PATE labels
their log moments add order by order. PATE is charged at its data-independent bound, the
private guarantee; its data-dependent epsilon is reported beside, labelled as such (it is
not itself private).
:meth:`declare` counts releases no mechanism protects and :meth:`summary` reports them, and
what the epsilon does not cover (one triple can move every row). The unit is one aligned
entity's row. See docs/privacy.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lightning_fedkg.privacy.mechanisms.pate_moments import PateMomentsAccountant
from lightning_fedkg.privacy.mechanisms.gaussian import epsilon_from_log_moments, gaussian_epsilon

__all__ = ["PrivacyLedger", "NEIGHBOURS", "UNIT", "NOT_COVERED"]

NEIGHBOURS = ("replace", "add_remove")
UNIT = "one aligned entity's row"
NOT_COVERED = ("a party's knowledge graph at triple level: one triple can move every row of its embedding, "
               "so changing one triple may change every aligned row at once")


class PrivacyLedger:
    """Log moments of every accounted release of one party, plus counts of unaccounted ones.

    Args:
        lam: PATE's noise parameter (the ``pate`` component's).
        delta: the ledger's ``delta``.
        max_order: moment orders ``l = 1 .. max_order`` (Renyi orders ``2 .. max_order + 1``).
        neighbours: the relation ``gaussian`` charges are under (``replace`` or ``add_remove``).
    """

    def __init__(self, lam: float, delta: float = 1e-5, max_order: int = 32, neighbours: str = "replace"):
        if neighbours not in NEIGHBOURS:
            raise ValueError(f"neighbours must be one of {NEIGHBOURS}, got {neighbours!r}")
        self.neighbours = neighbours
        self.delta = float(delta)
        self.max_order = int(max_order)
        self.pate = PateMomentsAccountant(lam, delta=delta, max_order=max_order)
        self.gaussian = torch.zeros(self.max_order, dtype=torch.float64)
        self.gaussian_add_remove = torch.zeros(self.max_order, dtype=torch.float64)
        self.gaussian_releases = 0
        # sum of mu^2 of the Gaussian releases (mu = sensitivity / noise std), for exact
        # composition; None once a release was charged without its mu
        self.gaussian_mu2: float | None = 0.0
        self.gaussian_mu2_add_remove: float | None = 0.0
        self.unprotected: dict[str, int] = {}

    @property
    def log_moments(self) -> Tensor:
        """The private composition's log moments: PATE at its data-independent charge."""
        return self.pate.data_independent_log_moments() + self.gaussian

    def _epsilon(self, pate: Tensor, gaussian: Tensor, mu2: float | None, pate_queries: int,
                 releases: int | None = None) -> float:
        releases = self.gaussian_releases if releases is None else releases
        if not (pate_queries or releases):
            return 0.0
        if not pate_queries and mu2 is not None:  # Gaussian releases alone: exact
            return gaussian_epsilon(math.sqrt(mu2), self.delta)
        return epsilon_from_log_moments(pate + gaussian, self.delta)

    def accountant(self) -> str:
        """How :meth:`epsilon` composes: ``gaussian_exact``, ``rdp`` or ``none``."""
        if not (self.pate.queries or self.gaussian_releases):
            return "none"
        return "gaussian_exact" if not self.pate.queries and self.gaussian_mu2 is not None else "rdp"

    def epsilon(self) -> float:
        """The party's ``epsilon`` at ``delta`` over every accounted release so far, PATE at
        its data-independent bound (0 before the first: the tail bound alone would report
        ``log(1/delta) / max_order``)."""
        return self._epsilon(self.pate.data_independent_log_moments(), self.gaussian, self.gaussian_mu2,
                             self.pate.queries)

    def epsilon_data_dependent(self) -> float | None:
        """``epsilon`` with PATE's data-dependent bound (None without PATE labels): tighter
        where teachers agree, but a function of their votes, so **not itself private**."""
        if not self.pate.queries:
            return None
        return epsilon_from_log_moments(self.pate.log_moments + self.gaussian, self.delta)

    def epsilon_after_pate(self, queries: int) -> float:
        """The private ``epsilon`` if ``queries`` more PATE labels were answered (a count)."""
        return self._epsilon(self.pate.data_independent_log_moments(queries), self.gaussian, self.gaussian_mu2,
                             self.pate.queries + queries)

    def epsilon_after_gaussian(self, log_moments: Tensor, mu: float | None = None) -> float:
        """``epsilon`` if a release with these log moments (and ``mu``, for the exact
        composition) were added."""
        mu2 = None if mu is None or self.gaussian_mu2 is None else self.gaussian_mu2 + mu * mu
        return self._epsilon(self.pate.data_independent_log_moments(), self.gaussian + log_moments, mu2,
                             self.pate.queries, self.gaussian_releases + 1)

    def epsilon_add_remove(self) -> float:
        """The party's ``epsilon`` with the Gaussian releases counted under add/remove."""
        return self._epsilon(self.pate.data_independent_log_moments(), self.gaussian_add_remove,
                             self.gaussian_mu2_add_remove, self.pate.queries)

    def charge_gaussian(self, log_moments: Tensor, releases: int = 1, add_remove: Tensor | None = None,
                        mu: float | None = None, mu_add_remove: float | None = None) -> None:
        """Add a Gaussian release's log moments under ``neighbours`` (``releases`` counts what
        was charged) and, as ``add_remove``, under add/remove (default: the same moments, exact
        when ``neighbours`` is ``add_remove`` and an upper bound under ``replace``). ``mu``
        (sensitivity / noise std under ``neighbours``; ``mu_add_remove``: under add/remove,
        default ``mu``) lets Gaussian releases compose exactly; without it the ledger falls
        back to the log moments from then on."""
        add_remove = log_moments if add_remove is None else add_remove
        for moments in (log_moments, add_remove):
            if moments.numel() != self.max_order:
                raise ValueError(f"expected {self.max_order} orders, got {moments.numel()}")
        self.gaussian = self.gaussian + log_moments.to(torch.float64)
        self.gaussian_add_remove = self.gaussian_add_remove + add_remove.to(torch.float64)
        self.gaussian_releases += int(releases)
        if mu is None or self.gaussian_mu2 is None:
            self.gaussian_mu2 = self.gaussian_mu2_add_remove = None
        else:
            mu_ar = mu if mu_add_remove is None else mu_add_remove
            self.gaussian_mu2 += int(releases) * mu * mu
            self.gaussian_mu2_add_remove += int(releases) * mu_ar * mu_ar

    def declare(self, kind: str, count: int = 1) -> None:
        """Record ``count`` releases of ``kind`` that no mechanism protects."""
        self.unprotected[kind] = self.unprotected.get(kind, 0) + int(count)

    def summary(self) -> dict:
        """``{"epsilon", "delta", "neighbours", "unit", "accountant", "private", "epsilon_add_remove",
        "not_covered", "epsilon_pate", "epsilon_pate_data_dependent", "epsilon_gaussian",
        "pate_queries", "gaussian_releases", "unprotected"}`` (per-mechanism epsilons alone,
        for reading; ``epsilon`` is the composed total, not their sum). ``private`` is False
        when the party released something exact that a mechanism was meant to cover (an
        exact cross-covariance: ``unprotected.exact_crosscov``); its ``epsilon`` then covers
        the accounted releases only. ``epsilon_pate_data_dependent`` is not itself private."""
        eps = epsilon_from_log_moments
        gaussian = 0.0
        if self.gaussian_releases:
            gaussian = (gaussian_epsilon(math.sqrt(self.gaussian_mu2), self.delta)
                        if self.gaussian_mu2 is not None else eps(self.gaussian, self.delta))
        return {"epsilon": self.epsilon(), "delta": self.delta, "neighbours": self.neighbours, "unit": UNIT,
                "accountant": self.accountant(), "private": not self.unprotected.get("exact_crosscov"),
                "epsilon_add_remove": self.epsilon_add_remove(), "not_covered": NOT_COVERED,
                "epsilon_pate": self.pate.epsilon_data_independent(),
                "epsilon_pate_data_dependent": self.pate.epsilon() if self.pate.queries else None,
                "epsilon_gaussian": gaussian,
                "pate_queries": self.pate.queries, "gaussian_releases": self.gaussian_releases,
                "unprotected": dict(sorted(self.unprotected.items()))}

    def state_dict(self) -> dict:
        def plain(moments: Tensor) -> list:
            return [x if math.isfinite(x) else "inf" for x in moments.tolist()]

        return {"pate": self.pate.state_dict(), "neighbours": self.neighbours, "gaussian": plain(self.gaussian),
                "gaussian_add_remove": plain(self.gaussian_add_remove),
                "gaussian_releases": self.gaussian_releases, "gaussian_mu2": self.gaussian_mu2,
                "gaussian_mu2_add_remove": self.gaussian_mu2_add_remove, "unprotected": dict(self.unprotected)}

    def load_state_dict(self, state: dict) -> None:
        def tensor(moments: list) -> Tensor:
            return torch.tensor([math.inf if x == "inf" else x for x in moments], dtype=torch.float64)

        if state["neighbours"] != self.neighbours:
            raise ValueError(f"ledger neighbours mismatch: saved {state['neighbours']!r}, here {self.neighbours!r}")
        self.pate.load_state_dict(state["pate"])
        self.gaussian, self.gaussian_add_remove = tensor(state["gaussian"]), tensor(state["gaussian_add_remove"])
        self.gaussian_releases = int(state["gaussian_releases"])
        # a state saved before exact composition has no mu: its releases compose by RDP
        older = "gaussian_mu2" not in state and self.gaussian_releases  # saved before exact composition: RDP
        self.gaussian_mu2 = None if older else state.get("gaussian_mu2", 0.0)
        self.gaussian_mu2_add_remove = None if older else state.get("gaussian_mu2_add_remove", 0.0)
        self.unprotected = dict(state["unprotected"])
