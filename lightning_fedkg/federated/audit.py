"""``fedkg audit``: what a curious server can infer about a client's triples from what it
received, measured with a reconstruction attack on a finished run's recorded payloads.

After Hu et al., "Quantifying and Defending against Privacy Threats on Federated Knowledge
Graph Embedding" (WWW 2023): an honest-but-curious server that knows a fraction of a
victim client's training triples (``known``, 10% by default) and the victim's score
function fits the missing parameters on those known triples, with what it saw frozen, then
ranks every candidate ``(h, r, t)`` over the victim's entities and the known relations. Its
``k`` guesses (``k`` = the number of the victim's other training triples, spread over the
relations as the known triples are: :func:`top_candidates`) are scored by precision,
recall and F1 against those other triples. Views, each from the payloads the
server holds (``federated.record_payloads``):

* ``uploads``: the victim's last upload as received. Masked words (secure aggregation) are
  read as fixed point, which is all the server can do with them.
* ``aggregate``: the rows the server sent the victim last (the holder-mean), what it still
  sees under secure aggregation; offset sums (``hide_aggregate``) read as the server can,
  without the offset.
* ``baseline``: nothing observed; the same attacker trained on the known triples alone.

An attack that beats the baseline in a view shows what that view leaks. The audit reads
the run and writes only to its own output folder. Scoring every candidate is
``|E|² · |R|`` scores per victim: meant for KGs of the size of UMLS, Nations, Kinship.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.message import decode
from lightning_fedkg.models.kge import build_model

__all__ = ["AuditSettings", "observed_views", "fit_attacker", "top_candidates", "attack_scores", "run_audit",
           "format_audit_table"]

_PAYLOAD = re.compile(r"^r(\d+)_(\d+)_(.+)_to_(.+)_([a-z_]+)$")
DOWNLOADS = ("download", "eval_download", "test_download")


@dataclass
class AuditSettings:
    """``known``: the fraction of the victim's training triples the attacker knows;
    ``seed``: which ones, and the attacker's initialisation; ``epochs``, ``lr``,
    ``negatives``: the attacker's fit (full batch, Adam, log-sigmoid loss)."""

    known: float = 0.1
    seed: int = 0
    epochs: int = 300
    lr: float = 0.01
    negatives: int = 64


def _payloads(payload_dir: Path) -> list[tuple[int, int, str, str, str, Path]]:
    out = []
    for path in payload_dir.glob("*.safetensors"):
        m = _PAYLOAD.match(path.stem)
        if m:
            out.append((int(m[1]), int(m[2]), m[3], m[4], m[5], path))
    return sorted(out)


def _as_rows(arrays: dict[str, Tensor], bits: int) -> dict[str, Tensor]:
    """The float rows a server can read from a payload: floats as they are, 32-bit words as
    fixed point, offset sums divided by their counts (without the offset it lacks)."""
    out = {}
    for name, value in arrays.items():
        if name.startswith(("sa.", "dp.")) or ("@" in name and not name.endswith("@sum")):
            continue
        if name.endswith("@sum"):
            name = name[:-4]
            counts = arrays[f"{name}@count"].long()
            read = value.to(torch.int64).double().view(counts.numel(), -1) / (1 << bits)
            read = read / counts.clamp(min=1).double().view(-1, 1)
            if name in arrays:  # rows never aggregated come as they are
                held = counts > 0
                plain = arrays[name].double().reshape(counts.numel(), -1)
                read = torch.where(held.view(-1, 1), read, plain)
                read = read.view(arrays[name].shape)
            out[name] = read.float()
        elif f"{name}@sum" in arrays:
            continue
        elif value.dtype == torch.int32:
            out[name] = (value.double() / (1 << bits)).float()
        elif value.is_floating_point():
            out[name] = value.float()
    return out


