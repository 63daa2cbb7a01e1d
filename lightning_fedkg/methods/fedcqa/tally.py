"""What cross-graph retrieval (:mod:`.retrieval`) answered: the metrics of each batch, from
the holder-mean of the clients' score tables (``task.retrieval: paper``) or from the
querier's reveal (``private``), summed per query type; and the metrics.json block."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.federated.aggregation import holder_mean
from lightning_fedkg.federated.message import Message

from .entries import QUERY_METRICS, by_type
from .ranking import filtered_ranks, per_query_metrics

__all__ = ["Tally", "answers", "live_answers", "mean_by_type"]


def answers(offsets: Tensor, keys: Tensor, start: int, stop: int, union: Tensor) -> tuple[Tensor, Tensor]:
    """CSR answers of queries ``start..stop-1`` as (row, column of the ``union`` of entity
    keys), unknown keys dropped."""
    counts = offsets[start + 1:stop + 1] - offsets[start:stop]
    rows = torch.repeat_interleave(torch.arange(stop - start), counts)
    wanted = keys[offsets[start]:offsets[stop]]
    pos = torch.searchsorted(union, wanted).clamp(max=len(union) - 1)
    found = union[pos] == wanted
    return rows[found], pos[found]


def live_answers(cq, start: int, stop: int, live: Tensor, union: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Hard and easy answers of the routed rows ``live``, as (row among them, union column)."""
    at = torch.full((stop - start,), -1, dtype=torch.long)
    at[live] = torch.arange(len(live))
    out = []
    for offsets, keys in ((cq.hard_offsets, cq.hard_keys), (cq.easy_offsets, cq.easy_keys)):
        rows, cols = answers(offsets, keys, start, stop, union)
        keep = at[rows] >= 0
        out += [at[rows][keep], cols[keep]]
    return tuple(out)


class Tally:
    """The sums of one cross-graph evaluation (:attr:`results`: ``by_type``, ``unanswered``,
    ``seconds``) and the last batch's score table (:attr:`last_scores`, what ``retrieve``
    returns)."""

    def __init__(self) -> None:
        self.results: dict | None = None
        self.last_scores: Tensor | None = None

    def reset(self) -> None:
        self.results = {"by_type": {}, "unanswered": 0, "seconds": {}}

    def rank(self, cq, name: str, start: int, stop: int, replies: dict[str, Message], directory: dict,
             live: Tensor) -> None:
        """``paper``: holder-mean of the clients' score tables (Eq. 6), then filtered ranks of
        the hard answers."""
        d = directory
        n, b = d["entity_keys"].shape[0], stop - start
        # the union's rows are entities: each client's table [b, n_c] is its rows transposed;
        # an entity no answering client holds keeps -inf (never ranked above a held one)
        clients = list(replies)
        scores = torch.full((b, n), float("nan"), dtype=torch.float64)
        if len(live) and clients:
            scores[live] = holder_mean(torch.full((n, len(live)), float("-inf"), dtype=torch.float64),
                                       [d["entity_index"][c] for c in clients],
                                       [replies[c].arrays["scores"].double().T for c in clients]).T
        self.last_scores = scores
        if cq.hard_keys.numel() == 0:  # a query to answer, not to evaluate
            return
        if not len(live) or not clients:
            self.results["unanswered"] += b
            return
        hard_rows, hard_cols, easy_rows, easy_cols = live_answers(cq, start, stop, live, d["entity_keys"])
        ranks = filtered_ranks(scores[live], hard_rows, hard_cols, easy_rows, easy_cols)
        self.count(name, b, per_query_metrics(ranks, hard_rows, len(live)), ~torch.isnan(scores[live]).any(1))

    def revealed(self, cq, name: str, start: int, stop: int, reply: Message | None, width: int,
                 live: Tensor) -> None:
        """``private``: the querier's metrics per routed query (``float32 [rows,
        len(QUERY_METRICS)]``) or a typed query's top answers (``width`` entities in the union)."""
        b, n = stop - start, width
        self.last_scores = torch.full((b, n), float("nan"), dtype=torch.float64)
        if cq.hard_keys.numel() == 0:
            if reply is not None:
                revealed = torch.full((len(live), n), float("-inf"), dtype=torch.float64)
                revealed.scatter_(1, reply.arrays["top"], reply.arrays["values"])
                self.last_scores[live] = revealed
            return
        if reply is None:  # nothing routed, or the querier failed: the batch is unanswered
            self.results["unanswered"] += b
            return
        values = reply.arrays["metrics"]
        if tuple(values.shape) != (len(live), len(QUERY_METRICS)):
            raise ValueError(f"the querier's metrics have shape {tuple(values.shape)}, not "
                             f"({len(live)}, {len(QUERY_METRICS)}) (routed rows, metrics)")
        metrics = {k: values[:, i] for i, k in enumerate(QUERY_METRICS)}
        self.count(name, b, metrics, torch.ones(len(live), dtype=torch.bool))

    def count(self, name: str, b: int, metrics: dict[str, Tensor], answered: Tensor) -> None:
        """Add the ``answered`` routed rows' ``metrics`` (:func:`per_query_metrics`' form) to
        the type's sums; the other rows of the ``b`` are unanswered."""
        entry = self.results["by_type"].setdefault(name, {**{k: 0.0 for k in QUERY_METRICS}, "queries": 0})
        for k in QUERY_METRICS:
            entry[k] += float(metrics[k][answered].sum())
        entry["queries"] += int(answered.sum())
        self.results["unanswered"] += b - int(answered.sum())

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


def mean_by_type(per_client: list[dict]) -> dict:
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
