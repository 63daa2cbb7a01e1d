"""Holder-mean aggregation of row-indexed shared groups (FedE's engine, Chen et al., IJCKG 2021, Eq. 2).

The server keeps one union table per shared tensor and, per client, its index map
``idx_c`` (the permutation matrix ``P^c`` of FedE's Eq. 1), learnt in round 0 from keyed
hashes of the item names (:mod:`.alignment`). Each round the selected clients receive
their rows ``E[idx_c]`` and send them back trained; the server replaces each table by the
holder-mean of the uploads (:mod:`.aggregation`). Nothing outside the strategy's declared
groups ever crosses.

The server's initial rows come from the clients' declarations
(:class:`~lightning_fedkg.models.shareable.InitSpec`), each row drawn from a key derived
from its hash, so the initial table does not depend on the order of the global ids.

Unsampled clients (``federated.fraction < 1``; ``federated.aggregation``):

* ``selected_holders`` (default): a row is averaged over the *sampled* holders only;
  rows none of them holds keep their value.
* ``all_holders``: the official FedE code's behaviour: unsampled holders count as having
  returned the current row, so the update is damped by ``#sampled holders / #holders``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.federated.aggregation import damped_holder_mean, holder_counts, holder_mean
from lightning_fedkg.federated.alignment import Alignment, union_alignment
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import ServerHalf
from lightning_fedkg.models.shareable import InitSpec
from lightning_fedkg.seeding import key_from_digest, keyed_uniform, purpose_key

__all__ = ["HolderMeanServer", "initial_rows"]


def initial_rows(digests: Tensor, shape: list[int], init: InitSpec, seed: int, tensor: str) -> Tensor:
    """Float32 ``[N, *shape]`` initial rows; row ``i`` depends only on ``digests[i]``, the seed
    and the tensor's name, never on ``i``."""
    width = 1
    for s in shape:
        width *= int(s)
    u = keyed_uniform(key_from_digest(digests), width, salt=purpose_key(seed, f"init:{tensor}"))
    return init.draw(u).to(torch.float32).reshape(digests.shape[0], *shape)


class HolderMeanServer(ServerHalf):
    """Holder-mean over the rows of the strategy's one row-indexed group (FedE, FedR)."""

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        (self.group,) = strategy.groups
        self.aggregation = ctx.cfg.federated.aggregation
        if self.aggregation not in ("selected_holders", "all_holders"):
            raise ValueError(f"unknown federated.aggregation {self.aggregation!r}")
        self.alignment: Alignment | None = None
        self.table: dict[str, Tensor] = {}
        #: ``{tensor: parties that declare it}`` (parties may run different models).
        self.holders_of: dict[str, list[str]] = {}
        self._holder_counts: dict[str, Tensor] = {}  # derived from the two above, cached

    # ---------------------------------------------------------------- round 0
    def configure_align(self) -> dict[str, Message]:
        return {name: Message(config={"groups": [self.group]}) for name in self.clients}

    def aggregate_align(self, replies, failures) -> None:
        """Union of the digests → index maps, holder counts and the initial tables.

        Parties may run different models (``federated.parties``): each tensor of the group
        gets one table, shared by the parties that declare it (TransE and TransD parties
        share ``entity_emb``; only TransD parties hold ``entity_proj``). A tensor declared
        with different shapes or inits by two parties is an error.
        """
        if failures or set(replies) != set(self.clients):
            raise RuntimeError(f"alignment needs every client; failed: {failures or 'missing replies'}")
        specs = {name: replies[name].config["groups"][self.group] for name in self.clients}
        indexes = {spec["index"] for spec in specs.values()}
        if len(indexes) != 1:
            raise ValueError(f"group {self.group!r} is indexed differently by the clients: {sorted(indexes)}")
        (index,) = indexes
        tensors: dict[str, dict] = {}
        self.holders_of = {}
        for name, spec in specs.items():
            for tensor, declared in spec["tensors"].items():
                if tensor in tensors and tensors[tensor] != declared:
                    first = self.holders_of[tensor][0]
                    raise ValueError(f"{name} declares {tensor!r} as {declared}, {first} as {tensors[tensor]}")
                tensors.setdefault(tensor, declared)
                self.holders_of.setdefault(tensor, []).append(name)
        self.alignment = union_alignment({n: replies[n].arrays[f"{index}_digests"] for n in self.clients})
        self._holder_counts = {}
        self.table = {
            t: initial_rows(self.alignment.digests, s["shape"], InitSpec.from_json(s["init"]), self.cfg.seed, t)
            for t, s in tensors.items()
        }

    # ---------------------------------------------------------------- rounds
    def rows(self, name: str) -> dict[str, Tensor]:
        """``E[idx_c]`` of every shared tensor client ``name`` declares."""
        idx = self.alignment.index[name]
        return {t: table[idx] for t, table in self.table.items() if name in self.holders_of[t]}

    def configure_train(self, round, selected):
        return {name: Message(arrays=self.rows(name)) for name in selected}

    def aggregate_train(self, round, replies, failures) -> None:
        """Holder-mean of the uploads into each table (FedE Eq. 2), over the parties that
        hold the tensor and answered."""
        for t, table in self.table.items():
            order = [n for n in self.holders_of[t] if n in replies]
            if not order:
                continue
            indices = [self.alignment.index[n] for n in order]
            rows = [replies[n].arrays[t] for n in order]
            if self.aggregation == "all_holders":
                self.table[t] = damped_holder_mean(table, indices, rows, self.holder_counts(t))
            else:
                self.table[t] = holder_mean(table, indices, rows)

    def holder_counts(self, tensor: str) -> Tensor:
        """``N_i`` of tensor ``tensor``: how many parties hold row ``i`` of it (computed once)."""
        if tensor not in self._holder_counts:
            holders = [self.alignment.index[n] for n in self.holders_of[tensor]]
            self._holder_counts[tensor] = holder_counts(self.alignment.size, holders)
        return self._holder_counts[tensor]

    def configure_evaluate(self, round, split):
        """Each client evaluates with the aggregated rows and its own other tables."""
        return {name: Message(arrays=self.rows(name), config={"split": split}) for name in self.clients}

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        state = super().state_dict()
        state["table"] = {t: v.clone() for t, v in self.table.items()}
        a = self.alignment
        state["alignment"] = None if a is None else {"digests": a.digests, "index": a.index, "holders": a.holders}
        state["holders_of"] = {t: list(v) for t, v in self.holders_of.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.table = {t: v.clone() for t, v in state["table"].items()}
        a = state.get("alignment")
        self.alignment = None if a is None else Alignment(a["digests"], dict(a["index"]), a["holders"])
        self.holders_of = {t: list(v) for t, v in state.get("holders_of", {}).items()}
        self._holder_counts = {}
