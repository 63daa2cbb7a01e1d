"""Typed experiment configuration: dataclasses + omegaconf, YAML files and dotlist overrides.

Every field has a type and a default, so a config file only states what differs. Loading
merges, in order: the structured defaults, the YAML file, then ``key=value`` overrides.
An unknown key anywhere is an error that lists the valid keys of that section.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

log = logging.getLogger("lightning_fedkg")

__all__ = [
    "ConfigError",
    "FedEConfig",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "TrainerConfig",
    "FederatedConfig",
    "ExperimentConfig",
    "load_config",
    "save_config",
    "config_from_yaml_text",
    "validate_model_and_train",
]


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message says how to fix it."""


@dataclass
class DataConfig:
    """Which knowledge graph(s) to load.

    ``name`` is a bundled dataset (``umls``, ``nations``, ``kinship``) or a path. For a
    federated run a single KG is split by relation into ``num_clients`` clients (FedE's
    procedure, seeded by ``partition_seed``); a folder of pre-split clients
    (``client_<k>/`` or FedLU's ``<k>/``) is loaded as it is.
    """

    name: str = "umls"
    format: Literal["auto", "triples", "openke", "pyg_fb15k237", "pyg_wn18rr"] = "auto"
    num_clients: int = 3
    partition_seed: int = 12345


#: ModelConfig fields that are keyword options of particular models (None = model default).
MODEL_OPTION_KEYS = ("p_norm", "relation_dim", "orthogonality_margin")


@dataclass
class ModelConfig:
    """The KGE score function (REFERENCE §1.1 parameterisation).

    ``name`` is a registered model (``transe``, ``transh``, ``transr``, ``transd``,
    ``distmult``, ``complex``, ``rotate``; see ``lightning_fedkg.models.MODELS``) or an import
    path ``package.module:Class`` of a ``KGEModel`` subclass. ``p_norm`` (Trans*),
    ``relation_dim`` (TransR/TransD) and ``orthogonality_margin`` (TransH) are model options:
    None keeps the model's own default, and setting one the model does not take is an error.
    """

    name: str = "transe"
    dim: int = 128
    gamma: float = 10.0
    epsilon: float = 2.0
    p_norm: Optional[float] = None
    relation_dim: Optional[int] = None
    orthogonality_margin: Optional[float] = None

    def options(self) -> dict:
        """The model options that are set (not None), as keyword arguments of the model."""
        return {k: getattr(self, k) for k in MODEL_OPTION_KEYS if getattr(self, k) is not None}


@dataclass
class TrainConfig:
    """Optimisation, negative sampling and evaluation protocol of one learner.

    ``loss`` is ``self_adversarial``, ``uniform`` or ``margin`` (the margin ranking loss,
    with ``margin``). ``eval_chunk_size`` bounds how many evaluation queries are scored at
    once (None: a whole ``eval_batch_size`` batch).
    """

    lr: float = 1e-3
    batch_size: int = 512
    num_negatives: int = 256
    negative_mode: Literal["per_triple", "shared"] = "per_triple"
    negative_sampler: Literal["uniform", "bernoulli"] = "uniform"
    filter_negatives: bool = False
    corruption: Literal["tail", "head", "both"] = "both"
    loss: str = "self_adversarial"
    adversarial_temperature: float = 1.0
    margin: float = 1.0
    regularization: float = 0.0
    # A fresh Adam at every fit(), i.e. every federated round (FedE's code); KGEModule's
    # default too. A single-KG run fits once, so there it changes nothing.
    reset_optimizer: bool = True
    max_epochs: int = 100
    eval_every: int = 10
    patience: int = 15
    eval_batch_size: int = 256
    eval_sides: Literal["tail", "both"] = "both"
    ties: Literal["mean", "optimistic", "pessimistic", "arbitrary"] = "mean"
    eval_chunk_size: Optional[int] = None


