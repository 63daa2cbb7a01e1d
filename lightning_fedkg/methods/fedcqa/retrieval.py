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
the ``test`` split. See docs/methods/fedcqa.md.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedkg.privacy import identities
from lightning_fedkg.federated.aggregation import holder_mean
from lightning_fedkg.federated.alignment import federation_key, hash_names
from lightning_fedkg.federated.message import Message
from lightning_fedkg.privacy.stances import checked, harmless
from lightning_fedkg.federated.strategy import client_name

from .config import cache_dir, query_settings
from .encoders import run_plan
from .entries import QUERY_METRICS, by_type
from .module import ENCODERS
from .queries import STRUCTURES, anchors_and_relations, num_slots, relation_owners
from .ranking import filtered_ranks, per_query_metrics
from .sealed import RetrievalRefused, add_words, mask_scores, open_states, seal_states, unmask_mean

__all__ = ["CrossQueries", "issue_cross_queries", "digest_keys", "stage_plan", "UnroutableQuery", "explain_lacks",
           "RetrievalServer", "RetrievalClient"]

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


def _leaves(expr, kind: str) -> list[int]:
    """Slot positions (``"a"``) or state ids (``"s"``) an input expression reads."""
    if expr[0] == kind:
        return [int(expr[1])]
    if expr[0] in ("a", "s"):
        return []
    if expr[0] == "p":
        return _leaves(expr[1], kind)
    return [x for c in expr[1] for x in _leaves(c, kind)]


def _lookup(own: Tensor, keys: Tensor, what: str, party: str) -> Tensor:
    """Positions in ``own`` (int64 keys, local order) of ``keys``; an unknown key is an error."""
    order = own.argsort()
    ranked = own[order]
    pos = torch.searchsorted(ranked, keys).clamp(max=max(len(ranked) - 1, 0))
    if len(ranked) == 0 or not bool((ranked[pos] == keys).all()):
        raise KeyError(f"{party} was asked about {what} it does not hold")
    return order[pos]


