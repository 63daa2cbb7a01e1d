"""``fedkg audit``: what a curious server can infer about a client's triples from what it
received, measured with a reconstruction attack on a finished run's recorded payloads.

After Hu et al., "Quantifying and Defending against Privacy Threats on Federated Knowledge
Graph Embedding" (WWW 2023). The attacker knows ``known`` of a victim's training triples,
fits the rest of the model with what it saw frozen and guesses the victim's other triples;
guesses are scored against the training targets and, for *leakage*, against the held-out
triples in the same candidate space. Views: ``uploads``, ``aggregate``, ``baseline``.
The audit writes only its own folder. Threat model and reading: docs/privacy.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.message import decode
from lightning_fedkg.models.kge import build_model

__all__ = ["AuditSettings", "observed_views", "fit_attacker", "top_candidates", "attack_scores", "candidate_space",
           "run_audit", "format_audit_table"]

_PAYLOAD = re.compile(r"^r(\d+)_(\d+)_(.+)_to_(.+)_([a-z_]+)$")
DOWNLOADS = ("download", "eval_download", "test_download")
#: The per-view figures averaged over victims in ``audit.json``'s ``mean``.
MEANS = ("precision", "recall", "f1", "recall_train", "recall_heldout", "leakage")


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

    def __post_init__(self):
        if not 0 < self.known < 1:
            raise ConfigError(f"--known (audit known) must lie strictly between 0 and 1 (the fraction of the "
                              f"victim's training triples the attacker knows), got {self.known}")
        if self.epochs < 0:
            raise ConfigError(f"--epochs (audit epochs) must be >= 0, got {self.epochs}")


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
        elif value.dtype == torch.int32:  # masked words; the last column is the upload indicator
            out[name] = (value[:, :-1].double() / (1 << bits)).float()
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


def _keys(triples: Tensor, size: Tensor) -> Tensor:
    """One integer per ``(h, r, t)``, for ids below ``size`` per position."""
    triples = triples.reshape(-1, 3).long()
    return (triples[:, 0] * size[1] + triples[:, 1]) * size[2] + triples[:, 2]


def _size(*sets: Tensor) -> Tensor:
    both = torch.cat([t.reshape(-1, 3).long() for t in sets])
    return both.max(dim=0).values + 1 if both.numel() else torch.ones(3, dtype=torch.long)


def attack_scores(guesses: Tensor, targets: Tensor) -> dict:
    """Precision, recall and F1 of the guesses against the (distinct) target triples."""
    size = _size(guesses, targets)
    target_keys = torch.unique(_keys(targets, size))
    hits = int(torch.isin(_keys(guesses, size), target_keys).sum())
    precision = hits / max(len(guesses), 1)
    recall = hits / max(len(target_keys), 1)
    f1 = 0.0 if hits == 0 else 2 * precision * recall / (precision + recall)
    return {"precision": precision, "recall": recall, "f1": f1, "guesses": int(len(guesses)),
            "targets": int(len(target_keys))}


def candidate_space(triples: Tensor, known: Tensor) -> Tensor:
    """``BoolTensor [len(triples)]``: which triples :func:`top_candidates` could guess from
    ``known``: a relation of the known triples, not a known triple, and not a self-loop
    unless the known triples of that relation have one."""
    triples = triples.reshape(-1, 3).long()
    size = _size(triples, known)
    loops = known[:, 0] == known[:, 2]
    allowed = torch.isin(triples[:, 1], known[:, 1])
    allowed &= (triples[:, 0] != triples[:, 2]) | torch.isin(triples[:, 1], known[loops, 1])
    return allowed & ~torch.isin(_keys(triples, size), _keys(known, size))


def _leakage(guesses: Tensor, targets: Tensor, heldout: Tensor, known: Tensor) -> dict:
    """Recall on the training targets and on the held-out triples, both in the guesses'
    candidate space, and their difference (what is specific to training membership)."""
    train = targets[candidate_space(targets, known)]
    held = heldout[candidate_space(heldout, known)]
    recall_train = attack_scores(guesses, train)["recall"]
    recall_heldout = attack_scores(guesses, held)["recall"]
    return {"recall_train": recall_train, "recall_heldout": recall_heldout,
            "leakage": recall_train - recall_heldout, "train_in_space": int(len(train)),
            "heldout_in_space": int(len(held)), "heldout": attack_scores(guesses, heldout)}


def _is_audit(path: Path) -> bool:
    """Whether ``path`` holds a complete audit (a damaged file may be replaced)."""
    try:
        return "victims" in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        return False


def _refuse_overwrite(path: Path) -> None:
    if path.exists() and _is_audit(path):
        raise ConfigError(f"{path} holds an earlier audit; the audit never overwrites one: "
                          f"choose another --out, or move that file away")


def _write_new(path: Path, text: str) -> None:
    """Write ``path`` unless an audit appeared there meanwhile: the text goes to a temporary
    file that is then hard-linked in place, which fails rather than replace a file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    try:
        if path.exists() and not _is_audit(path):
            path.unlink()  # a damaged file, not an audit
        os.link(tmp, path)
    except FileExistsError:
        _refuse_overwrite(path)
        raise
    finally:
        tmp.unlink()


