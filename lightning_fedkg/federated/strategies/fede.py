"""FedE: federated averaging of entity embeddings over the clients that hold each entity.

Chen et al., "FedE: Embedding Knowledge Graphs in Federated Setting", IJCKG 2021, Alg. 1.
The server keeps a union entity table ``E`` (``n × d_e``) and, per client, its index map
``idx_c`` (the permutation matrix ``P^c`` of Eq. 1) and existence vector ``v^c``. Each
round the selected clients download ``E[idx_c]``, train their own relation embeddings and
their copy of the entity rows for E local epochs, and upload the rows; the server replaces
``E`` by the holder-mean of the uploads (Eq. 2, see
:mod:`lightning_fedkg.federated.aggregation`). **Relation embeddings never leave a client.**
Clients are evaluated with the aggregated rows ``E[idx_c]`` and their own relations
(REFERENCE §2.5), which the server sends through the Channel like any download.

Unsampled clients (``federated.fraction < 1``; ``federated.aggregation``):

* ``selected_holders`` (default): a row is averaged over the *sampled* holders only;
  rows none of them holds keep their value.
* ``all_holders``: the official code's behaviour: unsampled holders count as having
  returned the current row, so the update is damped by ``#sampled holders / #holders``.

Model fusion (§2.2.3) is a post-processing step outside this strategy.

The same engine serves FedR (:mod:`.fedr`) with the roles of entities and relations
swapped; :class:`HolderMeanStrategy` is parameterised by which tables it shares.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from lightning_fedkg.federated.aggregation import damped_holder_mean, holder_mean
from lightning_fedkg.federated.strategies.base import (
    SERVER,
    Payload,
    Strategy,
    parameters_by_prefix,
    read_parameters,
    write_parameters,
)

__all__ = ["HolderMeanStrategy", "FedE", "initial_server_tables"]


def initial_server_tables(cfg, num_entities: int, num_relations: int, prefix: str, seed: int) -> dict[str, Tensor]:
    """The server's initial union tables, drawn with the model's own init rule.

    Builds one global-size model of ``cfg.model`` under a private, seeded RNG (the global
    torch RNG is left untouched) and returns its ``prefix``-named tables.
    """
    from lightning_fedkg.models import build_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(
            cfg.model.name, num_entities, num_relations, cfg.model.dim,
            gamma=cfg.model.gamma, epsilon=cfg.model.epsilon,
        )
    return {n: p.detach().clone() for n, p in parameters_by_prefix(model, prefix).items()}


class HolderMeanStrategy(Strategy):
    """Server-side holder-mean over one family of tables (``entity_*`` or ``relation_*``).

    Subclasses set :attr:`prefix` and say where the index maps and existence vectors of
    that family are in the :class:`~lightning_fedkg.data.federated.FederatedKG`.
    """

    #: Which parameter tables are shared: ``"entity_"`` (FedE) or ``"relation_"`` (FedR).
    prefix: str = "entity_"

    def __init__(self) -> None:
        super().__init__()
        self.indices: list[Tensor] = []
        self.all_holders: Tensor = torch.zeros(0, dtype=torch.long)
        self.table: dict[str, Tensor] = {}
        self.aggregation: str = "selected_holders"

    # Where this family's maps live in the FederatedKG.
    def index_maps(self, fkg) -> list[Tensor]:
        return list(fkg.entity_index)

    def existence(self, fkg) -> Tensor:
        return fkg.entity_existence()

    def setup(self, fkg, clients: Sequence[Any], cfg, *, channel=None, make_learner=None) -> None:
        """Build ``idx_c``, the holder counts ``Σ_c v^c`` and the initial union table."""
        super().setup(fkg, clients, cfg, channel=channel, make_learner=make_learner)
        self.aggregation = cfg.federated.aggregation
        if self.aggregation not in ("selected_holders", "all_holders"):
            raise ValueError(f"unknown federated.aggregation {self.aggregation!r}")
        self.indices = [i.long().cpu() for i in self.index_maps(fkg)]
        self.all_holders = self.existence(fkg).long().sum(dim=0).cpu()
        self.table = initial_server_tables(
            cfg, fkg.num_entities, fkg.num_relations, self.prefix, seed=int(cfg.seed) + 15485863
        )

    def shared_names(self) -> list[str]:
        """Names of the parameters that cross the wire (those of the union table)."""
        return list(self.table)

    def download(self, k: int) -> Payload:
        """``E[idx_k]`` for every shared table."""
        return {n: t[self.indices[k]] for n, t in self.table.items()}

    def merge(self, client: Any, payload: Payload) -> None:
        """Overwrite the client's shared rows in place (its other tables are untouched)."""
        write_parameters(client.module.model, payload)

    def upload(self, client: Any) -> Payload:
        """The client's trained rows of every shared table, in its local order."""
        return read_parameters(client.module.model, self.shared_names())

    def aggregate(self, uploads: dict[int, Payload]) -> None:
        """Holder-mean of the uploads into the union table (FedE Eq. 2)."""
        order = sorted(uploads)
        indices = [self.indices[k] for k in order]
        for name, table in self.table.items():
            rows = [uploads[k][name].to(table.device) for k in order]
            if self.aggregation == "all_holders":
                self.table[name] = damped_holder_mean(table, indices, rows, self.all_holders)
            else:
                self.table[name] = holder_mean(table, indices, rows)

    def prepare_evaluation(self, k: int, client: Any, round: int, name: str = "eval_download") -> None:
        """Send client ``k`` the aggregated rows; it evaluates with them and its own other tables."""
        received = self.channel.send(SERVER, client.name, name, self.download(k), round)
        self.merge(client, received)

    def state_dict(self) -> dict:
        """Selection generator and the union tables (index maps are rebuilt from the data)."""
        state = super().state_dict()
        state["table"] = {n: t.clone() for n, t in self.table.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        missing = set(self.table) ^ set(state["table"])
        if self.table and missing:
            raise KeyError(f"checkpoint tables do not match the model: {sorted(missing)}")
        self.table = {n: t.clone() for n, t in state["table"].items()}


class FedE(HolderMeanStrategy):
    """FedE (Chen et al., IJCKG 2021): holder-mean of ``entity_*`` tables; relations stay local."""

    name = "fede"
    prefix = "entity_"
