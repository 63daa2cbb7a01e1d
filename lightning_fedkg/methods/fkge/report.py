"""FKGE's ``metrics.json`` read back: the results table, one row per KG (``fedkg fit`` and
``fedkg test`` print it), and the partners each KG hosted (the equal-schedule control
replays them)."""

from __future__ import annotations

import json
from pathlib import Path

from lightning_fedkg.config import ConfigError

__all__ = ["format_kgs_table", "planned_partners"]


def format_kgs_table(metrics: dict) -> str:
    """FKGE's per-KG table: model, triple-classification accuracy and test MRR / Hits@10
    before (after pre-training) and after the handshakes, the party's epsilon (``not private``
    after an exact release, whose epsilon is None), handshakes."""
    header = (f"{'KG':<16}{'model':<8}{'acc before':>11}{'acc after':>10}{'MRR before':>11}{'MRR after':>10}"
              f"{'H@10 before':>12}{'H@10 after':>11}{'epsilon':>12}{'accepted':>10}")
    lines = [f"strategy={metrics.get('strategy')}  handshakes={len(metrics.get('handshakes', []))}  "
             f"bytes_sent={metrics.get('bytes_sent')}", header, "-" * len(header)]
    for kg in metrics["kgs"]:
        b, a = kg["before"] or {}, kg["after"] or {}
        epsilon = "not private" if kg["epsilon"] is None else f"{kg['epsilon']:.2f}"
        lines.append(f"{kg['name']:<16}{kg['model']:<8}{b.get('accuracy', 0):>11.4f}{a.get('accuracy', 0):>10.4f}"
                     f"{b.get('mrr', 0):>11.4f}{a.get('mrr', 0):>10.4f}{b.get('hits@10', 0):>12.4f}"
                     f"{a.get('hits@10', 0):>11.4f}{epsilon:>12}{kg['accepted']:>6}/{kg['hosted']:<3}")
    return "\n".join(lines)


def planned_partners(path: str, host: str) -> list[str]:
    """The partners ``host`` hosted, in order, in the run whose ``metrics.json`` is ``path``
    (``federated.fkge.schedule``: the equal-schedule control replays them)."""
    file = Path(path)
    if file.is_dir():
        file = file / "metrics.json"
    try:
        handshakes = json.loads(file.read_text())["handshakes"]
    except (OSError, KeyError, ValueError) as err:
        raise ConfigError(f"federated.fkge.schedule: cannot read the handshakes of {file}: {err}") from err
    mine = sorted((h for h in handshakes if h["host"] == host), key=lambda h: h["number"])
    return [h["client"] for h in mine]