def observed_views(payload_dir: Path, victim: str, bits: int) -> dict[str, dict[str, Tensor]]:
    """``{"uploads": rows, "aggregate": rows}`` from the newest such payloads of ``victim``
    (a view is absent when nothing of it was recorded). Only the newest payload of each view
    with rows in it is decoded: the older ones are the same tables, less trained."""
    paths: dict[str, list[Path]] = {"uploads": [], "aggregate": []}
    for _round, _seq, sender, receiver, name, path in _payloads(payload_dir):
        if sender == victim and receiver == "server" and name == "upload":
            paths["uploads"].append(path)
        elif sender == "server" and receiver == victim and name in DOWNLOADS:
            paths["aggregate"].append(path)
    views: dict[str, dict[str, Tensor]] = {}
    for view, found in paths.items():
        for path in reversed(found):
            rows = _as_rows(decode(path.read_bytes()).arrays, bits)
            if rows:
                views[view] = rows
                break
    return views


def _table_of(tensor: str) -> str | None:
    """Which of the victim model's tables an observed tensor stands for."""
    if tensor.endswith("relation_emb"):
        return "relation_emb"
    if tensor.endswith("entity_emb"):  # FedE's entity_emb, FedLU's avatar_entity_emb
        return "entity_emb"
    return None


def fit_attacker(cfg, num_entities: int, num_relations: int, known: Tensor, observed: dict[str, Tensor],
                 settings: AuditSettings):
    """The victim's score function with the observed tables frozen and the rest fit to the
    known triples (log-sigmoid loss against uniformly corrupted tails and heads)."""
    m = cfg.model
    generator = torch.Generator().manual_seed(settings.seed)
    with torch.random.fork_rng(devices=[]):  # the initialisation is seeded; the caller's RNG is left alone
        torch.manual_seed(settings.seed)
        model = build_model(m.name, num_entities, num_relations, m.dim, gamma=m.gamma, epsilon=m.epsilon,
                            **m.options())
    frozen = set()
    for tensor, rows in observed.items():
        table = _table_of(tensor)
        if table is not None and tuple(getattr(model, table).shape) == tuple(rows.shape):
            with torch.no_grad():
                getattr(model, table).copy_(rows)
            getattr(model, table).requires_grad_(False)
            frozen.add(table)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params or known.numel() == 0:
        return model, sorted(frozen)
    optimizer = torch.optim.Adam(params, lr=settings.lr)
    h, r, t = known[:, 0], known[:, 1], known[:, 2]
    for _ in range(settings.epochs):
        corrupt = torch.randint(num_entities, (known.shape[0], settings.negatives), generator=generator)
        pos = model(h, r, t)
        neg_t = model.score_tails(h, r, corrupt)
        neg_h = model.score_heads(r, t, corrupt)
        loss = -torch.nn.functional.logsigmoid(pos).mean() \
            - 0.5 * torch.nn.functional.logsigmoid(-neg_t).mean() - 0.5 * torch.nn.functional.logsigmoid(-neg_h).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, sorted(frozen)


