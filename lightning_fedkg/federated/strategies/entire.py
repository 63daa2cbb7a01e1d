"""*Entire* (FedE's "Collection"): one model trained on the union of all clients' triples.

The upper reference of FedE, Chen et al., IJCKG 2021, §3.1: all triples are pooled at one
party with global entity and relation ids. **This setting violates the privacy premise of
federated learning** (the triples themselves leave the clients); it only tells how far a
federated method is from centralised training.

Evaluation follows FedE's protocol per client: client ``k`` ranks among *its own* entities
with *its own* filter. The strategy builds a client-local view of the central model by
gathering the entity-prefixed rows at ``idx_k`` and the relation-prefixed rows at the
client's ``relation_index`` into the client's (client-sized) module, so the candidate set is
exactly that client's entities and the client's datamodule (local ids) evaluates it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from lightning_fedkg.federated.strategies.base import (
    Strategy,
    parameters_by_prefix,
    write_parameters,
)

__all__ = ["Entire", "client_view"]

CENTRAL = "central"


@torch.no_grad()
def client_view(central_model, entity_index, relation_index) -> dict[str, torch.Tensor]:
    """Rows of a global-id model that belong to one client, in the client's local order.

    Returns ``{name: table[idx]}`` for every ``entity_*`` table (rows ``entity_index``) and
    every ``relation_*`` table (rows ``relation_index``).
    """
    view = {}
    for name, p in parameters_by_prefix(central_model, "entity_").items():
        view[name] = p.detach()[entity_index.to(p.device)].cpu()
    for name, p in parameters_by_prefix(central_model, "relation_").items():
        view[name] = p.detach()[relation_index.to(p.device)].cpu()
    return view


class Entire(Strategy):
    """Centralised training on ``fkg.union()``; per-client evaluation through local views."""

    name = "entire"

    def __init__(self) -> None:
        super().__init__()
        self.central: Any = None
        self.entity_index: list[torch.Tensor] = []
        self.relation_index: list[torch.Tensor] = []

    def setup(
        self,
        fkg,
        clients: Sequence[Any],
        cfg,
        *,
        channel=None,
        make_learner: Callable[[str, Any], Any] | None = None,
    ) -> None:
        """Create the central learner on the union graph (needs ``make_learner``)."""
        if make_learner is None:
            raise ValueError("the 'entire' strategy needs make_learner to build its central learner")
        self.central = make_learner(CENTRAL, fkg.union())
        self.entity_index = [i.long() for i in fkg.entity_index]
        self.relation_index = [i.long() for i in fkg.relation_index]
        super().setup(fkg, clients, cfg, channel=channel, make_learner=make_learner)

    def learners(self, clients: Sequence[Any]) -> list[Any]:
        """Only the central learner trains."""
        return [self.central]

    def select_clients(self, round: int, generator=None) -> list[int]:
        """The central learner, every round."""
        return [0]

    def prepare_evaluation(self, k: int, client: Any, round: int, name: str = "eval_download") -> None:
        """Load client ``k``'s view of the central model into the client's module.

        No Channel traffic: the central party already holds everything, so the view is a
        local computation (the privacy cost of this setting is the pooling itself).
        """
        view = client_view(self.central.module.model, self.entity_index[k], self.relation_index[k])
        write_parameters(client.module.model, view)