def run_audit(run_dir: str | Path, out_dir: str | Path, settings: AuditSettings | None = None,
              victims: list[str] | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Attack every victim (default: every client) of the run in ``run_dir`` in each view of
    its payloads and in the baseline; write and return ``<out_dir>/audit.json`` (refused
    with a :class:`ConfigError` if that file already holds an audit, or a victim is not a
    client of the run). ``progress``, if given, is called with one line per attack."""
    from lightning_fedkg.federated.party import load_federated_kg
    from lightning_fedkg.rundir import read_run_config

    settings = settings or AuditSettings()
    say = progress or (lambda line: None)
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if out_dir.resolve() == run_dir.resolve() or run_dir.resolve() in out_dir.resolve().parents:
        raise ConfigError(f"the audit writes outside the run it audits; choose --out outside {run_dir}")
    _refuse_overwrite(out_dir / "audit.json")  # before minutes of work, and again when writing
    payload_dir = run_dir / "payloads"
    if not payload_dir.is_dir():
        raise FileNotFoundError(f"{run_dir} recorded no payloads: run it with federated.record_payloads=true")
    cfg = read_run_config(run_dir)
    bits = cfg.federated.secure_aggregation.fractional_bits
    fkg = load_federated_kg(cfg)
    names = [f"client_{k}" for k in range(len(fkg.clients))]
    victims = list(dict.fromkeys(victims or names))
    unknown = [v for v in victims if v not in names]
    if unknown:
        raise ConfigError(f"--victim {', '.join(unknown)}: not a client of this run; valid: {', '.join(names)}")
    result = {"run": str(run_dir), "strategy": cfg.federated.strategy, "settings": asdict(settings),
              "protections": {"secure_aggregation": asdict(cfg.federated.secure_aggregation),
                              "dp": asdict(cfg.federated.dp)},
              "victims": {}}
    metrics_path = run_dir / "metrics.json"
    if metrics_path.is_file():
        result["test_mrr"] = json.loads(metrics_path.read_text()).get("test", {}).get("mrr")
    for number, victim in enumerate(victims, 1):
        kg = fkg.clients[names.index(victim)]
        train = kg.triples("train")
        heldout = torch.cat([kg.triples(s) for s in ("valid", "test") if s in kg.split_names]
                            or [torch.zeros(0, 3, dtype=torch.long)])
        generator = torch.Generator().manual_seed(settings.seed)
        perm = torch.randperm(train.shape[0], generator=generator)
        n_known = min(max(1, int(round(settings.known * train.shape[0]))), train.shape[0] - 1)
        known, targets = train[perm[:n_known]], train[perm[n_known:]]
        views = observed_views(payload_dir, victim, bits)
        entry = {"known": int(n_known), "targets": int(targets.shape[0]), "heldout": int(heldout.shape[0])}
        for view, observed in [("baseline", {}), *sorted(views.items())]:
            tic = time.perf_counter()
            say(f"audit: {victim} ({number}/{len(victims)}), view {view}: fitting the attacker ...")
            model, frozen = fit_attacker(cfg, kg.num_entities, kg.num_relations, known, observed, settings)
            guesses = top_candidates(model, kg.num_entities, known, int(targets.shape[0]))
            entry[view] = {**attack_scores(guesses, targets), "observed": frozen,
                           **_leakage(guesses, targets, heldout, known)}
            say(f"audit: {victim}, view {view}: F1 {entry[view]['f1']:.4f}, leakage {entry[view]['leakage']:+.4f} "
                f"({time.perf_counter() - tic:.0f} s)")
        result["victims"][victim] = entry
    for view in ("baseline", "uploads", "aggregate"):
        rows = [e[view] for e in result["victims"].values() if view in e]
        if rows:
            result.setdefault("mean", {})[view] = {k: sum(r[k] for r in rows) / len(rows) for k in MEANS}
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_new(out_dir / "audit.json", json.dumps(result, indent=1))
    return result


def format_audit_table(result: dict) -> str:
    """Per victim and view, the baseline first: the attack's F1 on the training targets,
    its recall on them and on the held-out triples (same candidate space), and the gap."""
    views = [v for v in ("baseline", "uploads", "aggregate") if v in result.get("mean", {})]
    lines = [f"audit of {result['run']} ({result['strategy']}): attack F1 with "
             f"{result['settings']['known']:.0%} of each victim's triples known; recall on its training "
             f"targets and on its held-out (valid+test) triples, and their gap (leakage)",
             f"{'victim':<10}{'view':<11}{'F1':>8}{'recall train':>14}{'held-out':>10}{'leakage':>9}"]

    def row(name: str, view: str, s: dict) -> str:
        return (f"{name:<10}{view:<11}{s['f1']:>8.4f}{s['recall_train']:>14.4f}{s['recall_heldout']:>10.4f}"
                f"{s['leakage']:>+9.4f}")

    for victim, entry in result["victims"].items():
        lines += [row(victim, v, entry[v]) for v in views if v in entry]
    lines += [row("mean", v, result["mean"][v]) for v in views]
    return "\n".join(lines)
