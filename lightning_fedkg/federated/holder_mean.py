"""Holder-mean aggregation of shared groups (FedE's server, Chen et al., IJCKG 2021, Eq. 2).

The server keeps one union table per shared tensor and each client's index map (learnt in
round 0 from keyed hashes, :mod:`.alignment`); selected clients get their rows, train them
and send them back, and each row becomes the mean over the holders that answered
(:mod:`.aggregation`). Several groups are aggregated each over its own holders; initial rows
are drawn per digest. ``federated.aggregation``: ``selected_holders`` (default),
``all_holders`` (the official FedE code's damped update) or ``named_rows`` (each row over the
clients whose batches named it, the FedCQA code's partial update). See docs/methods/fede.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.federated.aggregation import damped_mean_from_sums, holder_counts, holder_sums, mean_from_sums
from lightning_fedkg.federated.alignment import DIGEST_BYTES, Alignment, union_alignment
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import NAMED, ServerHalf
from lightning_fedkg.models.shareable import InitSpec
from lightning_fedkg.seeding import key_from_digest, keyed_uniform, purpose_key

__all__ = ["HolderMeanServer", "initial_rows"]

#: The index of a tensor shared whole, seen as a table of one row that every holder holds.
ONE_ROW = torch.zeros(1, dtype=torch.long)
#: The digest a tensor shared whole draws its initial value from (its name is in the salt).
WHOLE = torch.zeros(1, DIGEST_BYTES, dtype=torch.uint8)
AGGREGATIONS = ("selected_holders", "all_holders", "named_rows")


def initial_rows(digests: Tensor, shape: list[int], init: InitSpec, seed: int, tensor: str) -> Tensor:
    """Float32 ``[N, *shape]`` initial rows; row ``i`` depends only on ``digests[i]``, the seed
    and the tensor's name, never on ``i``."""
    width = 1
    for s in shape:
        width *= int(s)
    u = keyed_uniform(key_from_digest(digests), width, salt=purpose_key(seed, f"init:{tensor}"))
    return init.draw(u).to(torch.float32).reshape(digests.shape[0], *shape)


