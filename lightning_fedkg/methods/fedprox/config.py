"""The ``fedprox`` method's config section(s)."""

from __future__ import annotations

from dataclasses import dataclass, field

from lightning_fedkg.config import Range

__all__ = ["FedProxConfig"]


@dataclass
class FedProxConfig:
    """``federated.fedprox``: FedProx (Li et al., MLSys 2020) on FedE's entity rows, FedLU's
    baseline (Zhu et al., WWW 2023): each client adds ``mu/2 · ‖E − E_global‖²_F`` to its
    local loss, ``E_global`` being the rows it received that round (FedLU's code: μ = 0.1)."""

    mu: float = field(default=0.1, metadata={"range": Range(min=0)})
