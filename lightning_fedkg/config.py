"""Typed experiment configuration: dataclasses + omegaconf, YAML files and dotlist overrides.

Every field has a type and a default, so a config file only states what differs. Loading
merges, in order: the structured defaults, the YAML file, then ``key=value`` overrides.
An unknown key anywhere is an error that lists the valid keys of that section.

Fields describe themselves through ``dataclasses.field(metadata=...)``, so that a field
added later only needs its own declaration:

* ``{"range": Range(...)}`` — the allowed interval of a numeric field, checked by
  :func:`validate_ranges` whenever a config is loaded;
* ``{"resume": "free"}`` — the field may change when a run directory is resumed (see
  :func:`resume_fingerprint`): it is cosmetic (names, progress bar), a budget (rounds,
  epochs, patience), where the run executes (devices) or post-processing (model fusion).
  Everything else changes what a step computes and must match the run being resumed.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import IO, Literal, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

__all__ = [
    "ConfigError",
    "Range",
    "DataConfig",
    "ModelConfig",
    "TrainConfig",
    "TrainerConfig",
    "FederatedConfig",
    "ExperimentConfig",
    "load_config",
    "save_config",
    "config_from_yaml_text",
    "validate_ranges",
    "resume_fingerprint",
    "fingerprint_differences",
    "show_progress_bar",
]


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message says how to fix it."""


@dataclass(frozen=True)
class Range:
    """The allowed interval of a numeric config field, declared as ``metadata={"range": ...}``.

    ``None`` leaves that side unbounded; a bound is inclusive unless ``*_exclusive``.
    Non-finite values (``nan``, ``inf``) are always outside.
    """

    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    max_exclusive: bool = False

    def contains(self, value: float) -> bool:
        """Whether ``value`` lies inside the interval."""
        if not math.isfinite(value):
            return False
        if self.min is not None and (value <= self.min if self.min_exclusive else value < self.min):
            return False
        if self.max is not None and (value >= self.max if self.max_exclusive else value > self.max):
            return False
        return True

    def describe(self) -> str:
        """The constraint as the error message states it, e.g. ``>= 1`` or ``in (0, 1]``."""
        if self.min is not None and self.max is not None:
            left = "(" if self.min_exclusive else "["
            right = ")" if self.max_exclusive else "]"
            return f"in {left}{_number(self.min)}, {_number(self.max)}{right}"
        if self.min is not None:
            return f"{'>' if self.min_exclusive else '>='} {_number(self.min)}"
        if self.max is not None:
            return f"{'<' if self.max_exclusive else '<='} {_number(self.max)}"
        return "a finite number"