@torch.no_grad()
def top_candidates(model, num_entities: int, known: Tensor, k: int, chunk: int = 256) -> Tensor:
    """``LongTensor [≈k, 3]``: the attacker's guesses. Scores are compared within a
    relation only (distances of different relations are not on one scale): relation ``r``
    gets a quota of ``k`` in proportion to its share of the known triples, filled with its
    best-scored ``(h, r, t)`` that are not known, and not self-loops unless the known
    triples of ``r`` have one (one batched score matrix per chunk of heads)."""
    n = num_entities
    relations, counts = torch.unique(known[:, 1], return_counts=True)
    quotas = torch.round(counts.double() * k / counts.sum()).long()
    out = []
    for r, quota in zip(relations.tolist(), quotas.tolist()):
        if quota == 0:
            continue
        mine = known[known[:, 1] == r]
        loops = bool((mine[:, 0] == mine[:, 2]).any())
        scores = torch.cat([model.score_tails(h, torch.full_like(h, r)).float()
                            for h in torch.arange(n).split(chunk)])
        scores[mine[:, 0], mine[:, 2]] = -math.inf
        if not loops:
            scores.fill_diagonal_(-math.inf)
        best = torch.topk(scores.flatten(), min(quota, n * n)).indices
        out.append(torch.stack([best // n, torch.full_like(best, r), best % n], dim=1))
    return torch.cat(out) if out else torch.zeros(0, 3, dtype=torch.long)


def attack_scores(guesses: Tensor, targets: Tensor) -> dict:
    """Precision, recall and F1 of the guesses against the (distinct) target triples."""
    both = torch.cat([guesses.reshape(-1, 3), targets.reshape(-1, 3)]).long()
    size = both.max(dim=0).values + 1 if both.numel() else torch.ones(3, dtype=torch.long)

    def keys(triples: Tensor) -> Tensor:
        triples = triples.reshape(-1, 3).long()
        return (triples[:, 0] * size[1] + triples[:, 1]) * size[2] + triples[:, 2]

    target_keys = torch.unique(keys(targets))
    hits = int(torch.isin(keys(guesses), target_keys).sum())
    precision = hits / max(len(guesses), 1)
    recall = hits / max(len(target_keys), 1)
    f1 = 0.0 if hits == 0 else 2 * precision * recall / (precision + recall)
    return {"precision": precision, "recall": recall, "f1": f1, "guesses": int(len(guesses)),
            "targets": int(len(target_keys))}


def run_audit(run_dir: str | Path, out_dir: str | Path, settings: AuditSettings | None = None,
              victims: list[str] | None = None) -> dict:
    """Attack every victim (default: every client) of the run in ``run_dir`` in each view of
    its payloads and in the baseline; write and return ``<out_dir>/audit.json``."""
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.rundir import read_run_config

    settings = settings or AuditSettings()
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if out_dir.resolve() == run_dir.resolve() or run_dir.resolve() in out_dir.resolve().parents:
        raise ConfigError(f"the audit writes outside the run it audits; choose --out outside {run_dir}")
    payload_dir = run_dir / "payloads"
    if not payload_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} recorded no payloads: run it with federated.record_payloads=true")
    cfg = read_run_config(run_dir)
    bits = cfg.federated.secure_aggregation.fractional_bits
    fkg = load_federated_kg(cfg)
    names = [f"client_{k}" for k in range(len(fkg.clients))]
    result = {"run": str(run_dir), "strategy": cfg.federated.strategy, "settings": asdict(settings),
              "protections": {"secure_aggregation": asdict(cfg.federated.secure_aggregation),
                              "dp": asdict(cfg.federated.dp)},
              "victims": {}}
    metrics_path = run_dir / "metrics.json"
    if metrics_path.is_file():
        result["test_mrr"] = json.loads(metrics_path.read_text()).get("test", {}).get("mrr")
    for victim in victims or names:
        kg = fkg.clients[names.index(victim)]
        train = kg.triples("train")
        generator = torch.Generator().manual_seed(settings.seed)
        perm = torch.randperm(train.shape[0], generator=generator)
        n_known = max(1, int(round(settings.known * train.shape[0])))
        known, targets = train[perm[:n_known]], train[perm[n_known:]]
        views = observed_views(payload_dir, victim, bits)
        entry = {"known": int(n_known), "targets": int(targets.shape[0])}
        for view, observed in [("baseline", {}), *sorted(views.items())]:
            model, frozen = fit_attacker(cfg, kg.num_entities, kg.num_relations, known, observed, settings)
            guesses = top_candidates(model, kg.num_entities, known, int(targets.shape[0]))
            entry[view] = {**attack_scores(guesses, targets), "observed": frozen}
        result["victims"][victim] = entry
    for view in ("baseline", "uploads", "aggregate"):
        rows = [e[view] for e in result["victims"].values() if view in e]
        if rows:
            result.setdefault("mean", {})[view] = {k: sum(r[k] for r in rows) / len(rows)
                                                   for k in ("precision", "recall", "f1")}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "audit.json").write_text(json.dumps(result, indent=1))
    return result


def format_audit_table(result: dict) -> str:
    """The attack's F1 per victim and view, the baseline first."""
    views = [v for v in ("baseline", "uploads", "aggregate") if v in result.get("mean", {})]
    lines = [f"audit of {result['run']} ({result['strategy']}): attack F1 with "
             f"{result['settings']['known']:.0%} of each victim's triples known",
             f"{'victim':<10}" + "".join(f"{v:>12}" for v in views)]
    for victim, entry in result["victims"].items():
        lines.append(f"{victim:<10}" + "".join(f"{entry[v]['f1']:>12.4f}" if v in entry else f"{'-':>12}" for v in views))
    lines.append(f"{'mean':<10}" + "".join(f"{result['mean'][v]['f1']:>12.4f}" for v in views))
    return "\n".join(lines)