@dataclass
class TrainerConfig:
    """Arguments passed to every ``lightning.Trainer`` of the run."""

    accelerator: str = "auto"
    devices: int = 1
    precision: str = "32-true"
    progress_bar: bool = True


@dataclass
class FedEConfig:
    """``federated.fede``: FedE's model fusion (Chen et al., IJCKG 2021, §2.2.3).

    ``fusion`` adds, after the run, a Single model per client (trained in
    ``<run_dir>/fusion_single``) and a 2→1 layer over the two models' scores fit on each
    client's validation triples (:mod:`lightning_fedkg.federated.fusion_runner`);
    ``fusion_epochs``, ``fusion_lr``, ``fusion_margin`` (β) and ``fusion_negatives`` are that
    layer's Adam epochs, learning rate, ranking margin and tail negatives per validation
    triple (FedE: 500, 0.01, 10, 256). None of these changes what a round computes, so a
    finished run may be resumed with them changed.
    """

    fusion: bool = False
    fusion_epochs: int = 500
    fusion_lr: float = 0.01
    fusion_margin: float = 10.0
    fusion_negatives: int = 256


@dataclass
class FederatedConfig:
    """Federated setting. ``strategy: none`` trains one model on one KG (no federation).

    ``strategy`` is a registered name (``single``, ``entire``, ``fede``, ``fedr``) or an
    import path ``package.module:Class`` of a user's :class:`~lightning_fedkg.federated.
    strategies.base.Strategy`; ``task`` likewise names a
    :class:`~lightning_fedkg.federated.tasks.Task` (default ``link_prediction``).
    ``rounds`` bounds the run; ``local_epochs`` is E, ``fraction`` is F (clients sampled
    per round), evaluation every ``eval_every`` rounds with early stopping after
    ``patience`` evaluations without improvement of the triple-weighted validation MRR.
    ``aggregation`` decides what clients that were not sampled in a round contribute to
    FedE/FedR's holder-mean: ``selected_holders`` averages only the sampled holders of a
    row (rows none of them holds keep their value); ``all_holders`` reproduces the official
    FedE code, where unsampled holders contribute the current server row, a damped update.

    Failures: a client that raises (or answers after ``client_timeout`` seconds) is
    recorded as failed; the round goes on when at least ``min_clients`` of the selected
    clients answered (all of them, if fewer were selected), else it is retried up to
    ``max_retries`` times before the run stops with an error.

    ``federation_key``: the clients' secret for the keyed hashes of names in alignment
    (round 0); empty derives one from the seed, fine for in-process simulation.
    ``record_payloads`` keeps every serialized message under ``<run_dir>/payloads/`` (for
    tests and privacy audits; large). ``parties`` holds per-party overrides of the
    ``model``/``train`` sections, e.g. ``parties: {client_1: {model: {name: transh}}}``.
    Method settings live in the method's section (``fede``).
    """

    strategy: str = "none"
    task: str = "link_prediction"
    rounds: int = 100
    local_epochs: int = 3
    fraction: float = 1.0
    eval_every: int = 5
    patience: int = 15
    aggregation: Literal["selected_holders", "all_holders"] = "selected_holders"
    min_clients: int = 1
    max_retries: int = 2
    client_timeout: Optional[float] = None
    record_payloads: bool = False
    federation_key: str = ""
    parties: Dict[str, Any] = field(default_factory=dict)
    fede: FedEConfig = field(default_factory=FedEConfig)


#: Flat keys of the first config layout → their place in the method's section.
LEGACY_KEYS = {
    "federated.fusion": "federated.fede.fusion",
    "federated.fusion_epochs": "federated.fede.fusion_epochs",
    "federated.fusion_lr": "federated.fede.fusion_lr",
    "federated.fusion_margin": "federated.fede.fusion_margin",
    "federated.fusion_negatives": "federated.fede.fusion_negatives",
}


@dataclass
class ExperimentConfig:
    """A whole experiment: data, model, training, Trainer and federation settings."""

    name: str = "experiment"
    seed: int = 0
    out_dir: str = "runs"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    federated: FederatedConfig = field(default_factory=FederatedConfig)


