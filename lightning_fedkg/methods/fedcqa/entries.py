"""A party's query-answering entry: means over structures and ``<type>/<metric>`` keys."""

from __future__ import annotations

from lightning_fedkg.methods.fedcqa.ranking import HITS

__all__ = ["QUERY_METRICS", "query_entry", "by_type"]

#: The metric keys of a query-answering entry (means over structures).
QUERY_METRICS = ("mrr", "hits@1", "hits@3", "hits@10")
assert QUERY_METRICS[1:] == tuple(f"hits@{k}" for k in HITS)


def query_entry(result: dict) -> dict:
    """A party's entry from :meth:`QueryAnsweringModule.evaluate`: the means over types,
    ``<type>/<metric>`` per type, ``count`` (queries) and ``triples`` (its weight: the
    number of queries, so the federation's mean is over queries)."""
    entry = {k: float(result[k]) for k in QUERY_METRICS}
    for name, m in result["by_type"].items():
        entry.update({f"{name}/{k}": float(m[k]) for k in QUERY_METRICS})
        entry[f"{name}/queries"] = int(m["queries"])
    queries = sum(int(m["queries"]) for m in result["by_type"].values())
    entry["count"] = queries
    entry["triples"] = queries
    return entry


def by_type(entry: dict) -> dict:
    """``{type: {metric: value, "queries": n}}`` from an entry's ``<type>/<metric>`` keys."""
    out: dict = {}
    for key, value in entry.items():
        if "/" in key:
            name, metric = key.split("/", 1)
            out.setdefault(name, {})[metric] = value
    return out
