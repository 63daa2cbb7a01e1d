"""Distributed retrieval of cross-graph queries (FedCQA §4.2, Eq. 5–6).

No client holds a cross-graph query's graph and no row may leave its client, so the server
routes the computation: clients send keyed hashes of their names (**keys**), each
projection runs at the client that owns its relation (**hops**), and every client scores its
own entities, the tables are holder-averaged and the answers ranked (**score**). Under
``task.retrieval: paper`` the server sees the states and tables (enough to rebuild the rows);
under ``private`` (default) they cross sealed and padded (:mod:`.sealed`) and a querying
client ranks, so the server sees keys, ciphertext, padded sums and per-query metrics (or a
typed query's top answers). A query no client
can route is never sent and counts as unanswered. The mixins run as evaluation stages on
the ``test`` split: :class:`RetrievalServer` schedules the steps and seals, :mod:`.routing`
routes the hops, :mod:`.tally` counts the answers, :mod:`.retrieval_client` is the client's
half. See docs/methods/fedcqa.md.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedkg.federated.alignment import federation_key, hash_names
from lightning_fedkg.federated.message import Message

from .config import cache_dir, query_settings
from .entries import QUERY_METRICS, by_type
from .module import ENCODERS
from .queries import STRUCTURES, anchors_and_relations, relation_owners
from .routing import Routing
from .sealed import add_words
from .tally import Tally, live_answers, mean_by_type

__all__ = ["CrossQueries", "issue_cross_queries", "digest_keys", "stage_plan", "UnroutableQuery", "explain_lacks",
           "RetrievalServer"]

log = logging.getLogger("lightning_fedkg")

STEP = "cq_step"


def digest_keys(digests: Tensor) -> Tensor:
    """``int64 [n]``: the first 8 bytes of each keyed hash ``uint8 [n, 32]``."""
    return digests[:, :8].contiguous().view(torch.int64).reshape(-1)


@dataclass
class CrossQueries:
    """Cross-graph queries of one structure as the server gets them: ``keys [Q, slots]``
    (entity keys at anchor slots, relation keys at relation slots), ``inverse [Q, slots]``
    (1 where a relation is used backwards), answers as keys in CSR form."""

    structure: str
    keys: Tensor
    inverse: Tensor
    hard_offsets: Tensor
    hard_keys: Tensor
    easy_offsets: Tensor
    easy_keys: Tensor

    def __len__(self) -> int:
        return int(self.keys.shape[0])


def global_names(fkg, kind: str) -> list[str]:
    """The names clients align ``kind`` by, per global id (as parties name their items)."""
    names = fkg.entity_names if kind == "entity" else fkg.relation_names
    count = fkg.num_entities if kind == "entity" else fkg.num_relations
    return list(names) if names else [f"{kind}:{g}" for g in range(count)]


def issue_cross_queries(cfg, fkg) -> dict[str, CrossQueries] | None:
    """The evaluator's cross-graph test set for the server, as keyed hashes; None when the
    federation has one client, ``task.cross_per_type`` is 0, or clients share relations
    (a cross-graph query is defined by relation ownership)."""
    tc = cfg.task
    if tc.cross_per_type == 0 or len(fkg.clients) < 2:
        return None
    try:
        relation_owners(fkg)
    except ValueError as err:
        log.warning("no cross-graph queries: %s", err)
        return None
    key = federation_key(cfg.federated.federation_key, cfg.seed)
    entity_keys = digest_keys(hash_names(global_names(fkg, "entity"), key))
    relation_keys = digest_keys(hash_names(global_names(fkg, "relation"), key))
    from lightning_fedkg.methods.fedcqa.query_sets import cross_query_sets

    out = {}
    for name, qs in cross_query_sets(fkg, query_settings(tc), cache_dir(tc)).items():
        anchors, relations = anchors_and_relations(STRUCTURES[name])
        keys = torch.zeros_like(qs.queries)
        inverse = torch.zeros_like(qs.queries)
        keys[:, anchors] = entity_keys[qs.queries[:, anchors]]
        keys[:, relations] = relation_keys[qs.queries[:, relations] // 2]
        inverse[:, relations] = qs.queries[:, relations] % 2
        out[name] = CrossQueries(name, keys, inverse, qs.hard_offsets, entity_keys[qs.hard_ids],
                                 qs.easy_offsets, entity_keys[qs.easy_ids])
    return out



def stage_plan(expr) -> tuple[list[list[tuple[int, object, int]]], object]:
    """Split a plan (:func:`~lightning_fedkg.methods.fedcqa.encoders.tree_plan`'s form) into
    hops and a root: ``hops[h]`` lists ``(node id, input, relation slot)`` of the
    projections ``h + 1`` deep, whose input refers to earlier projections as ``("s", id)``;
    the root is the plan's top with its projections so replaced."""
    nodes: list[tuple[int, object, int]] = []

    def visit(e):
        kind = e[0]
        if kind == "a":
            return e, 0
        if kind == "p":
            inner, level = visit(e[1])
            nodes.append((level + 1, inner, e[2]))
            return ("s", len(nodes) - 1), level + 1
        children = [visit(c) for c in e[1]]
        return (kind, [c for c, _ in children]), max(level for _, level in children)

    root, depth = visit(expr)
    hops = [[(i, inner, slot) for i, (level, inner, slot) in enumerate(nodes) if level == h]
            for h in range(1, depth + 1)]
    return hops, root



class UnroutableQuery(ValueError):
    """A query no client can route; ``lacks`` lists, per failed projection, the ``client``
    that owns its relation (None: no client does), the ``relation`` key, ``inverse``, and
    the ``entity`` key the owner does not hold (None when the relation is unknown)."""

    def __init__(self, lacks: list[dict]) -> None:
        super().__init__(f"no client can route the query ({len(lacks)} projection(s) lack a holder)")
        self.lacks = lacks


def explain_lacks(cfg, fkg, lacks: list[dict]) -> list[str]:
    """:class:`UnroutableQuery`'s ``lacks`` in names, one line per distinct reason (for
    whoever holds the federation key: it turns keys back into names)."""
    key = federation_key(cfg.federated.federation_key, cfg.seed)
    names = {kind: dict(zip(digest_keys(hash_names(global_names(fkg, kind), key)).tolist(), global_names(fkg, kind)))
             for kind in ("entity", "relation")}
    lines = []
    for lack in lacks:
        relation = f"{'r-' if lack['inverse'] else 'r'}:{names['relation'].get(lack['relation'], '?')}"
        if lack["client"] is None:
            line = f"no client owns relation {relation}"
        else:
            line = (f"{lack['client']} owns relation {relation} but does not hold entity "
                    f"e:{names['entity'].get(lack['entity'], '?')}, where that projection starts")
        if line not in lines:
            lines.append(line)
    return lines




class RetrievalServer:
    """Server mixin: cross-graph queries answered by distributed retrieval after the
    in-graph evaluation; ``report()`` adds ``"in_graph"`` and ``"cross_graph"``.

    ``task.retrieval: private`` seals states and pads score tables (:mod:`.sealed`); the
    querier (the first client) unmasks the holder-mean and returns each query's metrics, or
    the top ``task.reveal_top`` of a typed query (its own setting).
    ``paper``: states and tables in clear (Eq. 5–6)."""

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        self.cross: dict[str, CrossQueries] = ctx.evaluation_data or {}
        self.encoder_class = ENCODERS[ctx.cfg.task.encoder]
        self.private = ctx.cfg.task.retrieval == "private"
        if self.private and self.cross and not ctx.cfg.federated.federation_key:
            log.warning("task.retrieval=private seals under the federation key, derived from the seed without "
                        "federated.federation_key: fine in simulation, guessable otherwise (set your own)")
        self.batch = int(ctx.cfg.train.eval_batch_size)
        self.steps = self._schedule()
        self.routing = Routing(self.private)
        self.tally = Tally()
        self.cursor = 0
        self.in_graph: tuple[dict, list[dict]] | None = None

    @property
    def directory(self) -> dict | None:
        """The keys step's directory (:meth:`.routing.Routing.build_directory`)."""
        return self.routing.directory

    @property
    def querier(self) -> str:
        """The client that takes the pads off and ranks (it holds the federation key)."""
        return self.clients[0]

    def _schedule(self) -> list[tuple]:
        """Every step of one cross-graph evaluation: keys, then per batch its hops, score and
        (private) the querier's reveal."""
        steps: list[tuple] = [("keys",)] if self.cross else []
        for name, cq in sorted(self.cross.items()):
            hops, root = stage_plan(self.encoder_class.plan(name))
            for start in range(0, len(cq), self.batch):
                stop = min(start + self.batch, len(cq))
                steps += [("hop", name, start, stop, h, hops) for h in range(len(hops))]
                steps.append(("score", name, start, stop, root))
                if self.private:
                    steps.append(("reveal", name, start, stop))
        return steps

    @property
    def eval_stages(self) -> tuple[str, ...]:
        return (*super().eval_stages, *(STEP,) * len(self.steps))

    # ---------------------------------------------------------------- in-graph
    def configure_evaluate(self, round, split):
        self.cursor = 0
        return super().configure_evaluate(round, split)

    def aggregate_evaluate(self, round, split, replies, failures):
        self.in_graph = super().aggregate_evaluate(round, split, replies, failures)
        if split == "test" and self.cross:
            self.tally.reset()
            self.routing.states = {}
        return self.in_graph

    # ---------------------------------------------------------------- cross-graph
    def configure_cq_step(self, round, split):
        step = self.steps[self.cursor]
        self._started = time.perf_counter()
        if split != "test":
            return {}
        if self.cursor == 0:
            # a fresh name for this evaluation's batches: the querier reveals each batch once
            self._evaluation = secrets.token_hex(8)
        if step[0] == "keys" and self.directory is not None:
            return {}
        if step[0] == "keys":
            return {name: Message(config={"kind": "keys"}) for name in self.clients}
        name, start, stop = step[1:4]
        cq = self.cross[name]
        if step[0] == "hop":
            if step[4] == 0:
                self.routing.start_batch(stop - start)
            return self.routing.hop_messages(self.clients, cq, start, stop, step[5][step[4]], name)
        if step[0] == "score":
            return self._score_messages(round, name, start, step[4])
        return self._reveal_messages(name, start, stop)

    def _score_messages(self, round: int, name: str, start: int, root) -> dict[str, Message]:
        """The root's inputs for the rows every hop reached, to every client."""
        live = self.routing.finish_hops()
        self._masked: dict[str, tuple[Tensor, Tensor]] = {}  # the clients' padded tables and sealed seeds
        if not len(live):
            return {}
        arrays = self.routing.root_inputs(root)
        config = {"kind": "score", "root": root}
        if not self.private:
            return {c: Message(arrays=arrays, config=config) for c in self.clients}
        d = self.directory
        self._context = f"{self._evaluation}|{round}|{name}|{start}"
        config.update(structure=name, width=int(d["entity_keys"].shape[0]), context=self._context)
        arrays["q"] = start + live
        return {c: Message(arrays={**arrays, "columns": d["entity_index"][c]}, config=config)
                for c in self.clients if c in d["entity_index"]}

    def _reveal_messages(self, name: str, start: int, stop: int) -> dict[str, Message]:
        """The querier gets the sum of the padded tables (their last row counts each
        entity's holders), the sealed pad seeds and the hard and easy answers of the rows
        (none for a typed query: it reveals its top answers)."""
        if not self._masked:
            return {}
        contributors = [c for c in self.clients if c in self._masked]
        arrays = {"total": add_words([self._masked[c][0] for c in contributors]),
                  "seeds": torch.stack([self._masked[c][1] for c in contributors])}
        config = {"kind": "reveal", "contributors": contributors, "context": self._context}
        cq = self.cross[name]
        if cq.hard_keys.numel():
            arrays.update(zip(("hard_rows", "hard_cols", "easy_rows", "easy_cols"),
                              live_answers(cq, start, stop, self.routing.live, self.directory["entity_keys"])))
        return {self.querier: Message(arrays=arrays, config=config)}

    def aggregate_cq_step(self, round, split, replies, failures):
        step = self.steps[self.cursor]
        self.cursor += 1
        if split != "test":
            return self.in_graph
        if step[0] == "keys":
            if replies:
                self.routing.build_directory(self.clients, replies)
            return self.in_graph
        name, start, stop = step[1:4]
        seconds = self.tally.results["seconds"]
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - self._started
        if step[0] == "hop":
            self.routing.collect_hop(replies, start, stop)
            return self.in_graph
        if step[0] == "score" and self.private:
            self._masked = {c: (r.arrays["scores"], r.arrays["seed"]) for c, r in replies.items()}
            return self.in_graph
        if step[0] == "score":
            self.tally.rank(self.cross[name], name, start, stop, replies, self.directory, self.routing.live)
        else:
            self._revealed(name, start, stop, replies.get(self.querier))
        return self.in_graph

    def _revealed(self, name: str, start: int, stop: int, reply: Message | None) -> None:
        """``private``: what the querier revealed of a batch, counted (:meth:`.tally.Tally.revealed`)."""
        self.tally.revealed(self.cross[name], name, start, stop, reply, self.directory["entity_keys"].shape[0],
                            self.routing.live)

    def retrieve(self, exchange, queries: CrossQueries, round: int = 0) -> tuple[Tensor, Tensor]:
        """Answer ``queries`` (one structure, answers not needed) outside an evaluation, with
        ``exchange(round, stage, messages, split=)`` the runner's
        (:meth:`~lightning_fedkg.federated.federation.FederatedRun.exchange`):
        ``(scores [B, N] over the union, the union's entity keys [N])``, the holder-mean
        scores (``paper``) or, under ``private``, the top ``task.reveal_top`` (the querier's
        own setting) that the querier revealed and ``-inf`` elsewhere. Raises
        :class:`UnroutableQuery` when a query cannot be routed (a relation no client owns, an
        owner without the branch's anchor)."""
        saved = self.cross, self.steps, self.cursor, self.tally.results
        self.cross = {queries.structure: queries}
        self.steps, self.cursor = self._schedule(), 0
        self.tally.reset()
        tables, lacks = [], []
        try:
            for step in self.steps:
                replies, failures = exchange(round, STEP, self.configure_cq_step(round, "test"), split="test")
                self.aggregate_cq_step(round, "test", replies, failures)
                if step[0] == ("reveal" if self.private else "score"):
                    tables.append(self.tally.last_scores)
                    lacks += [{**lack, "row": lack["row"] + step[2]} for lack in self.routing.lacks]
        finally:
            self.cross, self.steps, self.cursor, self.tally.results = saved
        if lacks:
            raise UnroutableQuery(lacks)
        return torch.cat(tables), self.directory["entity_keys"]

    def cross_graph(self) -> dict | None:
        """The last test's cross-graph block (:meth:`.tally.Tally.cross_graph`)."""
        return self.tally.cross_graph()

    def test_scalars(self) -> dict[str, float]:
        """``cross_graph/<metric>`` and ``cross_graph/<type>/<metric>`` for the server's TensorBoard."""
        out = dict(super().test_scalars())
        cross = self.cross_graph()
        if cross is not None:
            out.update({f"cross_graph/{k}": cross[k] for k in QUERY_METRICS})
            out.update({f"cross_graph/{name}/{k}": m[k] for name, m in cross["by_type"].items() for k in QUERY_METRICS})
        return out

    def report(self) -> dict:
        out = dict(super().report())
        if self.in_graph is not None:
            avg, per_client = self.in_graph
            out["in_graph"] = {**avg, "by_type": mean_by_type(per_client),
                               "clients": {e["name"]: {k: e[k] for k in QUERY_METRICS} | {"by_type": by_type(e)}
                                           for e in per_client if "failed" not in e}}
        cross = self.cross_graph()
        if cross is not None:
            out["cross_graph"] = cross
        return out


