"""FedE: federated averaging of entity embeddings over the clients that hold each entity.

Chen et al., "FedE: Embedding Knowledge Graphs in Federated Setting", IJCKG 2021, Alg. 1.
The server keeps a union entity table ``E`` (``n × d_e``) and, per client, its index map
``idx_c`` (the permutation matrix ``P^c`` of Eq. 1), which it learns in round 0 from keyed
hashes of the entity names (:mod:`..alignment`). Each round the selected clients receive
``E[idx_c]``, train their own relation embeddings and their copy of the entity rows for E
local epochs, and send the rows back; the server replaces ``E`` by the holder-mean of the
uploads (Eq. 2, :mod:`lightning_fedkg.federated.aggregation`). **Relation embeddings never
leave a client**: the client half moves only the module's declared ``"entity"`` group.
Clients are evaluated with the aggregated rows and their own relations (Chen et al.,
IJCKG 2021, §3.1; FedE's fede.py).

The server's initial rows come from the clients' declarations (:class:`~lightning_fedkg.
models.shareable.InitSpec`), each row drawn from a key derived from its hash, so the
initial table does not depend on the order of the global ids.

Unsampled clients (``federated.fraction < 1``; ``federated.aggregation``):

* ``selected_holders`` (default): a row is averaged over the *sampled* holders only;
  rows none of them holds keep their value.
* ``all_holders``: the official code's behaviour: unsampled holders count as having
  returned the current row, so the update is damped by ``#sampled holders / #holders``.

FedR (:mod:`.fedr`) is the same engine over the ``"relation"`` group.
"""

from __future__ import annotations

from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.strategy import ClientHalf, Strategy

from .config import FedEConfig

__all__ = ["FedE"]


class FedE(Strategy):
    """FedE (Chen et al., IJCKG 2021): holder-mean of the ``"entity"`` group; relations stay local."""

    name = "fede"
    Server = HolderMeanServer
    Client = ClientHalf
    groups = ("entity",)
    config_class = FedEConfig

    @classmethod
    def phases(cls, cfg) -> list[str]:
        return ["fusion"] if cfg.federated.fede.fusion else []
