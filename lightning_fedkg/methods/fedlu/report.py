"""FedLU's unlearning table: the ``metrics.json`` of ``fedkg unlearn``, one row per model."""

from __future__ import annotations

__all__ = ["format_unlearning_table"]


def format_unlearning_table(metrics: dict) -> str:
    """One row per model (before, after, retrain): forgetting-set and test metrics, MIA AUC, seconds."""
    cols = ("forget MRR", "forget H@1", "forget H@10", "test MRR", "test H@10", "MIA AUC", "seconds")
    lines = [f"{'':<9}" + "".join(f"{c:>12}" for c in cols)]
    for stage in ("before", "after", "retrain"):
        block = metrics.get(stage)
        if block is None:
            continue
        f, t = block.get("forget", {}), block["test"]
        values = (f.get("mrr"), f.get("hits@1"), f.get("hits@10"), t["mrr"], t["hits@10"], block["mia_auc"],
                  block.get("seconds"))
        lines.append(f"{stage:<9}" + "".join(f"{'-':>12}" if v is None else f"{float(v):>12.4f}" for v in values))
    forgotten = metrics.get("forget", {}).get("triples")
    budget = metrics.get("budget")
    if forgotten is not None:
        lines.append(f"{forgotten} forgotten triples, ranked by every model above")
    if budget and "retrain" in metrics:
        lines.append(f"retrain budget: {budget['retrain_rounds']} rounds (source {budget['source_rounds']} "
                     f"+ decay epochs {max(budget['decay_epochs'].values(), default=0)} / "
                     f"{budget['local_epochs']} per round + {budget['propagate_rounds']} propagation), "
                     f"trained {metrics['retrain'].get('rounds')}")
    return "\n".join(lines)
