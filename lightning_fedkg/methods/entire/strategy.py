"""*Entire* (FedE's "Collection"): one model trained on the union of all clients' triples.

The upper reference of FedE, Chen et al., IJCKG 2021, §3.1: all triples are pooled at one
party with global entity and relation ids. **This setting violates the privacy premise of
federated learning** (the triples themselves leave the clients); it only tells how far a
federated method is from centralised training. Because the pooling *is* the method, it
cannot be split into a server and client halves that exchange messages: it runs
in-process only (:attr:`Strategy.in_process_only`), with the central party built by the
server half from the loader's union graph.

Evaluation follows FedE's protocol per client: client ``k`` ranks among *its own* entities
with *its own* filter. The server sends each client its view of the central model — the
entity rows at ``idx_k`` and the relation rows at the client's relation map — which the
client writes into its (client-sized) module.
"""

from __future__ import annotations

import torch

from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import ClientHalf, ServerHalf, Strategy

__all__ = ["Entire", "client_view", "CENTRAL"]

CENTRAL = "central"


@torch.no_grad()
def client_view(central_module, entity_index, relation_index) -> dict[str, torch.Tensor]:
    """What of a global-id module belongs to one client, in the client's local order: every
    entity-indexed tensor at ``entity_index``, every relation-indexed one at
    ``relation_index``, and every tensor shared whole (a query encoder's operators) as is."""
    view = {}
    for group in central_module.shareable_groups().values():
        index = {"entity": entity_index, "relation": relation_index, None: None}[group.index]
        for name, p in group.tensors.items():
            view[name] = (p.detach() if index is None else p.detach()[index.to(p.device)]).cpu()
    return view


class EntireClient(ClientHalf):
    """Writes whatever the central module shares (every group the client's module declares)."""

    def shared(self) -> dict:
        return self.party.module.shareable_groups()


class EntireServer(ServerHalf):
    """Holds the central party; trains it each round; sends per-client views for evaluation."""

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        if ctx.make_party is None or ctx.fkg is None:
            raise ValueError("the 'entire' strategy pools the clients' triples and runs in-process only")
        self.central = ctx.make_party(CENTRAL, ctx.fkg.union())
        self.entity_index = dict(zip(self.clients, (i.long() for i in ctx.fkg.entity_index)))
        self.relation_index = dict(zip(self.clients, (i.long() for i in ctx.fkg.relation_index)))

    def select_clients(self, round: int) -> list[str]:
        """No client trains: the central party does, in :meth:`configure_train`."""
        return []

    def configure_train(self, round, selected):
        stats = self.central.fit(self.cfg.federated.local_epochs)
        self.central.log({"train/loss": stats["loss"]}, round)
        return {}

    def configure_evaluate(self, round, split):
        return {
            name: Message(arrays=client_view(self.central.module, self.entity_index[name], self.relation_index[name]),
                          config={"split": split})
            for name in self.clients
        }

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["central"] = self.central.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.central.load_state_dict(state["central"])


class Entire(Strategy):
    """Centralised training on the pooled triples; per-client evaluation through views."""

    name = "entire"
    Server = EntireServer
    Client = EntireClient
    groups = ("entity", "relation")
    in_process_only = True
    clients_train = False  # the central party trains; clients evaluate views of it
