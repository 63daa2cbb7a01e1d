"""FedProx on FedE: holder-mean of entity rows, with a proximal term in every local fit.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020, applied to
FedE's entity table as FedLU (Zhu et al., WWW 2023, §5) uses it as a baseline: during the
E local epochs of a round each client minimises its KGE loss plus
``mu/2 · ‖E − E_global‖²_F`` over the shared entity rows, ``E_global`` being the rows it
received at the start of the round (``federated.fedprox.mu``, 0.1 in FedLU's code). The
server is FedE's. With ``mu = 0`` it trains exactly like FedE.
"""

from __future__ import annotations

from lightning_fedkg.federated.strategy import ClientHalf, Strategy
from lightning_fedkg.federated.holder_mean import HolderMeanServer

from .config import FedProxConfig

__all__ = ["FedProx", "FedProxClient"]


class FedProxClient(ClientHalf):
    """Adds the proximal term to the loss for the length of each local fit."""

    def before_fit(self, message) -> None:
        mu = float(self.settings.mu)
        if mu == 0.0:
            return
        anchors = [(p, p.detach().clone()) for g in self.shared().values() for p in g.tensors.values()]

        def proximal():
            return 0.5 * mu * sum((p - anchor).pow(2).sum() for p, anchor in anchors)

        self.add_loss_term(proximal)


class FedProx(Strategy):
    """FedE's server with FedProx clients (proximal term towards the received rows)."""

    name = "fedprox"
    Server = HolderMeanServer
    Client = FedProxClient
    groups = ("entity",)
    config_class = FedProxConfig
