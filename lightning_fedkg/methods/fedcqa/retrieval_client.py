"""The client's half of distributed retrieval (:mod:`.retrieval`): its keys, the projections
of the relations it owns, its score table over its own entities and, as the querier under
``task.retrieval: private``, the reveal (:mod:`.sealed`)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.privacy import identities
from lightning_fedkg.federated.alignment import hash_names
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.stances import checked, harmless
from lightning_fedkg.federated.strategy import client_name

from .encoders import run_plan
from .entries import QUERY_METRICS
from .structures import STRUCTURES, num_slots
from .ranking import filtered_ranks, per_query_metrics
from .retrieval import digest_keys
from .sealed import RetrievalRefused, mask_scores, open_states, seal_states, unmask_mean

__all__ = ["RetrievalClient"]


def _lookup(own: Tensor, keys: Tensor, what: str, party: str) -> Tensor:
    """Positions in ``own`` (int64 keys, local order) of ``keys``; an unknown key is an error."""
    order = own.argsort()
    ranked = own[order]
    pos = torch.searchsorted(ranked, keys).clamp(max=max(len(ranked) - 1, 0))
    if len(ranked) == 0 or not bool((ranked[pos] == keys).all()):
        raise KeyError(f"{party} was asked about {what} it does not hold")
    return order[pos]



#: The stances of what a retrieval step carries (:mod:`~lightning_fedkg.federated.stances`).
_PRIVATE = "task.retrieval=private"
_SEALED = checked("sealed states: each opens only for its structure, query and node (ChaCha20-Poly1305), "
                  "or the step is refused", when=_PRIVATE)
_WORK = harmless("what the client computes on its own rows and operators (which relation, anchors, plan or "
                 "columns): its output is sealed for the query and node, or padded for the querier, and "
                 "unknown keys are refused. Under retrieval: paper it crosses in clear: the server rebuilds "
                 "every row (documented)")


class RetrievalClient:
    """Client mixin: answers the server's retrieval steps with its own rows and operators;
    under ``task.retrieval: private`` it opens and seals states, pads its score table and,
    as the querier, takes the pads off and ranks (:mod:`.sealed`).

    What the querier reveals it decides from its own config, never from a value the server
    sends: whose tables must be in the sum (every member of the federation), how many
    holders each entity has (from the tables), how much it returns per query (the metrics,
    or ``task.reveal_top`` answers), and each batch once (:meth:`spent_state`)."""

    RECEIVES = {"cq_step": {
        "config.kind": harmless("which retrieval step: each answers only with what that step seals or pads"),
        "config.structure": _WORK, "config.nodes": _WORK, "config.root": _WORK, "config.width": _WORK,
        "arrays.{n}:rel": _WORK, "arrays.{n}:inv": _WORK, "arrays.{n}:a{n}": _WORK, "arrays.columns": _WORK,
        "arrays.{n}:q": checked("the queries the states are sealed for: a state opens for its own only", when=_PRIVATE),
        "arrays.q": checked("the queries of a score batch: sealed inputs open for their own only, and a batch "
                            "naming one query twice is refused", when=_PRIVATE),
        "arrays.{n}:s{n}": _SEALED, "arrays.s{n}": _SEALED,
        "config.context": checked("the batch a padded table and its sealed seed are bound to; the querier "
                                  "reveals each batch once (spent state)", when=_PRIVATE),
        "config.contributors": checked("the querier unpads only a sum naming every member it knows (its roster, "
                                       "else its own data.num_clients)", when=_PRIVATE),
        "arrays.seeds": checked("sealed for the querier under (batch, member): one that opens for no named member "
                                "is refused", when=_PRIVATE),
        "arrays.total": harmless("the padded sum: anything but every member's tables for this batch unpads to "
                                 "noise, whose holder counts fall outside [0, members] and are refused; a constant "
                                 "added to it shifts the scores (integrity is not protected)", when=_PRIVATE),
        **{f"arrays.{k}": harmless("the answers to rank: whatever the server lists, the querier returns four "
                                   "numbers per query (or its own reveal_top answers)", when=_PRIVATE)
           for k in ("hard_rows", "hard_cols", "easy_rows", "easy_cols")},
    }}

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        #: The batch contexts this client revealed as the querier: never revealed again.
        self.revealed_contexts: set[str] = set()

    def _own_keys(self, kind: str) -> Tensor:
        cache = self.__dict__.setdefault("_retrieval_keys", {})
        if kind not in cache:
            cache[kind] = digest_keys(hash_names(self.party.names[kind], self._key))
        return cache[kind]

    def on_evaluate(self, message: Message, round: int) -> Message:
        reply = super().on_evaluate(message, round)
        split = message.config["split"]
        self.party.log({f"{split}/{k}": v for k, v in reply.metrics.items()
                        if "/" in k and not k.endswith("/queries")}, round)
        return reply

    @torch.no_grad()
    def on_cq_step(self, message: Message, round: int) -> Message:
        kind = message.config["kind"]
        if kind == "keys":
            return Message(arrays={"entity": self._own_keys("entity"), "relation": self._own_keys("relation")})
        if kind == "reveal":
            return Message(arrays=self._reveal(message))
        module = self.party.module
        was_training = module.training
        module.eval()
        try:
            if kind == "project":
                return Message(arrays=self._project(message))
            scores = self._score(message)
            if "columns" not in message.arrays:
                return Message(arrays={"scores": scores})
            words, seed = mask_scores(self._key, scores, message.arrays["columns"], message.config["width"],
                                      f"{message.config['context']}|{self.party.name}")
            return Message(arrays={"scores": words, "seed": seed})
        finally:
            module.train(was_training)

    # ---------------------------------------------------------------- what never goes back
    def spent_state(self) -> dict:
        """The parent's, plus ``revealed_contexts``: the batches revealed as the querier."""
        return {**super().spent_state(), "revealed_contexts": sorted(self.revealed_contexts)}

    def load_spent_state(self, state: dict) -> None:
        """Add an earlier process's revealed contexts to this one's (never fewer)."""
        super().load_spent_state(state)
        self.revealed_contexts.update(str(c) for c in state.get("revealed_contexts", ()))

    def _members(self) -> list[str]:
        """The federation's clients as this client holds them itself: its identity roster
        where it has one (a Flower client's config came from the server at registration),
        else its own config (``client_k`` for k below ``data.num_clients``)."""
        folder = getattr(self.party, "identities", None)
        if identities.has_roster(folder):
            return sorted(identities.read_roster(folder).members)
        return [client_name(k) for k in range(int(self.party.cfg.data.num_clients))]

    def _state(self, message: Message, name: str, queries: Tensor | None, node: int) -> Tensor:
        """The state ``name`` of ``message``: as it came, or opened when sealed."""
        state = message.arrays[name]
        if queries is None:
            return state
        return open_states(self._key, message.config["structure"], queries, node, state, self.party.cfg.model.dim)

    def _project(self, message: Message) -> dict[str, Tensor]:
        encoder, device = self.party.module.encoder, self.party.module.device
        structure = message.config["structure"]
        slots = num_slots(STRUCTURES[structure])
        out = {}
        for node in message.config["nodes"]:
            nid = node["id"]
            rel = message.arrays[f"{nid}:rel"]
            queries = message.arrays.get(f"{nid}:q")
            rows = torch.zeros(rel.shape[0], slots, dtype=torch.long)
            local = _lookup(self._own_keys("relation"), rel, "a relation", self.party.name)
            rows[:, node["slot"]] = 2 * local + message.arrays[f"{nid}:inv"].long()
            for a in node["anchors"]:
                rows[:, a] = _lookup(self._own_keys("entity"), message.arrays[f"{nid}:a{a}"], "an entity",
                                     self.party.name)
            states = {str(r): self._state(message, f"{nid}:s{r}", queries, r).to(device) for r in node["refs"]}
            rows = rows.to(device)
            state = encoder.project_state(run_plan(encoder, node["input"], rows, states), rows[:, node["slot"]])
            state = state.float().cpu()
            out[str(nid)] = state if queries is None else seal_states(self._key, structure, queries, nid, state)
        return out

    def _score(self, message: Message) -> Tensor:
        encoder, device = self.party.module.encoder, self.party.module.device
        queries = message.arrays.get("q")
        if queries is not None and len(torch.unique(queries)) != len(queries):
            # one query in several rows of a batch would let the server ask the querier's
            # per-query reveal about it several times over
            raise RetrievalRefused(f"{self.party.name}: a score batch names a query in more than one row "
                                   f"({len(queries)} rows, {len(torch.unique(queries))} queries)")
        states = {k[1:]: self._state(message, k, queries, int(k[1:])).to(device)
                  for k in message.arrays if k.startswith("s")}
        query = encoder.output(run_plan(encoder, message.config["root"], None, states))
        return encoder.score(query).float().cpu()

    def _reveal(self, message: Message) -> dict[str, Tensor]:
        """The querier: the holder-mean from the padded sum, then per query what the server
        may see: its metrics (``float32 [rows, len(QUERY_METRICS)]``, columns in
        :data:`QUERY_METRICS` order) or, without answers to rank (``fedkg query``), its top
        ``task.reveal_top`` answers and their scores. Raises :class:`RetrievalRefused`
        unless this client is the querier, every member contributed, the batch is new and
        the holder counts are in range.

        Why every member suffices against a server that sends one client's table alone
        (the review's attack): a pad is taken off only where its seed is given, a seed opens
        only under the context and the member it was sealed for, and a pad not cancelled
        exactly once leaves its words uniform, which the holder-count row refuses (a count
        passes with probability (members + 1) / 2^64 per entity). So an accepted total holds
        every member's padded table for this context, and no one table can pose as the
        whole. What the server gets is bounded per query, whatever the total holds."""
        a, config = message.arrays, message.config
        members = self._members()
        if self.party.name != client_name(0):
            raise RetrievalRefused(f"{self.party.name} was asked to reveal a batch, but the querier is "
                                   f"{client_name(0)} (the first client)")
        contributors = [str(c) for c in config["contributors"]]
        if sorted(contributors) != sorted(members):
            problems = [f"lack {sorted(set(members) - set(contributors))}",
                        f"name non-members {sorted(set(contributors) - set(members))}", "repeat a member"]
            wrong = [set(members) - set(contributors), set(contributors) - set(members),
                     len(set(contributors)) != len(contributors)]
            raise RetrievalRefused(f"the querier reveals only the sum of every member's table: the contributors "
                                   f"{contributors} {' and '.join(p for p, w in zip(problems, wrong) if w)} "
                                   f"(members by its own config: {members})")
        if a["seeds"].shape[0] != len(contributors):
            raise RetrievalRefused(f"{a['seeds'].shape[0]} sealed seeds for {len(contributors)} contributors")
        context = str(config["context"])
        if context in self.revealed_contexts:
            raise RetrievalRefused(f"batch {context!r} was revealed once already; the querier reveals a batch once")
        self.revealed_contexts.add(context)  # spent on trying: a refused total gets no second try
        seeds = [(a["seeds"][i], f"{context}|{c}") for i, c in enumerate(contributors)]
        scores = unmask_mean(self._key, a["total"], seeds, len(members))
        if "hard_rows" not in a:
            best = scores.topk(min(int(self.party.cfg.task.reveal_top), scores.shape[1]))
            return {"top": best.indices, "values": best.values}
        ranks = filtered_ranks(scores, a["hard_rows"], a["hard_cols"], a["easy_rows"], a["easy_cols"])
        metrics = per_query_metrics(ranks, a["hard_rows"], scores.shape[0])
        return {"metrics": torch.stack([metrics[k] for k in QUERY_METRICS], 1)}
