"""FedEC on FedE: holder-mean of entity rows, with an embedding-contrastive term in every local fit.

Chen et al., "Federated Knowledge Graph Embedding with Embedding-Contrastive learning"
(FedEC), as FedLU (WWW 2023, §5) uses it as a baseline. Each client adds
``−μ·log(e^{g/τ} / (e^{g/τ} + e^{p/τ}))`` to its loss, g and p the mean row-wise cosine of
its entity rows to the rows it received and to its own rows after its previous local fit
(``federated.fedec.mu``, ``federated.fedec.temperature``). ``mu = 0`` is FedE exactly. The
previous rows are the client half's own state (:meth:`FedECClient.state_dict`), saved in its
checkpoint. See docs/methods/fedec.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import FedECConfig
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import ClientHalf, Strategy
from lightning_fedkg.federated.holder_mean import HolderMeanServer

__all__ = ["FedEC", "FedECClient", "contrastive_term"]


def entity_rows(tensors: list[Tensor]) -> Tensor:
    """``[N, D]``: each entity's values of every tensor, flattened and concatenated (one
    tensor of shape ``[N, d]`` is returned as is)."""
    if len(tensors) == 1 and tensors[0].dim() == 2:
        return tensors[0]
    return torch.cat([t.reshape(t.shape[0], -1) for t in tensors], dim=1)


def contrastive_term(local: Tensor, glb: Tensor, previous: Tensor, mu: float, temperature: float) -> Tensor:
    """FedEC's ``−μ · log(e^{g} / (e^{g} + e^{p}))`` with ``g = cos̄(local, glb)/τ`` and
    ``p = cos̄(local, previous)/τ`` (``cos̄``: mean row-wise cosine similarity), computed as
    the equal and overflow-free ``μ · softplus(p − g)``."""
    g = F.cosine_similarity(local, glb, dim=-1).mean() / temperature
    p = F.cosine_similarity(local, previous, dim=-1).mean() / temperature
    return mu * F.softplus(p - g)


class FedECClient(ClientHalf):
    """Adds the contrastive term to the loss for the length of each local fit; keeps ``E_prev``."""

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        #: ``E_prev`` per tensor: the rows at the end of the last local fit, on the module's
        #: device; None before the first one.
        self._previous: dict[str, Tensor] | None = None

    def _entity_tensors(self) -> dict:
        """``{wire name: Parameter}`` of the shared groups, in a fixed order."""
        return {n: p for g in self.shared().values() for n, p in sorted(g.tensors.items())}

    def previous(self) -> dict[str, Tensor]:
        """``E_prev`` per tensor: the rows at the end of the last local fit (empty before it)."""
        return dict(self._previous or {})

    def has_previous(self) -> bool:
        return self._previous is not None

    def before_fit(self, message) -> None:
        mu, temperature = float(self.settings.mu), float(self.settings.temperature)
        if mu == 0.0:
            return
        tensors = self._entity_tensors()
        params = list(tensors.values())
        glb = entity_rows([p.detach().clone() for p in params])
        if self._previous is None:
            previous = glb
        else:
            # Restored from a checkpoint, the rows are on the CPU: move them once.
            self._previous = {n: self._previous[n].to(p.device) for n, p in tensors.items()}
            previous = entity_rows(list(self._previous.values()))

        def contrastive():
            return contrastive_term(entity_rows(params), glb, previous, mu, temperature)

        self.add_loss_term(contrastive)

    @torch.no_grad()
    def remember(self) -> None:
        """Store the current rows (the end of a local fit) as the next round's ``E_prev``."""
        self._previous = {name: p.detach().clone() for name, p in self._entity_tensors().items()}

    def on_train(self, message: Message, round: int) -> Message:
        """FedE's round; then, the local fit having succeeded, remember its rows as ``E_prev``."""
        reply = super().on_train(message, round)
        self.remember()
        return reply

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """``{"previous": {tensor: rows}}`` (CPU copies), or ``{}`` before the first local fit."""
        if self._previous is None:
            return {}
        return {"previous": {n: t.detach().cpu().clone() for n, t in self._previous.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`; the rows must match the module's tables exactly."""
        previous = state.get("previous")
        if previous is None:
            self._previous = None
            return
        tensors = self._entity_tensors()
        if set(previous) != set(tensors):
            raise KeyError(f"{self.party.name}: FedEC state holds rows of {sorted(previous)}, "
                           f"the module shares {sorted(tensors)}")
        for n, p in tensors.items():
            if previous[n].shape != p.shape:
                raise ValueError(f"{self.party.name}: FedEC state has {n!r} of shape {tuple(previous[n].shape)}, "
                                 f"the module's is {tuple(p.shape)}")
        self._previous = {n: previous[n].detach().clone() for n in tensors}


class FedEC(Strategy):
    """FedE's server with FedEC clients (contrastive term: towards the received rows, away
    from the client's previous local rows)."""

    name = "fedec"
    Server = HolderMeanServer
    Client = FedECClient
    groups = ("entity",)
    config_class = FedECConfig
