"""One party's privacy ledger: every mechanism it runs on its data, composed into one epsilon.

Log moments of each accounted mechanism (``pate``: PATE labels as a PPAT host; ``gaussian``:
the supervised alignment's releases) add order by order into one ``(epsilon, delta)`` under
one neighbouring relation, with the Gaussian releases' add/remove cost beside it.
:meth:`declare` counts releases no mechanism protects and :meth:`summary` reports them, and
what the epsilon does not cover (one triple can move every row). The unit is one aligned
entity's row. See docs/privacy.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .accountant import PateMomentsAccountant
from .gaussian import epsilon_from_log_moments

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

    def epsilon_add_remove(self) -> float:
        """The party's ``epsilon`` with the Gaussian releases counted under add/remove."""
        if not (self.pate.queries or self.gaussian_releases):
            return 0.0
        return epsilon_from_log_moments(self.pate.log_moments + self.gaussian_add_remove, self.delta)

    def charge_gaussian(self, log_moments: Tensor, releases: int = 1, add_remove: Tensor | None = None) -> None:
        """Add a Gaussian release's log moments under ``neighbours`` (``releases`` counts what
        was charged) and, as ``add_remove``, under add/remove (default: the same moments, exact
        when ``neighbours`` is ``add_remove`` and an upper bound under ``replace``)."""
        add_remove = log_moments if add_remove is None else add_remove
        for moments in (log_moments, add_remove):
            if moments.numel() != self.max_order:
                raise ValueError(f"expected {self.max_order} orders, got {moments.numel()}")
        self.gaussian = self.gaussian + log_moments.to(torch.float64)
        self.gaussian_add_remove = self.gaussian_add_remove + add_remove.to(torch.float64)
        self.gaussian_releases += int(releases)

    def declare(self, kind: str, count: int = 1) -> None:
        """Record ``count`` releases of ``kind`` that no mechanism protects."""
        self.unprotected[kind] = self.unprotected.get(kind, 0) + int(count)

    def summary(self) -> dict:
        """``{"epsilon", "delta", "neighbours", "unit", "epsilon_add_remove", "not_covered",
        "epsilon_pate", "epsilon_gaussian", "pate_queries", "gaussian_releases", "unprotected"}``
        (per-mechanism epsilons alone, for reading; ``epsilon`` is the composed total, not
        their sum)."""
        eps = epsilon_from_log_moments
        return {"epsilon": self.epsilon(), "delta": self.delta, "neighbours": self.neighbours, "unit": UNIT,
                "epsilon_add_remove": self.epsilon_add_remove(), "not_covered": NOT_COVERED,
                "epsilon_pate": eps(self.pate.log_moments, self.delta) if self.pate.queries else 0.0,
                "epsilon_gaussian": eps(self.gaussian, self.delta) if self.gaussian_releases else 0.0,
                "pate_queries": self.pate.queries, "gaussian_releases": self.gaussian_releases,
                "unprotected": dict(sorted(self.unprotected.items()))}

    def state_dict(self) -> dict:
        def plain(moments: Tensor) -> list:
            return [x if math.isfinite(x) else "inf" for x in moments.tolist()]

        return {"pate": self.pate.state_dict(), "neighbours": self.neighbours, "gaussian": plain(self.gaussian),
                "gaussian_add_remove": plain(self.gaussian_add_remove),
                "gaussian_releases": self.gaussian_releases, "unprotected": dict(self.unprotected)}

    def load_state_dict(self, state: dict) -> None:
        def tensor(moments: list) -> Tensor:
            return torch.tensor([math.inf if x == "inf" else x for x in moments], dtype=torch.float64)

        if state["neighbours"] != self.neighbours:
            raise ValueError(f"ledger neighbours mismatch: saved {state['neighbours']!r}, here {self.neighbours!r}")
        self.pate.load_state_dict(state["pate"])
        self.gaussian, self.gaussian_add_remove = tensor(state["gaussian"]), tensor(state["gaussian_add_remove"])
        self.gaussian_releases = int(state["gaussian_releases"])
        self.unprotected = dict(state["unprotected"])
