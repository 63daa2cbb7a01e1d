"""A user's strategy and task that live outside the package, named in a config by import
path (``federated.strategy: tests.plugin_strategy:PluginFedE``); used by tests/test_protocol.py.

:class:`PrivateTableModule` has two per-entity tables: the model's ``entity_emb`` (declared
in the ``"entity"`` group by :meth:`KGEModel.shareable_groups`) and ``private_entity``,
which it trains too but does **not** declare, so no strategy may ever send it.
Nothing here registers itself: importing this module leaves the registries untouched.
"""

from __future__ import annotations

import torch
from torch import nn

from lightning_fedkg.federated.strategy import ClientHalf, Strategy
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.tasks import LinkPrediction
from lightning_fedkg.models.kge_module import KGEModule

__all__ = ["PrivateTableModule", "PrivateTableTask", "PluginFedE", "PRIVATE"]

#: The name of the table that must never cross.
PRIVATE = "private_entity"


class PrivateTableModule(KGEModule):
    """A KGE module with an undeclared second entity table, trained alongside the model."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        n, d = self.model.entity_emb.shape
        self.private_entity = nn.Parameter(torch.empty(n, d).uniform_(-0.1, 0.1))

    def training_loss(self, batch: dict) -> torch.Tensor:
        loss = super().training_loss(batch)
        # The private rows of the batch's entities are pulled towards the shared ones, so
        # the table takes part in training (and has gradients) like a FedLU local table.
        ids = batch["positive"][:, [0, 2]].reshape(-1)
        pull = (self.private_entity[ids] - self.model.entity_emb[ids].detach()).pow(2).mean()
        return loss + 0.01 * pull


class PrivateTableTask(LinkPrediction):
    """Link prediction with :class:`PrivateTableModule`."""

    name = "private_table"

    def build_module(self, cfg, kg):
        base = super().build_module(cfg, kg)  # the configured KGEModule: reuse its arguments
        return PrivateTableModule(**dict(base.hparams))


class PluginFedE(Strategy):
    """FedE's server under another name: holder-mean of the declared ``"entity"`` group."""

    name = "plugin_fede"
    Server = HolderMeanServer
    Client = ClientHalf
    groups = ("entity",)