class HolderMeanServer(ServerHalf):
    """Holder-mean over the rows of every group the strategy declares (FedE, FedR, FedLU).

    Each group has the row index its clients declare (``"entity"``, ``"relation"``, or
    None), so ``groups = ("entity", "relation")`` averages entity rows over the entity
    holders and relation rows over the relation holders. A group without a row index is
    shared whole: each of its tensors is averaged over the clients that hold it and
    answered, weighted equally (as a table of one row that every holder holds).

    Attributes:
        table: ``{tensor: Tensor}`` over all groups (a tensor name belongs to one group
            only); row-indexed tensors are ``[N, ...]`` over their index's union, the others
            have the declared shape.
        alignments: ``{group: Alignment | None}``; groups with the same index share one
            :class:`~.alignment.Alignment` (one union per index kind), None for a group
            without a row index.
        holders_of: ``{tensor: parties that declare it}`` (parties may run different models).
    """

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        self.aggregation = ctx.cfg.federated.aggregation
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown federated.aggregation {self.aggregation!r}; valid: {', '.join(AGGREGATIONS)}")
        #: ``named_rows``: per row-indexed group, the union rows last averaged (some client named them)
        self.named: dict[str, Tensor] = {}
        self.alignments: dict[str, Alignment | None] = {}
        self.table: dict[str, Tensor] = {}
        self.group_of: dict[str, str] = {}  # tensor -> its group
        self.holders_of: dict[str, list[str]] = {}
        self._holder_counts: dict[str, Tensor] = {}  # derived from the above, cached

    @property
    def alignment(self) -> Alignment | None:
        """The one alignment of a server whose groups use a single row index (FedE's
        entities, FedR's relations); None before round 0 or when no group is row-indexed."""
        distinct = {id(a): a for a in self.alignments.values() if a is not None}
        if len(distinct) > 1:
            raise ValueError(f"the groups {sorted(self.alignments)} use {len(distinct)} row indexes: "
                             "read alignments[group]")
        return next(iter(distinct.values()), None)

    # ---------------------------------------------------------------- round 0
    def configure_align(self) -> dict[str, Message]:
        return {name: Message(config={"groups": list(self.groups)}) for name in self.clients}

    def aggregate_align(self, replies, failures) -> None:
        """Union of the digests of each row index → index maps, holder counts, initial tables.

        Parties may run different models (``federated.parties``): each tensor of a group
        gets one table, shared by the parties that declare it (TransE and TransD parties
        share ``entity_emb``; only TransD parties hold ``entity_proj``). A tensor declared
        with different shapes or inits by two parties, or in two groups, is an error; so is
        a group that the clients index differently.
        """
        if failures or set(replies) != set(self.clients):
            raise RuntimeError(f"alignment needs every client; failed: {failures or 'missing replies'}")
        tensors: dict[str, dict] = {}
        index_of: dict[str, str | None] = {}
        self.group_of, self.holders_of = {}, {}
        for group in self.groups:
            specs = {name: replies[name].config["groups"][group] for name in self.clients}
            indexes = {spec["index"] for spec in specs.values()}
            if len(indexes) != 1:
                raise ValueError(f"group {group!r} is indexed differently by the clients: "
                                 f"{sorted(indexes, key=str)}")
            (index_of[group],) = indexes
            for name, spec in specs.items():
                for tensor, declared in spec["tensors"].items():
                    if self.group_of.setdefault(tensor, group) != group:
                        raise ValueError(f"{name} declares {tensor!r} in groups {self.group_of[tensor]!r} "
                                         f"and {group!r}; a tensor belongs to one group")
                    if tensor in tensors and tensors[tensor] != declared:
                        first = self.holders_of[tensor][0]
                        raise ValueError(f"{name} declares {tensor!r} as {declared}, {first} as {tensors[tensor]}")
                    tensors.setdefault(tensor, declared)
                    self.holders_of.setdefault(tensor, []).append(name)
        # One union per index kind, however many groups use it.
        unions = {
            index: union_alignment({n: replies[n].arrays[f"{index}_digests"] for n in self.clients})
            for index in sorted({i for i in index_of.values() if i is not None})
        }
        self.alignments = {g: None if i is None else unions[i] for g, i in index_of.items()}
        self._holder_counts = {}
        self.table = {}
        for t, s in tensors.items():
            a = self.alignments[self.group_of[t]]
            init = InitSpec.from_json(s["init"])
            if a is None:  # drawn as one row keyed by the tensor's name alone (the salt)
                self.table[t] = initial_rows(WHOLE, s["shape"], init, self.cfg.seed, t)[0]
            else:
                self.table[t] = initial_rows(a.digests, s["shape"], init, self.cfg.seed, t)

    # ---------------------------------------------------------------- rounds
    def client_index(self, tensor: str, name: str) -> Tensor | None:
        """``idx_c`` of client ``name``'s rows of ``tensor``, or None for a tensor shared whole."""
        a = self.alignments[self.group_of[tensor]]
        return None if a is None else a.index[name]

    def rows(self, name: str) -> dict[str, Tensor]:
        """``E[idx_c]`` of every shared tensor client ``name`` declares (a whole tensor as is)."""
        out = {}
        for t, table in self.table.items():
            if name in self.holders_of[t]:
                idx = self.client_index(t, name)
                out[t] = table.clone() if idx is None else table[idx]
        return out

    def download(self, name: str) -> dict[str, Tensor]:
        """:meth:`rows`, and under ``named_rows`` which of them the client takes: those the
        last aggregation averaged (all of them before the first)."""
        arrays = self.rows(name)
        if self.aggregation == "named_rows":
            for g in sorted({self.group_of[t] for t in arrays}):
                if self.alignments[g] is None:  # shared whole: always taken
                    continue
                idx, named = self.alignments[g].index[name], self.named.get(g)
                arrays[NAMED + g] = (torch.ones(len(idx), dtype=torch.uint8) if named is None
                                     else named[idx].to(torch.uint8))
        return arrays

    def configure_train(self, round, selected):
        return {name: Message(arrays=self.download(name)) for name in selected}

    def aggregate_train(self, round, replies, failures) -> None:
        """Holder-mean of the uploads into each table (FedE Eq. 2), over the parties that
        hold the tensor and answered."""
        for t, table in self.table.items():
            order = [n for n in self.holders_of[t] if n in replies]
            if not order:
                continue
            whole = self.alignments[self.group_of[t]] is None
            if whole:
                # A whole tensor is a one-row table that every holder holds: the same
                # float64 sums, hence the same exactness, as the row-indexed case.
                table = table.unsqueeze(0)
                indices = [ONE_ROW] * len(order)
                rows = [replies[n].arrays[t].unsqueeze(0) for n in order]
            elif self.aggregation == "named_rows":  # each client's named rows only
                g = self.group_of[t]
                named = [replies[n].arrays[NAMED + g].bool() for n in order]
                indices = [self.client_index(t, n)[m] for n, m in zip(order, named)]
                rows = [replies[n].arrays[t][m] for n, m in zip(order, named)]
            else:
                indices = [self.client_index(t, n) for n in order]
                rows = [replies[n].arrays[t] for n in order]
            sums, counts = holder_sums(table.shape[0], indices, rows, device=table.device)
            if self.aggregation == "named_rows" and not whole:
                self.named[self.group_of[t]] = counts.cpu() > 0
            self.apply_sums(t, sums, counts)

    def apply_sums(self, tensor: str, sums: Tensor, counts: Tensor) -> None:
        """Replace table ``tensor`` by the holder-mean of per-row upload sums (float64,
        ``[N, ...]``, ``[1, ...]`` for a tensor shared whole) and upload counts (``[N]``):
        the one place the aggregate enters the table, from plain uploads
        (:meth:`aggregate_train`) or from masked ones (:mod:`~lightning_fedkg.privacy.secure`)."""
        table = self.table[tensor]
        whole = self.alignments[self.group_of[tensor]] is None
        base = table.unsqueeze(0) if whole else table
        if self.aggregation == "all_holders":
            new = damped_mean_from_sums(base, sums, counts, self.holder_counts(tensor))
        else:
            new = mean_from_sums(base, sums, counts)
        self.table[tensor] = new[0] if whole else new

    def holder_counts(self, tensor: str) -> Tensor:
        """``N_i`` of tensor ``tensor``: how many parties hold row ``i`` of it (computed once;
        one entry, the number of holders, for a tensor shared whole)."""
        if tensor not in self._holder_counts:
            a = self.alignments[self.group_of[tensor]]
            holders = self.holders_of[tensor]
            if a is None:
                self._holder_counts[tensor] = holder_counts(1, [ONE_ROW] * len(holders))
            else:
                self._holder_counts[tensor] = holder_counts(a.size, [a.index[n] for n in holders])
        return self._holder_counts[tensor]

    def configure_evaluate(self, round, split):
        """Each client evaluates with the aggregated rows and its own other tables."""
        return {name: Message(arrays=self.download(name), config={"split": split}) for name in self.clients}

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        """Tables, alignments (one entry per index kind, named by its groups), holders.

        Plain containers of tensors, loadable with ``torch.load(weights_only=True)``.
        """
        state = super().state_dict()
        state["table"] = {t: v.clone() for t, v in self.table.items()}
        packed: dict[int, dict] = {}  # groups sharing an alignment share one entry (saved once)
        state["alignments"] = {
            g: None if a is None else packed.setdefault(
                id(a), {"digests": a.digests, "index": a.index, "holders": a.holders})
            for g, a in self.alignments.items()
        }
        state["group_of"] = dict(self.group_of)
        state["holders_of"] = {t: list(v) for t, v in self.holders_of.items()}
        state["named"] = {g: m.clone() for g, m in self.named.items()}
        return state

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        self.table = {t: v.clone() for t, v in state["table"].items()}
        stored, self.group_of = state["alignments"], dict(state["group_of"])
        built: dict[int, Alignment] = {}  # entries that were shared are shared again
        self.alignments = {
            g: None if a is None else built.setdefault(id(a), Alignment(a["digests"], dict(a["index"]), a["holders"]))
            for g, a in stored.items()
        }
        self.holders_of = {t: list(v) for t, v in state["holders_of"].items()}
        self.named = {g: m.clone() for g, m in state.get("named", {}).items()}
        self._holder_counts = {}