def _number(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


#: Lightning's ``seed_everything`` (and NumPy) accept unsigned 32-bit seeds only.
SEED_RANGE = Range(min=0, max=2**32 - 1)


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
    num_clients: int = field(default=3, metadata={"range": Range(min=1)})
    partition_seed: int = field(default=12345, metadata={"range": SEED_RANGE})


@dataclass
class ModelConfig:
    """The KGE score function (REFERENCE §1.1 parameterisation)."""

    name: Literal["transe", "transh", "transr", "transd", "distmult", "complex", "rotate"] = "transe"
    dim: int = field(default=128, metadata={"range": Range(min=1)})
    gamma: float = field(default=10.0, metadata={"range": Range(min=0, min_exclusive=True)})
    epsilon: float = field(default=2.0, metadata={"range": Range(min=0)})


@dataclass
class TrainConfig:
    """Optimisation, negative sampling and evaluation protocol of one learner."""

    lr: float = field(default=1e-3, metadata={"range": Range(min=0, min_exclusive=True)})
    batch_size: int = field(default=512, metadata={"range": Range(min=1)})
    num_negatives: int = field(default=256, metadata={"range": Range(min=1)})
    negative_mode: Literal["per_triple", "shared"] = "per_triple"
    negative_sampler: Literal["uniform", "bernoulli"] = "uniform"
    filter_negatives: bool = False
    corruption: Literal["tail", "head", "both"] = "both"
    loss: Literal["self_adversarial", "uniform", "margin"] = "self_adversarial"
    adversarial_temperature: float = field(default=1.0, metadata={"range": Range(min=0)})
    regularization: float = field(default=0.0, metadata={"range": Range(min=0)})
    reset_optimizer: bool = False
    max_epochs: int = field(default=100, metadata={"range": Range(min=1), "resume": "free"})
    eval_every: int = field(default=10, metadata={"range": Range(min=1)})
    patience: int = field(default=15, metadata={"range": Range(min=1)})
    eval_batch_size: int = field(default=256, metadata={"range": Range(min=1)})
    eval_sides: Literal["tail", "both"] = "both"
    ties: Literal["mean", "optimistic", "pessimistic", "arbitrary"] = "mean"


@dataclass
class TrainerConfig:
    """Where and how the run executes: every ``lightning.Trainer``'s arguments and the
    process's torch settings.

    ``progress_bar`` ``None`` (the default) draws bars only when stdout is a terminal (see
    :func:`show_progress_bar`). ``threads`` is the process's CPU thread budget (``None``:
    torch's default, one per core; set 1 when several runs share a machine) and
    ``deterministic`` makes training bit-reproducible (deterministic algorithms, one thread
    unless ``threads`` is set); both are applied by
    :func:`lightning_fedkg.runtime.configure_torch`. ``devices``, ``progress_bar`` and
    ``threads`` may change when a run is resumed; ``accelerator``, ``precision`` and
    ``deterministic`` change what a step computes and may not.
    """

    accelerator: str = "auto"
    devices: int = field(default=1, metadata={"range": Range(min=1), "resume": "free"})
    precision: str = "32-true"
    progress_bar: bool | None = field(default=None, metadata={"resume": "free"})
    threads: int | None = field(default=None, metadata={"range": Range(min=1), "resume": "free"})
    deterministic: bool = False


@dataclass
class FederatedConfig:
    """Federated setting. ``strategy: none`` trains one model on one KG (no federation).

    ``rounds`` bounds the run; ``local_epochs`` is E, ``fraction`` is F (clients sampled
    per round), evaluation every ``eval_every`` rounds with early stopping after
    ``patience`` evaluations without improvement of the triple-weighted validation MRR.
    ``aggregation`` decides what clients that were not sampled in a round contribute to
    FedE/FedR's holder-mean: ``selected_holders`` averages only the sampled holders of a
    row (rows none of them hold keep their value); ``all_holders`` reproduces the official
    FedE code, where unsampled holders contribute the current server row, a damped update.

    ``fusion`` (``strategy: fede`` only) adds FedE's model fusion (Chen et al., IJCKG 2021,
    §2.2.3) after the run: a Single model per client is trained in ``<run_dir>/fusion_single``
    and a 2→1 layer over the two models' scores is fit on each client's validation triples
    (:mod:`lightning_fedkg.federated.fusion_runner`). ``fusion_epochs``, ``fusion_lr``,
    ``fusion_margin`` (β) and ``fusion_negatives`` (tail negatives per validation triple) are
    that layer's Adam epochs, learning rate, ranking margin and negatives (FedE: 500, 0.01,
    10, 256). None of the fusion keys changes what a round computes, so a finished run may be
    resumed with them changed.
    """

    strategy: Literal["none", "single", "entire", "fede", "fedr"] = "none"
    rounds: int = field(default=100, metadata={"range": Range(min=1), "resume": "free"})
    local_epochs: int = field(default=3, metadata={"range": Range(min=1)})
    fraction: float = field(default=1.0, metadata={"range": Range(min=0, max=1, min_exclusive=True)})
    eval_every: int = field(default=5, metadata={"range": Range(min=1)})
    patience: int = field(default=15, metadata={"range": Range(min=1), "resume": "free"})
    fusion: bool = field(default=False, metadata={"resume": "free"})
    fusion_epochs: int = field(default=500, metadata={"range": Range(min=1), "resume": "free"})
    fusion_lr: float = field(default=0.01, metadata={"range": Range(min=0, min_exclusive=True), "resume": "free"})
    fusion_margin: float = field(default=10.0, metadata={"range": Range(min=0), "resume": "free"})
    fusion_negatives: int = field(default=256, metadata={"range": Range(min=1), "resume": "free"})
    aggregation: Literal["selected_holders", "all_holders"] = "selected_holders"


@dataclass
class ExperimentConfig:
    """A whole experiment: data, model, training, Trainer and federation settings."""

    name: str = field(default="experiment", metadata={"resume": "free"})
    seed: int = field(default=0, metadata={"range": SEED_RANGE})
    out_dir: str = field(default="runs", metadata={"resume": "free"})
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


def _merge(schema: DictConfig, layer: DictConfig, source: str) -> DictConfig:
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
    result = OmegaConf.to_object(cfg)
    validate_ranges(result)
    return result


def save_config(cfg: ExperimentConfig, path: str | Path) -> None:
    """Write the fully resolved config as YAML (the run directory's ``config.yaml``).

    Written to a temporary file beside ``path`` and moved into place with ``os.replace``:
    an interrupted write leaves the previous file, never half of one.
    """
    path = Path(path)
    text = OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def config_from_yaml_text(text: str) -> ExperimentConfig:
    """Parse a resolved ``config.yaml`` back (used when resuming a run directory)."""
    cfg = _merge(OmegaConf.structured(ExperimentConfig), OmegaConf.create(text), "config.yaml")
    result = OmegaConf.to_object(cfg)
    validate_ranges(result)
    return result


def _leaves(node, prefix: str = ""):
    """``(dotted key, dataclass field, value)`` of every non-dataclass field, depth first."""
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, value


def validate_ranges(cfg: ExperimentConfig) -> None:
    """Check every field that declares ``metadata={"range": Range(...)}``.

    Types are already enforced by omegaconf; this catches values of the right type that no
    run can use (``model.dim=-5``, ``federated.fraction=1.5``) before anything is written.
    ``None`` (an optional field left unset) is not checked. Raises :class:`ConfigError`
    listing every violation as ``key: value is out of range (must be ...)``.
    """
    problems = []
    for key, f, value in _leaves(cfg):
        bounds = f.metadata.get("range")
        # bool is an int subclass, but a flag has no range to violate.
        if bounds is None or value is None or isinstance(value, bool):
            continue
        if not bounds.contains(value):
            problems.append(f"{key}: {value!r} is out of range (must be {bounds.describe()})")
    if problems:
        raise ConfigError("; ".join(problems))


def resume_fingerprint(cfg: ExperimentConfig) -> dict:
    """The settings a resumed run must share with the run directory it continues.

    ``cfg`` as a nested dict (sections are dicts, leaves plain values) without the fields
    whose metadata says ``{"resume": "free"}``. Two configs may share a run directory
    exactly when their fingerprints are equal.
    """

    def strip(node) -> dict:
        out = {}
        for f in fields(node):
            if f.metadata.get("resume") == "free":
                continue
            value = getattr(node, f.name)
            out[f.name] = strip(value) if is_dataclass(value) else value
        return out

    return strip(cfg)


def fingerprint_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """``key: saved -> current`` for every leaf where two fingerprints differ, sorted by key.

    A key missing on one side reads as ``None`` there (a field added or removed between
    versions).
    """
    out = []
    for key in sorted(set(saved) | set(current)):
        a, b = saved.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += fingerprint_differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} -> {b!r}")
    return out


def show_progress_bar(trainer: TrainerConfig, stream: IO | None = None) -> bool:
    """Whether to draw progress bars: ``trainer.progress_bar``, or when it is ``None``
    (the default), only if ``stream`` (``sys.stdout``, where tqdm and Lightning draw) is a
    terminal — redrawn bars in a log file are hundreds of kilobytes of noise."""
    if trainer.progress_bar is not None:
        return bool(trainer.progress_bar)
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())
