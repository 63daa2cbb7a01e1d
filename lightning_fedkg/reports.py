"""The table ``fedkg`` prints for a ``metrics.json``: a method's own, or the generic one.

Light at import (registries only): the table modules are imported when a table is made.
Used by ``fedkg fit``/``test`` and by backends' commands (``fedkg flower up``).
"""

from __future__ import annotations

import dataclasses

from lightning_fedkg.config import ExperimentConfig

__all__ = ["SUMMARY_KEYS", "method_report", "format_metrics_table"]

#: Run-level keys of a federated ``metrics.json`` shown above its table, when present.
SUMMARY_KEYS = ("strategy", "rounds", "best_round", "bytes_sent")


def method_report(metrics: dict, cfg: ExperimentConfig | None = None) -> str | None:
    """The table that the run's strategy, task or a phase formats for a ``metrics.json`` of
    its own layout (their ``format_report``), or None: the generic table then shows it.

    They are asked in that order and the first answer wins; their names are ``cfg``'s, or
    without ``cfg`` the strategy the metrics record (one that no longer resolves is skipped).
    """
    from lightning_fedkg.registry import PHASES, STRATEGIES, TASKS, RegistryError

    strategy = cfg.federated.strategy if cfg is not None else metrics.get("strategy")
    named = []
    if isinstance(strategy, str) and strategy != "none":
        named.append((STRATEGIES, strategy))
        if cfg is not None:
            named.append((TASKS, cfg.federated.task))
    if cfg is not None:
        # A phase's section is a field of the config that loaded it (fedkg unlearn's "unlearn").
        phases = set(PHASES.names())
        named += [(PHASES, f.name) for f in dataclasses.fields(cfg) if f.name in phases]
    for registry, name in named:
        try:
            cls = registry.get(name)
        except RegistryError:
            continue
        report = cls.format_report(metrics)
        if report is not None:
            return report
    return None


def format_metrics_table(metrics: dict, cfg: ExperimentConfig | None = None) -> str:
    """A readable table of a ``metrics.json`` dict (FedE-Table-3 style when federated).

    A method with a layout of its own formats it (:func:`method_report`). Federated results
    start with a ``key=value`` line of the :data:`SUMMARY_KEYS` they hold (a tested
    checkpoint has no ``rounds`` or ``bytes_sent``, so none are shown); their columns are
    those of ``cfg``'s task (:attr:`~lightning_fedkg.federated.tasks.Task.table_columns`).
    """
    report = method_report(metrics, cfg)
    if report is not None:
        return report
    if "clients" in metrics:
        from lightning_fedkg.federated.table import format_table
        from lightning_fedkg.registry import PHASES

        summary = "  ".join(f"{k}={metrics[k]}" for k in SUMMARY_KEYS if metrics.get(k) is not None)
        # A phase's block (FedE's fusion) adds the rows its phase shows.
        sections = [rows for name in PHASES.names() if isinstance(metrics.get(name), dict)
                    for rows in [PHASES.get(name)().table_rows(metrics[name])] if rows]
        columns = ()
        if cfg is not None and cfg.federated.strategy != "none":
            from lightning_fedkg.registry import TASKS

            task = TASKS.get(cfg.federated.task)
            columns = task.table_columns
            # A task's own blocks (query answering's cross-graph test) add rows too.
            sections += [rows for rows in [task().table_rows(metrics)] if rows]
        # format_table writes its own summary line, None included, when it sees "strategy".
        table = format_table({k: v for k, v in metrics.items() if k not in SUMMARY_KEYS}, sections, columns)
        return f"{summary}\n{table}" if summary else table
    from lightning_fedkg.evaluation.ranking import METRIC_KEYS

    header = f"{'':<10}" + "".join(f"{k:>10}" for k in METRIC_KEYS)
    lines = [header, "-" * len(header)]

    def cell(key: str, value) -> str:
        if value is None:
            return f"{'-':>10}"
        return f"{value:>10.1f}" if key == "mr" else f"{value:>10.4f}"

    lines.append(f"{'test':<10}" + "".join(cell(k, metrics["test"].get(k)) for k in METRIC_KEYS))
    return "\n".join(lines)

