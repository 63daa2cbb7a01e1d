"""``fedkg unlearn``: forget triples from a finished FedLU (or FedE) run, checked against retraining.

Zhu et al., WWW 2023, §4.3. :func:`run_unlearn` reads a finished run (never writing to it)
and runs the :class:`UnlearnPhase` into a new run directory: forgetting sets per client
(:func:`forget_sets`), metrics before, client unlearning and ``propagate_rounds``
aggregation rounds, metrics after (saved as the new run's ``best``), and an equal-budget
retrain from scratch in ``<out>/retrain/``, with the membership-inference AUC
(:func:`membership_auc`) at each step. The steps and the ``metrics.json`` layout:
docs/methods/fedlu.md.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import time
from pathlib import Path

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError, ExperimentConfig, resume_differences, resume_fingerprint
from lightning_fedkg.data.kg_io import write_named_splits
from lightning_fedkg.data.kg import SPLITS, KnowledgeGraph, triple_keys
from lightning_fedkg.methods.fedlu.data import apply_valid_filter
from lightning_fedkg.federated.checkpoint import CHECKPOINT_DIR
from lightning_fedkg.federated.party import Party, RoundWriter, quiet_lightning
from lightning_fedkg.federated.phases import Phase, PhaseContext, progress_label, run_phases
from lightning_fedkg.federated.strategy import SERVER
from lightning_fedkg.federated.tasks import METRIC_KEYS, client_entry, weighted_average, with_count
from lightning_fedkg.seeding import derive_seed

from .config import UnlearnConfig
from .report import format_unlearning_table

__all__ = [
    "UnlearnPhase",
    "run_unlearn",
    "forget_sets",
    "split_retain",
    "membership_auc",
    "evaluate_unlearning",
    "retrain_budget",
]

log = logging.getLogger("lightning_fedkg")

RETRAIN_DIR = "retrain"


# ---------------------------------------------------------------------- forgetting sets
def split_retain(train: Tensor, forget: Tensor, num_entities: int, num_relations: int) -> Tensor:
    """``train`` without the triples of ``forget`` (every copy of them)."""
    if forget.numel() == 0:
        return train
    drop = torch.isin(triple_keys(train, num_entities, num_relations), triple_keys(forget, num_entities, num_relations))
    return train[~drop]


def sample_forget_set(train: Tensor, fraction: float, generator: torch.Generator, num_entities: int,
                      num_relations: int) -> Tensor:
    """``⌈fraction·|train|⌉`` random train triples, each accepted only if its head, relation
    and tail keep at least one retained triple (FedLU's ``sample_unlearn.py`` rule, so the
    retrained model still knows every entity). Fewer are returned if the rule runs out."""
    wanted = min(len(train), max(1, math.ceil(fraction * len(train))))
    ent_left = torch.bincount(train[:, [0, 2]].reshape(-1), minlength=num_entities).tolist()
    rel_left = torch.bincount(train[:, 1], minlength=num_relations).tolist()
    chosen = []
    # A scan in random order (not a hot path: it stops after ~|forget| accepted triples).
    for i in torch.randperm(len(train), generator=generator).tolist():
        h, r, t = train[i].tolist()
        need_e = 2 if h == t else 1
        if ent_left[h] <= need_e or ent_left[t] <= need_e or rel_left[r] <= 1:
            continue
        ent_left[h] -= 1
        ent_left[t] -= 1
        rel_left[r] -= 1
        chosen.append(i)
        if len(chosen) == wanted:
            break
    return train[torch.tensor(sorted(chosen), dtype=torch.long)] if chosen else train[:0]


def forget_mode(forget: str, parties: list[Party]) -> str:
    """``unlearn.forget`` made concrete: ``auto`` (the default) is ``file`` when some client's
    data has an ``unlearn`` split (FedLU's ``unlearn.txt``), else ``sample``, so that
    ``fedkg unlearn --from RUN`` works on data without one (the bundled KGs)."""
    if forget != "auto":
        return forget
    mode = "file" if any("unlearn" in p.kg.split_names for p in parties) else "sample"
    log.info("unlearn.forget=auto: %s", "each client's unlearn split" if mode == "file" else
             "no client has an unlearn split; sampling unlearn.fraction of each client's training triples")
    return mode


def forget_sets(u: UnlearnConfig, parties: list[Party], mode: str | None = None) -> dict[str, Tensor]:
    """``{client: LongTensor[F, 3]}`` (client-local ids) of what each client forgets under
    the ``unlearn`` section ``u`` (``mode``: :func:`forget_mode`'s answer, if the caller has it)."""
    mode = mode or forget_mode(u.forget, parties)
    out = {}
    for party in parties:
        kg, train = party.kg, party.kg.triples("train")
        if mode == "file":
            if "unlearn" not in kg.split_names:
                out[party.name] = train[:0]
                continue
            forget = kg.triples("unlearn")
            # FedLU's forgetting sets are subsets of train; anything else cannot be forgotten.
            inside = torch.isin(triple_keys(forget, kg.num_entities, kg.num_relations),
                                triple_keys(train, kg.num_entities, kg.num_relations))
            if not bool(inside.all()):
                log.warning("%s: %d forgetting triples are not training triples; ignored",
                            party.name, int((~inside).sum()))
            out[party.name] = forget[inside]
        else:
            g = torch.Generator().manual_seed(derive_seed(u.seed, party.name, "forget"))
            out[party.name] = sample_forget_set(train, u.fraction, g, kg.num_entities, kg.num_relations)
    if not any(f.numel() for f in out.values()):
        hint = " (no client has an 'unlearn' split; use unlearn.forget=sample)" if mode == "file" else ""
        raise ConfigError(f"nothing to forget{hint}")
    return out


def _view(kg: KnowledgeGraph, train: Tensor, extra: dict[str, Tensor]) -> KnowledgeGraph:
    """``kg`` with another train split and extra splits (ids and names unchanged)."""
    splits = {s: kg.triples(s) for s in SPLITS}
    splits.update(train=train, **extra)
    return KnowledgeGraph(splits, kg.num_entities, kg.num_relations, kg.entity_names, kg.relation_names, name=kg.name)


# ---------------------------------------------------------------------- evaluation
@torch.no_grad()
def membership_auc(model, members: Tensor, non_members: Tensor) -> float:
    """AUC of "score above a threshold" separating ``members`` from ``non_members``:
    ``P(s(member) > s(non-member)) + ½ P(tie)`` (Mann–Whitney), NaN if a side is empty."""
    if members.numel() == 0 or non_members.numel() == 0:
        return math.nan
    device = next(model.parameters()).device
    score = lambda t: model(*(t.to(device)[:, i] for i in range(3))).float().cpu()  # noqa: E731
    s_in, s_out = score(members), score(non_members)
    scores = torch.cat([s_in, s_out])
    # Average ranks handle ties exactly; the rank-sum formula of the AUC follows.
    order = torch.argsort(scores)
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=scores.dtype)
    uniq, inverse = torch.unique(scores, return_inverse=True)
    sums = torch.zeros(len(uniq), dtype=scores.dtype).index_add_(0, inverse, ranks)
    counts = torch.bincount(inverse, minlength=len(uniq)).to(scores.dtype)
    ranks = (sums / counts)[inverse]
    n1, n0 = len(s_in), len(s_out)
    return float((ranks[:n1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _rank_split(party: Party, kg: KnowledgeGraph, split: str) -> dict:
    """Filtered metrics of ``party``'s module on ``kg``'s ``split`` (filter: train ∪ valid ∪ test of ``kg``)."""
    from lightning_fedkg.builders import build_datamodule

    dm = apply_valid_filter(party.cfg.train.valid_filter, build_datamodule(kg, party.cfg, seed=0))
    with quiet_lightning():
        party.trainer.validate(party.module, dataloaders=dm.eval_dataloader(split), verbose=False)
    return client_entry(party.module.last_metrics["val"], int(kg.triples(split).shape[0]))


def _sides(party: Party) -> list[str]:
    return ["local", "global"] if hasattr(party.module, "avatar") else ["local"]


def evaluate_unlearning(parties: list[Party], forget: dict[str, Tensor], seconds: float | None) -> dict:
    """``{"forget", "test", ["forget_global", "test_global"], "clients", "mia_auc", "seconds"}``.

    ``forget`` ranks each client's forgetting set with the filter train ∪ valid ∪ test
    *minus* the forgetting set; ``test`` ranks the test set with the usual filter (the
    forgotten triples included, also for a model that never trained on them); the MIA AUC is the
    forget-count-weighted mean over clients of :func:`membership_auc` (local side).
    """
    per_client, blocks = [], {}
    for party in parties:
        kg, f = party.kg, forget[party.name]
        retain = split_retain(kg.triples("train"), f, kg.num_entities, kg.num_relations)
        # The forgotten triples are not filtered when they are the queries, and are (as the
        # true facts they are) when other queries are ranked, for every model alike.
        forget_view = _view(kg, retain, {"forget": f})
        test_view = _view(kg, torch.cat([retain, f]), {})
        entry = {"name": party.name, "forgotten": int(f.shape[0])}
        for side in _sides(party):
            suffix = "" if side == "local" else "_global"
            if hasattr(party.module, "eval_side"):
                party.module.eval_side = side
            try:
                if f.numel():
                    entry[f"forget{suffix}"] = _rank_split(party, forget_view, "forget")
                entry[f"test{suffix}"] = _rank_split(party, test_view, "test")
            finally:
                if hasattr(party.module, "eval_side"):
                    party.module.eval_side = "local"
        entry["mia_auc"] = membership_auc(party.model, f, kg.triples("test"))
        per_client.append(entry)
    for key in ("forget", "test", "forget_global", "test_global"):
        entries = [e[key] for e in per_client if key in e]
        if entries:
            blocks[key] = with_count(weighted_average(entries, METRIC_KEYS), entries)
    weights = [(e["forgotten"], e["mia_auc"]) for e in per_client if e["forgotten"] and not math.isnan(e["mia_auc"])]
    total = sum(w for w, _ in weights)
    mia = sum(w * a for w, a in weights) / total if total else math.nan
    forgotten = sum(e["forgotten"] for e in per_client)
    return {**blocks, "forgotten": forgotten, "seconds": seconds, "mia_auc": mia, "clients": per_client}


# ---------------------------------------------------------------------- unlearning
def _settings(u: UnlearnConfig, train_lr: float):
    from lightning_fedkg.methods.fedlu.client_unlearning import UnlearningSettings

    return UnlearningSettings(
        interference_epochs=u.interference_epochs, decay_epochs=u.decay_epochs,
        forget_weight=u.forget_weight, mu_soft=u.mu_soft, mu_distill=u.mu_distill,
        lr=u.lr if u.lr is not None else train_lr, official_updates=u.official_updates,
    )


def unlearn_client(party: Party, forget: Tensor, cfg: ExperimentConfig) -> list[float]:
    """Interference on ``forget``, then decay on the retained triples, fit by the party's own
    Trainer; returns the decay's local validation MRRs (the first: before the decay).

    ``party`` must already hold its retained triples (:func:`retain_only`): they are its
    train split here, and its validation filter leaves the forgotten triples out."""
    from lightning_fedkg.methods.fedlu.client_unlearning import ClientUnlearner
    from lightning_fedkg.builders import build_datamodule

    kg = party.kg
    retain = kg.triples("train")
    if torch.isin(triple_keys(forget, kg.num_entities, kg.num_relations),
                  triple_keys(retain, kg.num_entities, kg.num_relations)).any():
        raise ValueError(f"{party.name}: call retain_only before unlearn_client (train holds forgotten triples)")
    batch_size = cfg.unlearn.batch_size or cfg.train.batch_size
    seed = derive_seed(cfg.seed, party.name, "unlearn")
    forget_dm = build_datamodule(_view(kg, forget, {}), cfg, seed=seed, batch_size=batch_size)
    retain_dm = build_datamodule(_view(kg, retain, {}), cfg, seed=seed + 1, batch_size=batch_size)
    unlearner = ClientUnlearner(party.module, _settings(cfg.unlearn, cfg.train.lr), trainer=party.trainer)
    unlearner.interfere(forget_dm.train_dataloader)
    return unlearner.decay(retain_dm.train_dataloader, lambda: party.evaluate("val")["mrr"])


def unlearned_line(name: str, forget: Tensor, u: UnlearnConfig, scores: list[float], seconds: float) -> str:
    """The progress line of a client's unlearning: what it ran (``scores``: the decay's local
    validation MRRs, the first before it) and how long it took."""
    epochs = len(scores) - 1
    return (f"{name}: interference {u.interference_epochs} epoch(s) on {forget.shape[0]} forgotten triples, "
            f"decay {epochs}/{u.decay_epochs} epoch(s) on the retained ones "
            f"(val mrr {scores[0]:.4f} -> {max(scores):.4f}), {seconds:.1f} s")


def retain_only(party: Party, forget: Tensor, seed: int) -> None:
    """From now on ``party`` trains on its retained triples only (its new sampler seeded
    from the run's ``seed``)."""
    from lightning_fedkg.builders import build_datamodule

    kg = party.kg
    party.kg = _view(kg, split_retain(kg.triples("train"), forget, kg.num_entities, kg.num_relations), {})
    party.datamodule = apply_valid_filter(party.cfg.train.valid_filter, build_datamodule(
        party.kg, party.cfg, seed=derive_seed(seed, party.name, "retain")))


def propagate(run, rounds: int) -> int:
    """``rounds`` aggregation rounds after unlearning; returns the last round number.

    The first uploads the clients' current shared rows (nothing is downloaded before, so
    the unlearned rows are what the server averages); the others are normal rounds.
    """
    r = run.last_round
    if rounds == 0:
        return r
    for i in range(1, rounds + 1):
        started = time.perf_counter()
        r += 1
        if i == 1:
            run.stage(r, "upload")
        else:
            run.train_round(r)
        log.info("propagation round %d/%d (%.1f s)", i, rounds, time.perf_counter() - started)
    run.last_round = r
    run.load_evaluation_state(r)
    return r


# ---------------------------------------------------------------------- retraining
def write_retain_folder(folder: Path, parties: list[Party], forget: dict[str, Tensor]) -> Path:
    """FedLU-layout folder ``<k>/{train,valid,test,unlearn}.txt`` of named triples, train
    without the forgotten triples (written once; an existing complete folder is reused)."""
    done = folder / "COMPLETE"
    if done.is_file():
        return folder
    for k, party in enumerate(parties):
        kg, f = party.kg, forget[party.name]
        ent, rel = party.names["entity"], party.names["relation"]
        splits = {s: kg.triples(s) for s in SPLITS}
        splits["train"] = split_retain(splits["train"], f, kg.num_entities, kg.num_relations)
        if f.numel():  # a client with nothing to forget has no unlearn split (an empty file is malformed)
            splits["unlearn"] = f
        write_named_splits(folder / str(k), ent, rel, splits)
    done.write_text("")
    return folder


def retrain_budget(cfg: ExperimentConfig, source_rounds: int | None, decay: dict[str, list[float]]) -> dict:
    """The retrain's rounds and what they are made of.

    An equal budget is the source's rounds plus what the unlearning trained on retained
    triples: the most decay epochs a client ran (each run epoch counts, also a last one that
    did not improve), in rounds of ``federated.local_epochs``, and the propagation rounds.
    (The interference's epochs run over the forgotten triples only and are not counted.)
    ``unlearn.retrain_rounds`` overrides the sum."""
    epochs = {name: max(len(scores) - 1, 0) for name, scores in decay.items()}
    source = int(source_rounds) if source_rounds else cfg.federated.rounds
    equal = source + math.ceil(max(epochs.values(), default=0) / cfg.federated.local_epochs) \
        + cfg.unlearn.propagate_rounds
    return {"source_rounds": source, "decay_epochs": epochs, "local_epochs": cfg.federated.local_epochs,
            "propagate_rounds": cfg.unlearn.propagate_rounds, "equal_rounds": equal,
            "retrain_rounds": cfg.unlearn.retrain_rounds or equal}


def retrain_config(cfg: ExperimentConfig, data_dir: Path, rounds: int) -> ExperimentConfig:
    """``cfg`` on the retained triples for ``rounds`` rounds (same model and schedule)."""
    rcfg = copy.deepcopy(cfg)
    rcfg.name = f"{cfg.name}-retrain"
    rcfg.data.name = str(data_dir)
    rcfg.data.format = "auto"
    rcfg.federated.rounds = int(rounds)
    return rcfg


def retrain(cfg: ExperimentConfig, ctx: PhaseContext, forget: dict[str, Tensor], rounds: int) -> dict:
    """Train the gold standard in ``<out>/retrain`` and evaluate it like the others, on
    the same forgotten triples (checked)."""
    from lightning_fedkg.federated.entry import restore_finished_run, run_subrun

    sub = ctx.subrun_dir(RETRAIN_DIR)
    data_dir = write_retain_folder(sub / "data", ctx.run.clients, forget)
    rcfg = retrain_config(cfg, data_dir, rounds)
    with progress_label(RETRAIN_DIR):  # its round lines read "unlearn/retrain: round k/N ..."
        log.info("training from scratch on the retained triples, %d rounds, in %s (the gold standard)",
                 rounds, sub / "run")
        metrics = run_subrun(rcfg, sub / "run")
    rrun, _ = restore_finished_run(rcfg, sub / "run")
    try:
        r_forget = {p.name: p.kg.triples("unlearn") if "unlearn" in p.kg.split_names else p.kg.triples("train")[:0]
                    for p in rrun.clients}
        counts = {name: int(f.shape[0]) for name, f in forget.items()}
        r_counts = {name: int(f.shape[0]) for name, f in r_forget.items()}
        if r_counts != counts:
            raise RuntimeError(f"the retrained federation has other forgetting sets ({r_counts}) than the "
                               f"unlearned one ({counts}); {data_dir} does not reload as written")
        return {**evaluate_unlearning(rrun.clients, r_forget, metrics.get("seconds")),
                "rounds": metrics.get("rounds"), "best_round": metrics.get("best_round")}
    finally:
        rrun.close()


def save_unlearned(ctx: PhaseContext, round: int) -> Path:
    """Commit the unlearned parties as the run's ``best`` set: ``--from`` commands read it.

    ``own_states``: each client is evaluated with the state it holds (with 0 propagation
    rounds its avatar is its own, which the server's rows would overwrite)."""
    from lightning_fedkg.federated.round_loop import RoundLoop
    from lightning_fedkg.federated.runner import Commit

    commit = Commit(ctx.run_dir / CHECKPOINT_DIR, ctx.cfg, RoundLoop.version)
    return commit.best(ctx.run.party_states(weights_only=True), round=int(round), own_states=True)


# ---------------------------------------------------------------------- the phase
def _log(writer, block: dict, stage: str, step: int) -> None:
    if writer is None:
        return
    scalars = {f"unlearn/{stage}/{k}_mrr": v["mrr"] for k, v in block.items() if isinstance(v, dict) and "mrr" in v}
    scalars[f"unlearn/{stage}/mia_auc"] = block["mia_auc"]
    writer.log({k: v for k, v in scalars.items() if v is not None and not math.isnan(v)}, step)


class UnlearnPhase(Phase):
    """Unlearning of ``cfg.unlearn``'s forgetting sets, with before/after/retrain metrics."""

    name = "unlearn"
    config_class = UnlearnConfig

    def settings(self, cfg) -> dict:
        from dataclasses import asdict

        return asdict(cfg.unlearn)

    @classmethod
    def format_report(cls, metrics: dict) -> str | None:
        """The unlearning table (:func:`~.report.format_unlearning_table`) of ``fedkg unlearn``'s
        ``metrics.json`` (the phase's block at its top level); None for any other metrics."""
        if isinstance(metrics.get("before"), dict) and isinstance(metrics.get("after"), dict):
            return format_unlearning_table(metrics)
        return None

    def run(self, ctx: PhaseContext) -> dict:
        cfg, run = ctx.cfg, ctx.run
        mode = forget_mode(cfg.unlearn.forget, run.clients)
        forget = forget_sets(cfg.unlearn, run.clients, mode)
        step = run.last_round
        before = evaluate_unlearning(run.clients, forget, ctx.source.get("seconds"))
        _log(ctx.writer, before, "before", step)
        start = time.perf_counter()
        for party in run.clients:
            retain_only(party, forget[party.name], cfg.seed)
        decay = {}
        for party in run.clients:
            if forget[party.name].numel():
                started = time.perf_counter()
                decay[party.name] = unlearn_client(party, forget[party.name], cfg)
                log.info("%s", unlearned_line(party.name, forget[party.name], cfg.unlearn, decay[party.name],
                                              time.perf_counter() - started))
        last = propagate(run, cfg.unlearn.propagate_rounds)
        seconds = time.perf_counter() - start
        after = evaluate_unlearning(run.clients, forget, seconds)
        save_unlearned(ctx, last)
        for entry in after["clients"]:
            entry["decay_val_mrr"] = decay.get(entry["name"], [])
        _log(ctx.writer, after, "after", step)
        budget = retrain_budget(cfg, ctx.source.get("rounds"), decay)
        block = {"before": before, "after": after,
                 "forget": {"mode": mode, "triples": int(sum(len(f) for f in forget.values())),
                            "clients": {name: int(len(f)) for name, f in forget.items()}},
                 "budget": budget}
        if cfg.unlearn.retrain:
            block["retrain"] = retrain(cfg, ctx, forget, budget["retrain_rounds"])
            _log(ctx.writer, block["retrain"], "retrain", step)
        block["mia_auc"] = {k: block[k]["mia_auc"] for k in ("before", "after", "retrain") if k in block}
        return block


def check_source_config(cfg: ExperimentConfig, source: ExperimentConfig) -> None:
    """Raise :class:`ConfigError` when ``cfg`` describes another run than ``source`` (the
    ``unlearn`` section and resume-free fields may differ)."""
    differences = resume_differences(resume_fingerprint(source), cfg)
    if differences:
        raise ConfigError("the config does not describe the source run; it differs in "
                          + ", ".join(differences) + " (only the unlearn section may change)")


#: Runs with no server rounds to propagate through (one KG, or every client's data pooled).
UNSUPPORTED = ("none", "single", "entire")


def run_unlearn(cfg: ExperimentConfig | None, source_dir: str | Path, out_dir: str | Path) -> dict:
    """Unlearn from the finished run in ``source_dir`` into ``out_dir``; returns its metrics.

    ``cfg`` (None: the source's own config) must describe the source run; its ``unlearn``
    section says what and how to forget. ``source_dir`` is only read.
    """
    from lightning_fedkg.federated.entry import load_run_from
    from lightning_fedkg.federated.peer import is_peer_strategy
    from lightning_fedkg.rundir import RunDirectory, read_run_config

    source_dir, out_dir = Path(source_dir), Path(out_dir)
    if out_dir.resolve() == source_dir.resolve():
        raise ConfigError("--out must differ from --from: the source run is never written")
    # The kind of run is known from its config.yaml alone: checked before its state is
    # loaded, whose layout (a peer run's per-party files) would otherwise be the error.
    strategy = read_run_config(source_dir).federated.strategy
    if strategy in UNSUPPORTED or is_peer_strategy(strategy):
        kind = {"fkge": "an FKGE run (peer-to-peer: no server)", "none": "a single-KG run"}.get(
            strategy, f"a {strategy!r} run")
        raise ConfigError(f"{source_dir} is {kind}, which unlearning does not support: it needs a federated "
                          f"run whose server aggregates rounds (fedlu, fede, fedr, fedprox, fedec, ...)")
    source_cfg, run = load_run_from(source_dir, sections=(UnlearnPhase.name,))
    if cfg is None:
        cfg = source_cfg
    else:
        check_source_config(cfg, source_cfg)
    source_metrics = source_dir / "metrics.json"
    source = json.loads(source_metrics.read_text()) if source_metrics.is_file() else {}
    with RunDirectory.open(out_dir, cfg):
        writer = RoundWriter(out_dir, SERVER)
        run.channel.open_log(out_dir / "channel_log.jsonl")
        ctx = PhaseContext(cfg, run, out_dir, writer,
                           source={"seconds": source.get("seconds"), "rounds": source.get("rounds")})
        try:
            block = run_phases(["unlearn"], ctx)["unlearn"]
        finally:
            writer.close()
            run.close()
        metrics = {**block, "source": str(source_dir), "strategy": cfg.federated.strategy}
        (out_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return metrics
