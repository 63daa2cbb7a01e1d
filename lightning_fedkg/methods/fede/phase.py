"""``federated.fede.fusion: true``: FedE's model fusion as its own result row.

After a FedE run is tested at its best round, :func:`obtain_single_run` trains (or reuses)
the Single models in ``<run_dir>/fusion_single``, :func:`fuse_client` fits
:class:`~lightning_fedkg.methods.fede.fusion.ScoreFusion` per client on its validation
triples and ranks the test triples with FedE's tail-only protocol, and :func:`run_fusion`
returns the ``metrics.json`` block (the fused result and its two inputs, ranked through the
same code with fixed weights). See docs/methods/fede.md.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from omegaconf import OmegaConf

from lightning_fedkg.config import ConfigError, ExperimentConfig, config_from_container, resume_differences
from lightning_fedkg.federated.checkpoint import CHECKPOINT_DIR, check_format, latest_manifest, read_manifest
from lightning_fedkg.federated.entry import restore_finished_run, run_subrun
from lightning_fedkg.federated.federation import FederatedRun
from lightning_fedkg.federated.round_loop import CHECKPOINT_VERSION
from lightning_fedkg.federated.party import Party
from lightning_fedkg.federated.phases import Phase, PhaseContext
from lightning_fedkg.federated.tasks import client_entry, weighted_average, with_count
from lightning_fedkg.methods.fede.config import FedEConfig
from lightning_fedkg.methods.fede.fusion import ScoreFusion, evaluate_fusion, fit_fusion
from lightning_fedkg.seeding import derive_seed

__all__ = [
    "SINGLE_DIR",
    "FusionPhase",
    "check_fusion_config",
    "single_config",
    "obtain_single_run",
    "fuse_client",
    "run_fusion",
]

log = logging.getLogger("lightning_fedkg")

#: Sub-directory of the FedE run directory that holds the Single run fusion uses.
SINGLE_DIR = "fusion_single"


def check_fusion_config(cfg: ExperimentConfig) -> None:
    """Raise :class:`ConfigError` unless ``cfg`` can run model fusion (``strategy: fede``)."""
    fc = cfg.federated.fede
    if not fc.fusion:
        return
    if cfg.federated.strategy != "fede":
        raise ConfigError(
            f"federated.fede.fusion=true needs federated.strategy=fede (FedE §2.2.3 fuses a FedE "
            f"model with a Single one), got strategy={cfg.federated.strategy!r}; set federated.fede.fusion=false"
        )
    if fc.fusion_epochs < 0 or fc.fusion_negatives < 1 or fc.fusion_lr <= 0:
        raise ConfigError(
            "federated.fede.fusion_epochs must be >= 0, fusion_negatives >= 1 and fusion_lr > 0, got "
            f"{fc.fusion_epochs}, {fc.fusion_negatives}, {fc.fusion_lr}"
        )


def single_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """``cfg`` with ``federated.strategy=single`` and fusion off: the Single run fusion needs."""
    values = OmegaConf.to_container(OmegaConf.structured(cfg))
    values["name"] = f"{cfg.name}_{SINGLE_DIR}"
    values["federated"]["strategy"] = "single"
    del values["federated"]["fede"]  # Single has no fusion settings
    return config_from_container(values)


def obtain_single_run(cfg: ExperimentConfig, run_dir: str | Path) -> FederatedRun:
    """The Single models fusion needs, from ``<run_dir>/fusion_single``, restored at their best.

    ``cfg`` is the FedE config. A finished Single run there (its newest committed round
    early-stopped or at ``federated.rounds``) is reused; otherwise ``run_subrun`` trains
    it or resumes it. A reused run written with other settings is refused, as
    a run refuses to resume one.
    """
    scfg = single_config(cfg)
    single_dir = Path(run_dir) / SINGLE_DIR
    ckpt = single_dir / CHECKPOINT_DIR
    last_path = latest_manifest(ckpt)
    last = read_manifest(last_path) if last_path else None
    if last is not None and (ckpt / "best.json").is_file() and (
        last.get("stopped") or int(last["round"]) >= scfg.federated.rounds
    ):
        check_format(last_path, last, CHECKPOINT_VERSION)
        if resume_differences(last.get("fingerprint") or {}, scfg):
            raise ConfigError(
                f"{last_path} was written with other settings than this run's Single "
                f"counterpart; delete {single_dir} to retrain it"
            )
        log.info("model fusion: reusing the Single run in %s", single_dir)
    else:
        log.info("model fusion: training the Single models in %s", single_dir)
        run_subrun(scfg, single_dir)
    run, _ = restore_finished_run(scfg, ckpt / "best.json")
    return run


def fuse_client(fed: Party, single: Party, settings: FedEConfig, seed: int, ties: str, chunk_size: int) -> dict:
    """Fit and test the fusion of one client's Single and federated models.

    ``fed`` and ``single`` are the same client (same local ids) of the FedE and Single runs,
    each module holding the model it is tested with. ``settings`` is the run's
    ``federated.fede`` section (the ``fusion_*`` settings); ``ties`` and ``chunk_size`` are
    its ``train.ties`` and ``train.eval_batch_size``. The fusion layer is fit on the client's
    validation triples with a generator seeded from ``(seed, client name)``, by the federated
    client's own Trainer; the test is tail-only with the client's filter (train ∪ valid ∪
    test) and candidates.

    Returns ``{"fusion": entry, "single": entry, "federated": entry}``, each entry the
    metric keys plus ``count`` and ``triples``; the fusion entry also has ``weights``
    ``[w_single, w_federated]`` and ``bias``.
    """
    kg = fed.kg
    test = kg.triples("test")
    if (single.kg.num_entities, single.kg.num_relations) != (kg.num_entities, kg.num_relations) or not (
        torch.equal(single.kg.triples("test"), test) and torch.equal(single.kg.triples("valid"), kg.triples("valid"))
    ):
        raise RuntimeError(f"{fed.name}: the Single and federated clients hold different KGs")
    fed_model = fed.module.model
    device = next(fed_model.parameters()).device
    single_model = single.module.model.to(device)
    fc = settings
    valid = kg.triples("valid")
    if valid.shape[0] > 0:
        generator = torch.Generator().manual_seed(derive_seed(seed, fed.name, "fusion"))
        fusion = fit_fusion(
            single_model, fed_model, valid, kg.num_entities,
            num_negatives=fc.fusion_negatives, margin=fc.fusion_margin, lr=fc.fusion_lr,
            epochs=fc.fusion_epochs, generator=generator, trainer=fed.trainer,
        )
    else:  # nothing to fit on: the fused model is the federated one
        log.warning("model fusion: %s has no validation triples; using the federated model", fed.name)
        fusion = ScoreFusion.from_weights(0.0, 1.0).to(device)
    filter_index = fed.datamodule.filter_index  # the client's train ∪ valid ∪ test answers

    def evaluate(layer: ScoreFusion) -> dict:
        metrics = evaluate_fusion(
            layer.to(device), single_model, fed_model, test, filter_index.tail_answers,
            ties=ties, chunk_size=chunk_size,
            candidate_mask=fed.module.eval_candidate_mask,
        )
        return client_entry(metrics, test.shape[0])

    out = {
        "fusion": evaluate(fusion),
        "single": evaluate(ScoreFusion.from_weights(1.0, 0.0)),
        "federated": evaluate(ScoreFusion.from_weights(0.0, 1.0)),
    }
    out["fusion"]["weights"] = [float(w) for w in fusion.weight.detach().cpu()]
    out["fusion"]["bias"] = float(fusion.bias.detach().cpu())
    return out


def _summary(per_client: list[dict]) -> dict:
    """``{"test": triple-weighted average (+ count), "clients": per_client}``."""
    return {"test": with_count(weighted_average(per_client), per_client), "clients": per_client}


def run_fusion(cfg: ExperimentConfig, fed_run: FederatedRun, run_dir: str | Path) -> dict:
    """FedE model fusion (§2.2.3) for every client of a finished, tested FedE run.

    ``fed_run`` must hold the state the run was tested with (the round loop calls this
    right after its test at the best round, so every client module has the aggregated rows
    of that round and its own relations). The Single run comes from
    :func:`obtain_single_run`.

    Returns the ``metrics.json`` ``"fusion"`` block: ``test`` and ``clients`` of the fused
    models, and ``single`` / ``federated`` (each ``{"test", "clients"}``) for its two inputs
    under the same tail-only protocol.
    """
    check_fusion_config(cfg)
    single_run = obtain_single_run(cfg, run_dir)
    results = [fuse_client(fed, single, cfg.federated.fede, cfg.seed, cfg.train.ties, cfg.train.eval_batch_size)
               for fed, single in zip(fed_run.clients, single_run.clients)]
    block = _summary([r["fusion"] for r in results])
    block["single"] = _summary([r["single"] for r in results])
    block["federated"] = _summary([r["federated"] for r in results])
    block["single_run_dir"] = SINGLE_DIR
    return block


class FusionPhase(Phase):
    """FedE's model fusion as a phase (``federated.fede.fusion``): block ``"fusion"``."""

    name = "fusion"

    def settings(self, cfg) -> dict:
        from dataclasses import asdict

        return asdict(cfg.federated.fede)

    def run(self, ctx: PhaseContext) -> dict:
        return run_fusion(ctx.cfg, ctx.run, ctx.run_dir)

    def table_rows(self, block: dict):
        """The two inputs and the fused model, triple-weighted (tail-only test)."""
        rows = [(label, sum(int(m["triples"]) for m in b["clients"]), b["test"])
                for label, b in (("single (fusion input)", block["single"]),
                                 ("fede (fusion input)", block["federated"]), ("fusion", block))]
        return "model fusion (FedE §2.2.3; tail-only test, fit on valid):", rows
