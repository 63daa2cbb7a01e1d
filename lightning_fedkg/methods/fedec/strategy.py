"""FedEC on FedE: holder-mean of entity rows, with an embedding-contrastive term in every local fit.

Chen et al., "Federated Knowledge Graph Embedding with Embedding-Contrastive learning"
(FedEC), applied to FedE's entity table as FedLU (Zhu et al., WWW 2023, §5) uses it as a
baseline (FedLU's official code, ``model.py``, ``fed_mode == "FedEC"``). During the E local
epochs of a round each client minimises its KGE loss plus

    L_con = −μ · log( exp(cos̄(E, E_glb)/τ) / (exp(cos̄(E, E_glb)/τ) + exp(cos̄(E, E_prev)/τ)) )

over its shared entity rows ``E``: ``cos̄(A, B)`` is the mean over entities of the row-wise
cosine similarity, ``E_glb`` the rows it received at the start of the round (positive) and
``E_prev`` its own rows at the end of its previous local training (negative), so the local
model is drawn towards the global one and away from where it drifted last time
(``federated.fedec.mu``, ``federated.fedec.temperature``; FedLU's script: 0.1 and 0.2). The
server is FedE's. With ``mu = 0`` it trains exactly like FedE.

Where ``E_prev`` comes from: FedLU's client keeps ``old_entity_embedding``, the value of
its entity table just before a training download overwrites it. Here a client's module is
also overwritten by every *evaluation* download (it evaluates with the aggregated rows,
:meth:`~.fede.HolderMeanServer.configure_evaluate`), so "the rows before the download" is
not its own previous model after an evaluated round or a round it was not selected in.
The client half therefore copies its rows at the end of each successful local training
into buffers of the module (``fedec_previous_<tensor>`` and the flag
``fedec_has_previous``), registered when the half is built, before a resume loads a
checkpoint: they are saved and restored with the module's weights, so a resumed run
computes the same term. Before its first local training a client has no previous local
model; as in FedLU's code, whose client model starts from the server's initial rows,
``E_prev`` is then the download itself and the term is the constant ``μ·log 2`` (no
gradient) in that round.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import FedECConfig
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import ClientHalf, Strategy
from lightning_fedkg.federated.holder_mean import HolderMeanServer

__all__ = ["FedEC", "FedECClient", "contrastive_term", "PREVIOUS_PREFIX", "HAS_PREVIOUS"]

#: Module buffer ``<prefix><tensor>``: the tensor's rows at the end of the last local fit.
PREVIOUS_PREFIX = "fedec_previous_"
#: Module buffer (0-d bool): whether the ``fedec_previous_*`` buffers hold a trained model.
HAS_PREVIOUS = "fedec_has_previous"


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
        module = party.module
        for name, p in self._entity_tensors().items():
            module.register_buffer(PREVIOUS_PREFIX + name, p.detach().clone())
        module.register_buffer(HAS_PREVIOUS, torch.tensor(False))

    def _entity_tensors(self) -> dict:
        """``{wire name: Parameter}`` of the shared groups, in a fixed order."""
        return {n: p for g in self.shared().values() for n, p in sorted(g.tensors.items())}

    def previous(self) -> dict[str, Tensor]:
        """``E_prev`` per tensor: the buffers (rows at the end of the last local fit)."""
        return {n: getattr(self.party.module, PREVIOUS_PREFIX + n) for n in self._entity_tensors()}

    def has_previous(self) -> bool:
        return bool(getattr(self.party.module, HAS_PREVIOUS))

    def before_fit(self, message) -> None:
        cfg = self.cfg.federated.fedec
        mu, temperature = float(cfg.mu), float(cfg.temperature)
        if mu == 0.0:
            return
        params = list(self._entity_tensors().values())
        glb = entity_rows([p.detach().clone() for p in params])
        previous = entity_rows([t.detach().clone() for t in self.previous().values()]) if self.has_previous() else glb

        def contrastive():
            return contrastive_term(entity_rows(params), glb, previous, mu, temperature)

        self.add_loss_term(contrastive)

    @torch.no_grad()
    def remember(self) -> None:
        """Store the current rows (the end of a local fit) as the next round's ``E_prev``."""
        for name, p in self._entity_tensors().items():
            getattr(self.party.module, PREVIOUS_PREFIX + name).copy_(p.detach())
        getattr(self.party.module, HAS_PREVIOUS).fill_(True)

    def on_train(self, message: Message, round: int) -> Message:
        """FedE's round; then, the local fit having succeeded, remember its rows as ``E_prev``."""
        reply = super().on_train(message, round)
        self.remember()
        return reply


class FedEC(Strategy):
    """FedE's server with FedEC clients (contrastive term: towards the received rows, away
    from the client's previous local rows)."""

    name = "fedec"
    Server = HolderMeanServer
    Client = FedECClient
    groups = ("entity",)
    config_class = FedECConfig