def _member(ranked: Tensor | None, keys: Tensor) -> Tensor:
    """Whether each of ``keys`` is in the sorted ``ranked`` (None: an empty set)."""
    if ranked is None or len(ranked) == 0:
        return torch.zeros(keys.shape, dtype=torch.bool)
    pos = torch.searchsorted(ranked, keys.contiguous()).clamp(max=len(ranked) - 1)
    return ranked[pos] == keys


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
        self.directory = None
        self.cursor = 0
        self.in_graph: tuple[dict, list[dict]] | None = None
        self.results: dict | None = None

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
            self.results = {"by_type": {}, "unanswered": 0, "seconds": {}}
            self._states: dict = {}
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
                self._states = {}
                self._failed = torch.zeros(stop - start, dtype=torch.bool)
                self._lacks: list[dict] = []
            return self._hop_messages(cq, start, stop, step[5][step[4]])
        if step[0] == "score":
            return self._score_messages(round, name, start, step[4])
        return self._reveal_messages(name, start, stop)

    def _hop_messages(self, cq: CrossQueries, start: int, stop: int, nodes) -> dict[str, Message]:
        keys, inverse = cq.keys[start:stop], cq.inverse[start:stop]
        owner_of, relation_keys = self.directory["relation_owner"], self.directory["relation_keys"]
        self._routes = {}
        messages: dict[str, dict] = {}
        for node, inner, slot in nodes:
            pos = torch.searchsorted(relation_keys, keys[:, slot].contiguous()).clamp(max=len(relation_keys) - 1)
            known = relation_keys[pos] == keys[:, slot]
            owner = torch.where(known, owner_of[pos], -1)
            self._note_lacks(~known & ~self._failed, None, keys, inverse, slot, None)
            self._failed |= ~known
            # the owner must hold the branch's anchors: a row it cannot start is not sent
            for a in _leaves(inner, "a"):
                for k, client in enumerate(self.clients):
                    mine = (owner == k) & ~self._failed
                    lacking = mine & ~_member(self.directory["held"].get(client), keys[:, a])
                    self._note_lacks(lacking, client, keys, inverse, slot, a)
                    self._failed |= lacking
            for k, client in enumerate(self.clients):
                rows = ((owner == k) & ~self._failed).nonzero().squeeze(1)
                if not len(rows):
                    continue
                self._routes[(client, node)] = rows
                m = messages.setdefault(client, {"arrays": {}, "nodes": []})
                m["nodes"].append({"id": node, "input": inner, "slot": slot,
                                   "anchors": _leaves(inner, "a"), "refs": _leaves(inner, "s")})
                m["arrays"][f"{node}:rel"] = keys[rows, slot]
                m["arrays"][f"{node}:inv"] = inverse[rows, slot]
                if self.private:  # which queries: the states' keys and associated data
                    m["arrays"][f"{node}:q"] = start + rows
                for a in _leaves(inner, "a"):
                    m["arrays"][f"{node}:a{a}"] = keys[rows, a]
                for ref in _leaves(inner, "s"):
                    m["arrays"][f"{node}:s{ref}"] = self._states[ref][rows]
        return {c: Message(arrays=m["arrays"], config={"kind": "project", "structure": self.steps[self.cursor][1],
                                                        "nodes": m["nodes"]})
                for c, m in messages.items()}

    def _note_lacks(self, rows: Tensor, client, keys: Tensor, inverse: Tensor, slot: int, anchor) -> None:
        """Remember why ``rows`` (bool) cannot be routed (``retrieve`` explains it)."""
        for row in rows.nonzero().squeeze(1).tolist():
            self._lacks.append({"row": row, "client": client, "relation": int(keys[row, slot]),
                                "inverse": int(inverse[row, slot]),
                                "entity": None if anchor is None else int(keys[row, anchor])})

    def _score_messages(self, round: int, name: str, start: int, root) -> dict[str, Message]:
        """The root's inputs for the rows every hop reached, to every client."""
        self._live = (~self._failed).nonzero().squeeze(1)
        self._masked: dict[str, tuple[Tensor, Tensor]] = {}
        if not len(self._live):
            return {}
        arrays = {f"s{i}": self._states[i][self._live] for i in _leaves(root, "s")}
        config = {"kind": "score", "root": root}
        if not self.private:
            return {c: Message(arrays=arrays, config=config) for c in self.clients}
        d = self.directory
        self._context = f"{self._evaluation}|{round}|{name}|{start}"
        config.update(structure=name, width=int(d["entity_keys"].shape[0]), context=self._context)
        arrays["q"] = start + self._live
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
                              self._live_answers(cq, start, stop)))
        return {self.querier: Message(arrays=arrays, config=config)}

    def aggregate_cq_step(self, round, split, replies, failures):
        step = self.steps[self.cursor]
        self.cursor += 1
        if split != "test":
            return self.in_graph
        if step[0] == "keys":
            if replies:
                self._build_directory(replies)
            return self.in_graph
        name, start, stop = step[1:4]
        seconds = self.results["seconds"]
        seconds[name] = seconds.get(name, 0.0) + time.perf_counter() - self._started
        if step[0] == "hop":
            for (client, node), rows in self._routes.items():
                if client not in replies:
                    self._failed[rows] = True
                    continue
                state = replies[client].arrays[str(node)]
                if node not in self._states:
                    # rows routed elsewhere stay NaN (paper) or zero bytes (private; never forwarded)
                    shape = (stop - start, *state.shape[1:])
                    self._states[node] = torch.zeros(shape, dtype=torch.uint8) if self.private else \
                        torch.full(shape, float("nan"))
                self._states[node][rows] = state if self.private else state.float()
            return self.in_graph
        if step[0] == "score" and self.private:
            self._masked = {c: (r.arrays["scores"], r.arrays["seed"]) for c, r in replies.items()}
            return self.in_graph
        if step[0] == "score":
            self._rank(name, start, stop, replies)
        else:
            self._revealed(name, start, stop, replies.get(self.querier))
        return self.in_graph

    def _build_directory(self, replies: dict[str, Message]) -> None:
        """Union of the entity keys (a row per entity, Eq. 6's table), each relation's owner
        and each client's entity keys, sorted (whether it can start a branch)."""
        clients = [c for c in self.clients if c in replies]
        entity = torch.cat([replies[c].arrays["entity"] for c in clients])
        union, inverse = torch.unique(entity, return_inverse=True)
        index, start = {}, 0
        for c in clients:
            n = replies[c].arrays["entity"].shape[0]
            index[c], start = inverse[start:start + n], start + n
        relation = torch.cat([replies[c].arrays["relation"] for c in clients])
        owner = torch.cat([torch.full((replies[c].arrays["relation"].shape[0],), self.clients.index(c))
                           for c in clients])
        order = relation.argsort()
        self.directory = {"entity_keys": union, "entity_index": index,
                          "relation_keys": relation[order], "relation_owner": owner[order],
                          "held": {c: replies[c].arrays["entity"].sort().values for c in clients}}

    def retrieve(self, exchange, queries: CrossQueries, round: int = 0) -> tuple[Tensor, Tensor]:
        """Answer ``queries`` (one structure, answers not needed) outside an evaluation, with
        ``exchange(round, stage, messages, split=)`` the runner's
        (:meth:`~lightning_fedkg.federated.federation.FederatedRun.exchange`):
        ``(scores [B, N] over the union, the union's entity keys [N])``, the holder-mean
        scores (``paper``) or, under ``private``, the top ``task.reveal_top`` (the querier's
        own setting) that the querier revealed and ``-inf`` elsewhere. Raises
        :class:`UnroutableQuery` when a query cannot be routed (a relation no client owns, an
        owner without the branch's anchor)."""
        saved = self.cross, self.steps, self.cursor, self.results
        self.cross = {queries.structure: queries}
        self.steps, self.cursor = self._schedule(), 0
        self.results = {"by_type": {}, "unanswered": 0, "seconds": {}}
        tables, lacks = [], []
        try:
            for step in self.steps:
                replies, failures = exchange(round, STEP, self.configure_cq_step(round, "test"), split="test")
                self.aggregate_cq_step(round, "test", replies, failures)
                if step[0] == ("reveal" if self.private else "score"):
                    tables.append(self.last_scores)
                    lacks += [{**lack, "row": lack["row"] + step[2]} for lack in self._lacks]
        finally:
            self.cross, self.steps, self.cursor, self.results = saved
        if lacks:
            raise UnroutableQuery(lacks)
        return torch.cat(tables), self.directory["entity_keys"]

    def _live_answers(self, cq: CrossQueries, start: int, stop: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Hard and easy answers of the routed rows, as (row among them, union column)."""
        at = torch.full((stop - start,), -1, dtype=torch.long)
        at[self._live] = torch.arange(len(self._live))
        out = []
        for offsets, keys in ((cq.hard_offsets, cq.hard_keys), (cq.easy_offsets, cq.easy_keys)):
            rows, cols = self._answers(offsets, keys, start, stop)
            keep = at[rows] >= 0
            out += [at[rows][keep], cols[keep]]
        return tuple(out)

    def _rank(self, name: str, start: int, stop: int, replies: dict[str, Message]) -> None:
        """``paper``: holder-mean of the clients' score tables (Eq. 6), then filtered ranks of
        the hard answers."""
        d = self.directory
        n, b = d["entity_keys"].shape[0], stop - start
        # the union's rows are entities: each client's table [b, n_c] is its rows transposed;
        # an entity no answering client holds keeps -inf (never ranked above a held one)
        clients = list(replies)
        live = self._live
        scores = torch.full((b, n), float("nan"), dtype=torch.float64)
        if len(live) and clients:
            scores[live] = holder_mean(torch.full((n, len(live)), float("-inf"), dtype=torch.float64),
                                       [d["entity_index"][c] for c in clients],
                                       [replies[c].arrays["scores"].double().T for c in clients]).T
        self.last_scores = scores
        cq = self.cross[name]
        if cq.hard_keys.numel() == 0:  # a query to answer, not to evaluate
            return
        if not len(live) or not clients:
            self.results["unanswered"] += b
            return
        hard_rows, hard_cols, easy_rows, easy_cols = self._live_answers(cq, start, stop)
        ranks = filtered_ranks(scores[live], hard_rows, hard_cols, easy_rows, easy_cols)
        self._count(name, b, per_query_metrics(ranks, hard_rows, len(live)), ~torch.isnan(scores[live]).any(1))

    def _revealed(self, name: str, start: int, stop: int, reply: Message | None) -> None:
        """``private``: the querier's metrics per routed query (``float32 [rows,
        len(QUERY_METRICS)]``) or a typed query's top answers."""
        b, n = stop - start, self.directory["entity_keys"].shape[0]
        self.last_scores = torch.full((b, n), float("nan"), dtype=torch.float64)
        cq = self.cross[name]
        if cq.hard_keys.numel() == 0:
            if reply is not None:
                revealed = torch.full((len(self._live), n), float("-inf"), dtype=torch.float64)
                revealed.scatter_(1, reply.arrays["top"], reply.arrays["values"])
                self.last_scores[self._live] = revealed
            return
        if reply is None:  # nothing routed, or the querier failed: the batch is unanswered
            self.results["unanswered"] += b
            return
        values = reply.arrays["metrics"]
        if tuple(values.shape) != (len(self._live), len(QUERY_METRICS)):
            raise ValueError(f"the querier's metrics have shape {tuple(values.shape)}, not "
                             f"({len(self._live)}, {len(QUERY_METRICS)}) (routed rows, metrics)")
        metrics = {k: values[:, i] for i, k in enumerate(QUERY_METRICS)}
        self._count(name, b, metrics, torch.ones(len(self._live), dtype=torch.bool))

    def _count(self, name: str, b: int, metrics: dict[str, Tensor], answered: Tensor) -> None:
        """Add the ``answered`` routed rows' ``metrics`` (:func:`per_query_metrics`' form) to
        the type's sums; the other rows of the ``b`` are unanswered."""
        entry = self.results["by_type"].setdefault(name, {**{k: 0.0 for k in QUERY_METRICS}, "queries": 0})
        for k in QUERY_METRICS:
            entry[k] += float(metrics[k][answered].sum())
        entry["queries"] += int(answered.sum())
        self.results["unanswered"] += b - int(answered.sum())

    def _answers(self, offsets: Tensor, keys: Tensor, start: int, stop: int) -> tuple[Tensor, Tensor]:
        """CSR answers of queries ``start..stop-1`` as (row, union column), unknown keys dropped."""
        counts = offsets[start + 1:stop + 1] - offsets[start:stop]
        rows = torch.repeat_interleave(torch.arange(stop - start), counts)
        wanted = keys[offsets[start]:offsets[stop]]
        union = self.directory["entity_keys"]
        pos = torch.searchsorted(union, wanted).clamp(max=len(union) - 1)
        found = union[pos] == wanted
        return rows[found], pos[found]

    # ---------------------------------------------------------------- report
    def cross_graph(self) -> dict | None:
        """The last test's cross-graph block: means over types, ``by_type``, ``unanswered``,
        ``seconds`` per type (retrieval wall time, all steps)."""
        if not self.results:
            return None
        per_type = {}
        for name, e in self.results["by_type"].items():
            q = max(e["queries"], 1)
            per_type[name] = {**{k: e[k] / q for k in QUERY_METRICS}, "queries": e["queries"]}
        block = {k: sum(m[k] for m in per_type.values()) / max(len(per_type), 1) for k in QUERY_METRICS}
        return {**block, "by_type": per_type, "unanswered": self.results["unanswered"],
                "seconds": {k: round(v, 4) for k, v in self.results["seconds"].items()}}

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
            out["in_graph"] = {**avg, "by_type": _mean_by_type(per_client),
                               "clients": {e["name"]: {k: e[k] for k in QUERY_METRICS} | {"by_type": by_type(e)}
                                           for e in per_client if "failed" not in e}}
        cross = self.cross_graph()
        if cross is not None:
            out["cross_graph"] = cross
        return out


def _mean_by_type(per_client: list[dict]) -> dict:
    """Per type, the clients' metrics averaged with their numbers of queries as weights."""
    totals: dict = {}
    for entry in per_client:
        for name, m in by_type(entry).items():
            t = totals.setdefault(name, {**{k: 0.0 for k in QUERY_METRICS}, "queries": 0})
            for k in QUERY_METRICS:
                t[k] += m[k] * m["queries"]
            t["queries"] += int(m["queries"])
    return {name: {**{k: t[k] / max(t["queries"], 1) for k in QUERY_METRICS}, "queries": t["queries"]}
            for name, t in totals.items()}


#: The stances of what a retrieval step carries (:mod:`~lightning_fedkg.privacy.stances`).
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
