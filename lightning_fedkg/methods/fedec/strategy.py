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
and keeps them itself (``FedECClient.state_dict``: ``{"previous": {tensor: rows}}``, empty
before the first local fit); the runner saves that state in the client's checkpoint next
to its module, so a resumed run computes the same term, and the module's own state has
nothing of FedEC's. Before its first local training a client has no previous local
model; as in FedLU's code, whose client model starts from the server's initial rows,
``E_prev`` is then the download itself and the term is the constant ``μ·log 2`` (no
gradient) in that round.

Checkpoints written when the rows were module buffers (``fedec_previous_<tensor>`` and
``fedec_has_previous`` in the module's state, no half state) still load: the client
takes the old buffers out of the module's state as it is loaded.
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
        cfg = self.cfg.federated.fedec
        mu, temperature = float(cfg.mu), float(cfg.temperature)
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
