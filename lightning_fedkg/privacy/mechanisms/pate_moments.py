"""PATE's moments accountant: per-query log-moments, composed, turned into (epsilon, delta).

Abadi et al., CCS 2016 (log moments, Thm 2.1/2.2) and Papernot et al., ICLR 2017 (PATE).
Each answered query (one noisy label, ``Lap(1/lambda)``, a ``2 lambda``-DP answer) is
charged ``min(di, pure, dd)`` at every order: the data-independent bound, the trivial
pure-DP bound, and PATE Thm 3's data-dependent bound only where its condition holds (FKGE's
Eq. 8-10 omit it). One query per labelled sample. Two epsilons come out:
:meth:`~PateMomentsAccountant.epsilon_data_independent`, from the query count alone, is the
guarantee (publishing or stopping on it reveals nothing more);
:meth:`~PateMomentsAccountant.epsilon` uses the vote gaps, so it is tighter where teachers
agree but not itself private (PATE releases it only through smooth sensitivity): it is
reported, and nothing stops on it. The derivation and its checks: docs/privacy.md.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["PateMomentsAccountant"]


class PateMomentsAccountant:
    """Accumulates PATE log moments ``alpha(l)``, ``l = 1 .. max_order``, one query per label.

    Args:
        lam: the Laplace noise parameter (noise ``Lap(1/lam)`` on vote counts).
        delta: the target ``delta`` of :meth:`epsilon`.
        max_order: the largest moment order ``L`` tracked.
        num_classes: the number of vote classes ``C`` (2 for a PATE-GAN discriminator).

    The state (``log_moments`` and ``queries``) persists through :meth:`state_dict` /
    :meth:`load_state_dict`, so one host's accountant spans all its handshakes and resumes.
    """

    def __init__(self, lam: float, delta: float = 1e-5, max_order: int = 32, num_classes: int = 2):
        if not lam > 0:
            raise ValueError(f"lam must be > 0, got {lam}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        if max_order < 1:
            raise ValueError(f"max_order must be >= 1, got {max_order}")
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.lam = float(lam)
        self.delta = float(delta)
        self.max_order = int(max_order)
        self.num_classes = int(num_classes)
        self.orders = torch.arange(1, self.max_order + 1, dtype=torch.float64)
        self.log_moments = torch.zeros(self.max_order, dtype=torch.float64)
        self.queries = 0

    def per_query(self, gaps: Tensor) -> Tensor:
        """``float64 [B, L]``: each query's log-moment bound at orders ``1 .. L``."""
        lam, ls = self.lam, self.orders[None, :]
        gap = torch.as_tensor(gaps).detach().to("cpu", torch.float64).reshape(-1, 1)
        if (gap < 0).any():
            raise ValueError("vote gaps must be >= 0")
        di = 2.0 * lam * lam * ls * (ls + 1.0)
        pure = 2.0 * lam * ls
        x = lam * gap
        q = ((self.num_classes - 1) * (2.0 + x) / 4.0 * torch.exp(-x)).clamp_max(1.0 - 1.0 / self.num_classes)
        # e^{2 lam} as a float64 tensor: inf for a huge lam (no OverflowError), then no
        # query is valid for the data-dependent bound and the pure 2*lam*l bound applies.
        e2l = torch.tensor(2.0 * lam, dtype=torch.float64).exp()
        valid = q < 1.0 / (e2l + 1.0)  # == (e^{2 lam} - 1) / (e^{4 lam} - 1)
        qv = torch.where(valid, q, torch.zeros_like(q))  # keep the logs finite where unused
        # dd = log( (1-q) * ((1-q)/(1 - e^{2 lam} q))^l + q * e^{2 lam l} ), in log space
        log_1mq = torch.log1p(-qv)
        first = log_1mq + ls * (log_1mq - torch.log1p(-e2l * qv))
        second = torch.log(qv) + 2.0 * lam * ls  # log 0 = -inf is fine in logaddexp
        dd = torch.where(valid, torch.logaddexp(first, second), torch.full_like(first, math.inf))
        return torch.minimum(torch.minimum(di, pure), dd)

    def accumulate(self, gaps: Tensor) -> None:
        """Charge one query per entry of ``gaps`` (``[B]``, top minus second hard vote)."""
        terms = self.per_query(gaps)
        self.log_moments += terms.sum(dim=0)
        self.queries += terms.shape[0]

    def _eps_per_order(self) -> Tensor:
        return (self.log_moments + math.log(1.0 / self.delta)) / self.orders

    def epsilon(self) -> float:
        """The data-dependent ``min_l (alpha(l) + log(1/delta)) / l`` (Abadi et al. 2016,
        Thm 2.2) over the charged gaps: **not itself private** (see the module docstring)."""
        return float(self._eps_per_order().min())

    def worst_query(self) -> Tensor:
        """``float64 [L]``: the data-independent charge of one query, ``min(di, 2 lambda l)``.
        A gap of 0 never meets PATE Thm 3's condition, so this bounds every query's charge."""
        return self.per_query(torch.zeros(1)).squeeze(0)

    def data_independent_log_moments(self, extra_queries: int = 0) -> Tensor:
        """``alpha(l)`` of every answered query (plus ``extra_queries``) at the worst charge:
        a function of the query count alone."""
        return self.worst_query() * (self.queries + int(extra_queries))

    def epsilon_data_independent(self) -> float:
        """The private guarantee: ``epsilon`` from the query count alone (0 before any)."""
        if not self.queries:
            return 0.0
        moments = self.data_independent_log_moments()
        return float(((moments + math.log(1.0 / self.delta)) / self.orders).min())

    def epsilon_after(self, queries: int) -> float:
        """The data-independent ``epsilon`` if ``queries`` more labels were answered: what a
        stop rule may use, since it depends on counts only (not on the votes)."""
        moments = self.data_independent_log_moments(queries)
        return float(((moments + math.log(1.0 / self.delta)) / self.orders).min())

    def best_order(self) -> int:
        """The order ``l`` attaining :meth:`epsilon` (the smallest one on ties)."""
        return int(self._eps_per_order().argmin()) + 1

    def state_dict(self) -> dict:
        """Plain, JSON-able state: the parameters, ``log_moments`` and ``queries``."""
        return {
            "lam": self.lam,
            "delta": self.delta,
            "max_order": self.max_order,
            "num_classes": self.num_classes,
            "log_moments": self.log_moments.tolist(),
            "queries": self.queries,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore a :meth:`state_dict`; ``lam``, ``max_order`` and ``num_classes`` must match
        (``delta`` only enters :meth:`epsilon` and is taken from this accountant)."""
        for key in ("lam", "max_order", "num_classes"):
            if state[key] != getattr(self, key):
                raise ValueError(f"accountant {key} mismatch: saved {state[key]}, here {getattr(self, key)}")
        self.log_moments = torch.tensor(state["log_moments"], dtype=torch.float64)
        self.queries = int(state["queries"])
