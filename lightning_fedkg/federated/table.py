"""The terminal table of a federated run's ``metrics.json``: one row per client."""

from __future__ import annotations

from typing import Any

from lightning_fedkg.federated.tasks import TASKS

__all__ = ["format_table"]


def format_table(metrics: dict, sections=(), columns=()) -> str:
    """A FedE-Table-3-style table: one row per client and the weighted average.

    ``columns``: ``(label, metric key)`` pairs (a task's :attr:`~.tasks.Task.table_columns`;
    link prediction: MRR, H@1, H@5, H@10, with MR and H@3 left in ``metrics.json``); by
    default the link-prediction columns the test block has, else every metric it has.
    ``sections`` adds ``(title, [(label, #test, metrics)])`` blocks below (a phase's rows,
    :meth:`~.phases.Phase.table_rows`). The header names only the run facts present in
    ``metrics``.
    """
    test = metrics["test"]
    cols = tuple(columns) or (
        tuple((label, key) for label, key in TASKS.get("link_prediction").table_columns if key in test)
        or tuple((key, key) for key in test if key != "count"))
    width = max([10, *(len(label) + 2 for _, rows in sections for label, _, _ in rows)])
    header = f"{'client':<{width}}{'#test':>8}" + "".join(f"{c:>9}" for c, _ in cols)
    lines = []
    facts = [f"{k}={metrics[k]}" for k in ("strategy", "rounds", "best_round", "bytes_sent", "round")
             if metrics.get(k) is not None]
    if facts:
        lines.append("  ".join(facts))
    lines += [header, "-" * len(header)]

    def row(label: str, n: Any, m: dict) -> str:
        return f"{label:<{width}}{n!s:>8}" + "".join(f"{float(m[k]):>9.4f}" for _, k in cols)

    clients = metrics.get("clients", [])
    for k, m in enumerate(clients):
        if "failed" in m:
            lines.append(f"{str(k):<{width}}  failed: {m['failed']}")
        else:
            lines.append(row(str(k), m.get("triples", m.get("count", "")), m))
    total = sum(int(m.get("triples", 0)) for m in clients)
    lines.append("-" * len(header))
    lines.append(row("weighted", total or "", metrics["test"]))
    for title, rows in sections:
        lines.append(title)
        lines += [row(label, n, m) for label, n, m in rows]
    return "\n".join(lines)
