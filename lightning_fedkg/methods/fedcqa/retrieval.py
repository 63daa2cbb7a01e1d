"""Distributed retrieval of cross-graph queries (FedCQA §4.2, Eq. 5–6).

No client holds a cross-graph query's graph and no row may leave its client, so the server
routes the computation: clients send keyed hashes of their names (**keys**), each
projection runs at the client that owns its relation (**hops**), and every client scores its
own entities while the server holder-averages the score tables and ranks (**score**). Only
keys, intermediate query states and score tables cross. The mixins run as evaluation
stages on the ``test`` split. See docs/methods/fedcqa.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_fedkg.federated.aggregation import holder_mean
from lightning_fedkg.federated.alignment import federation_key, hash_names
from lightning_fedkg.federated.message import Message

from .config import cache_dir, query_settings
from .encoders import run_plan
from .entries import QUERY_METRICS, by_type
from .module import ENCODERS
from .queries import STRUCTURES, anchors_and_relations, num_slots, relation_owners
from .ranking import filtered_ranks, per_query_metrics

__all__ = ["CrossQueries", "issue_cross_queries", "digest_keys", "stage_plan", "RetrievalServer", "RetrievalClient"]

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


class RetrievalServer:
    """Server mixin: cross-graph queries answered by distributed retrieval after the
    in-graph evaluation; ``report()`` adds ``"in_graph"`` and ``"cross_graph"``."""

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        self.cross: dict[str, CrossQueries] = ctx.evaluation_data or {}
        self.encoder_class = ENCODERS[ctx.cfg.task.encoder]
        self.batch = int(ctx.cfg.train.eval_batch_size)
        self.steps = self._schedule()
        self.directory = None
        self.cursor = 0
        self.in_graph: tuple[dict, list[dict]] | None = None
        self.results: dict | None = None

    def _schedule(self) -> list[tuple]:
        """Every step of one cross-graph evaluation: keys, then per batch its hops and score."""
        steps: list[tuple] = [("keys",)] if self.cross else []
        for name, cq in sorted(self.cross.items()):
            hops, root = stage_plan(self.encoder_class.plan(name))
            for start in range(0, len(cq), self.batch):
                stop = min(start + self.batch, len(cq))
                steps += [("hop", name, start, stop, h, hops) for h in range(len(hops))]
                steps.append(("score", name, start, stop, root))
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
        if split != "test" or step[0] == "keys" and self.directory is not None:
            return {}
        if step[0] == "keys":
            return {name: Message(config={"kind": "keys"}) for name in self.clients}
        name, start, stop = step[1:4]
        cq = self.cross[name]
        if step[0] == "hop":
            if step[4] == 0:
                self._states = {}
                self._failed = torch.zeros(stop - start, dtype=torch.bool)
            return self._hop_messages(cq, start, stop, step[5][step[4]])
        refs = _leaves(step[4], "s")
        arrays = {f"s{i}": self._states[i] for i in refs}
        return {name_: Message(arrays=arrays, config={"kind": "score", "root": step[4]})
                for name_ in self.clients}

    def _hop_messages(self, cq: CrossQueries, start: int, stop: int, nodes) -> dict[str, Message]:
        keys, inverse = cq.keys[start:stop], cq.inverse[start:stop]
        owner_of, relation_keys = self.directory["relation_owner"], self.directory["relation_keys"]
        self._routes = {}
        messages: dict[str, dict] = {}
        for node, inner, slot in nodes:
            pos = torch.searchsorted(relation_keys, keys[:, slot].contiguous()).clamp(max=len(relation_keys) - 1)
            known = relation_keys[pos] == keys[:, slot]
            owner = torch.where(known, owner_of[pos], -1)
            self._failed |= ~known
            for k, client in enumerate(self.clients):
                rows = (owner == k).nonzero().squeeze(1)
                if not len(rows):
                    continue
                self._routes[(client, node)] = rows
                m = messages.setdefault(client, {"arrays": {}, "nodes": []})
                m["nodes"].append({"id": node, "input": inner, "slot": slot,
                                   "anchors": _leaves(inner, "a"), "refs": _leaves(inner, "s")})
                m["arrays"][f"{node}:rel"] = keys[rows, slot]
                m["arrays"][f"{node}:inv"] = inverse[rows, slot]
                for a in _leaves(inner, "a"):
                    m["arrays"][f"{node}:a{a}"] = keys[rows, a]
                for ref in _leaves(inner, "s"):
                    m["arrays"][f"{node}:s{ref}"] = self._states[ref][rows]
        return {c: Message(arrays=m["arrays"], config={"kind": "project", "structure": self.steps[self.cursor][1],
                                                        "nodes": m["nodes"]})
                for c, m in messages.items()}

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
                    self._states[node] = torch.full((stop - start, *state.shape[1:]), float("nan"))
                self._states[node][rows] = state.float()
            return self.in_graph
        self._rank(name, start, stop, replies)
        return self.in_graph

    def _build_directory(self, replies: dict[str, Message]) -> None:
        """Union of the entity keys (a row per entity, Eq. 6's table) and each relation's owner."""
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
                          "relation_keys": relation[order], "relation_owner": owner[order]}

    def retrieve(self, exchange, queries: CrossQueries, round: int = 0) -> tuple[Tensor, Tensor]:
        """Answer ``queries`` (one structure, answers not needed) outside an evaluation, with
        ``exchange(round, stage, messages, split=)`` the runner's
        (:meth:`~lightning_fedkg.federated.federation.FederatedRun.exchange`):
        ``(holder-mean scores [B, N] over the union, the union's entity keys [N])``."""
        saved = self.cross, self.steps, self.cursor, self.results
        self.cross = {queries.structure: queries}
        self.steps, self.cursor = self._schedule(), 0
        self.results = {"by_type": {}, "unanswered": 0, "seconds": {}}
        tables = []
        try:
            for step in self.steps:
                replies, failures = exchange(round, STEP, self.configure_cq_step(round, "test"), split="test")
                self.aggregate_cq_step(round, "test", replies, failures)
                if step[0] == "score":
                    tables.append(self.last_scores)
        finally:
            self.cross, self.steps, self.cursor, self.results = saved
        return torch.cat(tables), self.directory["entity_keys"]

    def _rank(self, name: str, start: int, stop: int, replies: dict[str, Message]) -> None:
        """Holder-mean of the clients' score tables (Eq. 6), then filtered ranks of the hard answers."""
        d = self.directory
        n, b = d["entity_keys"].shape[0], stop - start
        # the union's rows are entities: each client's table [b, n_c] is its rows transposed;
        # an entity no answering client holds keeps -inf (never ranked above a held one)
        clients = list(replies)
        scores = holder_mean(torch.full((n, b), float("-inf"), dtype=torch.float64),
                             [d["entity_index"][c] for c in clients],
                             [replies[c].arrays["scores"].double().T for c in clients]).T
        self.last_scores = scores
        cq = self.cross[name]
        if cq.hard_keys.numel() == 0:  # a query to answer, not to evaluate
            return
        hard_rows, hard_cols = self._answers(cq.hard_offsets, cq.hard_keys, start, stop)
        easy_rows, easy_cols = self._answers(cq.easy_offsets, cq.easy_keys, start, stop)
        answered = ~self._failed & ~torch.isnan(scores).any(1)
        ranks = filtered_ranks(scores, hard_rows, hard_cols, easy_rows, easy_cols)
        metrics = per_query_metrics(ranks, hard_rows, b)
        entry = self.results["by_type"].setdefault(name, {**{k: 0.0 for k in QUERY_METRICS}, "queries": 0})
        for k in QUERY_METRICS:
            entry[k] += float(metrics[k][answered].sum())
        entry["queries"] += int(answered.sum())
        self.results["unanswered"] += int((~answered).sum())

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


class RetrievalClient:
    """Client mixin: answers the server's retrieval steps with its own rows and operators."""

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
        module = self.party.module
        was_training = module.training
        module.eval()
        try:
            if kind == "project":
                return Message(arrays=self._project(message))
            return Message(arrays={"scores": self._score(message)})
        finally:
            module.train(was_training)

    def _project(self, message: Message) -> dict[str, Tensor]:
        encoder, device = self.party.module.encoder, self.party.module.device
        slots = num_slots(STRUCTURES[message.config["structure"]])
        out = {}
        for node in message.config["nodes"]:
            nid = node["id"]
            rel = message.arrays[f"{nid}:rel"]
            rows = torch.zeros(rel.shape[0], slots, dtype=torch.long)
            local = _lookup(self._own_keys("relation"), rel, "a relation", self.party.name)
            rows[:, node["slot"]] = 2 * local + message.arrays[f"{nid}:inv"].long()
            for a in node["anchors"]:
                rows[:, a] = _lookup(self._own_keys("entity"), message.arrays[f"{nid}:a{a}"], "an entity",
                                     self.party.name)
            states = {str(r): message.arrays[f"{nid}:s{r}"].to(device) for r in node["refs"]}
            rows = rows.to(device)
            state = encoder.project_state(run_plan(encoder, node["input"], rows, states), rows[:, node["slot"]])
            out[str(nid)] = state.float().cpu()
        return out

    def _score(self, message: Message) -> Tensor:
        encoder, device = self.party.module.encoder, self.party.module.device
        states = {k[1:]: v.to(device) for k, v in message.arrays.items() if k.startswith("s")}
        query = encoder.output(run_plan(encoder, message.config["root"], None, states))
        return encoder.score(query).float().cpu()