def _valid_keys(schema: DictConfig, dotted: str) -> list[str]:
    node = schema
    for part in [p for p in dotted.split(".")[:-1] if p]:
        child = node.get(part) if isinstance(node, DictConfig) else None
        if not isinstance(child, DictConfig):
            break
        node = child
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


def _upgrade_legacy(layer: DictConfig, source: str) -> DictConfig:
    """Move keys of the first layout (:data:`LEGACY_KEYS`) to their current place."""
    for old, new in LEGACY_KEYS.items():
        value = OmegaConf.select(layer, old, default=None)
        if value is None:
            continue
        section, key = old.rsplit(".", 1)
        del layer[section][key]
        OmegaConf.update(layer, new, value, force_add=True)
        log.warning("%s: '%s' is now '%s'", source, old, new)
    return layer


def _merge(schema: DictConfig, layer: DictConfig, source: str) -> DictConfig:
    layer = _upgrade_legacy(layer, source)
    try:
        return OmegaConf.merge(schema, layer)
    except (ConfigKeyError, ConfigAttributeError) as err:
        key = getattr(err, "full_key", None) or str(err)
        valid = _valid_keys(schema, key)
        raise ConfigError(
            f"{source}: unknown config key '{key}'. Valid keys here: {', '.join(valid)}"
        ) from None
    except ValidationError as err:
        first_line = str(err).splitlines()[0]
        raise ConfigError(f"{source}: {getattr(err, 'full_key', '')}: {first_line}") from None


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Build an :class:`ExperimentConfig` from a YAML file and ``key=value`` overrides.

    Raises :class:`ConfigError` naming the offending key and listing the valid keys.
    """
    cfg = OmegaConf.structured(ExperimentConfig)
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        cfg = _merge(cfg, OmegaConf.load(path), str(path))
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError(f"overrides must look like key=value, got: {' '.join(bad)}")
    if overrides:
        cfg = _merge(cfg, OmegaConf.from_dotlist(list(overrides)), "command line")
    return validate_model_and_train(OmegaConf.to_object(cfg))


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the fully resolved config as YAML (the run directory's ``config.yaml``)."""
    OmegaConf.save(OmegaConf.structured(cfg), Path(path), resolve=True)


def config_from_yaml_text(text: str) -> ExperimentConfig:
    """Parse a resolved ``config.yaml`` back (used when resuming a run directory)."""
    cfg = _merge(OmegaConf.structured(ExperimentConfig), OmegaConf.create(text), "config.yaml")
    return validate_model_and_train(OmegaConf.to_object(cfg))


def validate_model_and_train(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check the names and options of ``cfg.model`` / ``cfg.train`` against what exists.

    ``model.name`` must be a registered KGE model (or an import path to one), ``train.loss``
    a known loss, and every model option that is set must be one the model takes. Raises
    :class:`ConfigError` listing the valid choices; returns ``cfg`` unchanged.
    """
    # The registries live with the models (torch); importing them here, not at module
    # level, keeps `import lightning_fedkg.config` light.
    from lightning_fedkg.models.kge import MODELS, model_options
    from lightning_fedkg.models.kge_module import LOSSES
    from lightning_fedkg.registry import RegistryError

    try:
        model_cls = MODELS.get(cfg.model.name)
    except RegistryError as err:
        raise ConfigError(f"model.name: {err}") from None
    if cfg.train.loss not in LOSSES:
        raise ConfigError(f"train.loss: unknown loss {cfg.train.loss!r}; valid: {', '.join(LOSSES)}")
    accepted = model_options(model_cls)
    for key in cfg.model.options():
        if accepted is not None and key not in accepted:
            raise ConfigError(
                f"model.{key}: KGE model {cfg.model.name!r} does not take {key} "
                f"(its options: {', '.join(accepted) or 'none'}); remove it or set it to null"
            )
    return cfg
