"""Checks of a configuration, and errors that name the key, the file and its line.

The merge of one layer over the schema (:func:`merge_layer`) with its unknown-key and
not-a-section errors, ranges (:func:`validate_ranges`), names (:func:`validate_names`),
per-party overrides (:func:`party_config`) and the resume and ``test --from`` rules
(:func:`resume_fingerprint`, :func:`trained_differences`).
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

import yaml  # omegaconf's own YAML parser (PyYAML), already loaded with it
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

from .schema import LOSSES, ConfigError, ExperimentConfig

def _valid_keys(schema: DictConfig, dotted: str) -> list[str]:
    node = schema
    for part in [p for p in dotted.split(".")[:-1] if p]:
        child = node.get(part) if isinstance(node, DictConfig) else None
        if not isinstance(child, DictConfig):
            break
        node = child
    return sorted(node.keys()) if isinstance(node, DictConfig) else []


#: Keys that were renamed: ``old: new``. A config that sets an old key is refused with a
#: message that names the new one (same values), rather than "unknown key".
RENAMED_KEYS = {"federated.engine": "federated.backend"}


def merge_layer(schema: DictConfig, layer: DictConfig, source: str) -> DictConfig:
    _check_sections(schema, OmegaConf.to_container(layer, resolve=False), source)
    try:
        return OmegaConf.merge(schema, layer)
    except (ConfigKeyError, ConfigAttributeError) as err:
        key = getattr(err, "full_key", None) or str(err)
        if key in RENAMED_KEYS:
            raise ConfigError(f"{source}: config key '{key}' is now '{RENAMED_KEYS[key]}' (same values); "
                              f"rename it") from None
        valid = _valid_keys(schema, key)
        hint = ""
        if key.startswith("federated.") and key.count(".") == 1:
            hint = " (a method's section federated.<name> exists when federated.strategy names the method)"
        raise ConfigError(
            f"{source}: unknown config key '{key}'. Valid keys here: {', '.join(valid)}{hint}"
        ) from None
    except ValidationError as err:
        first_line = str(err).splitlines()[0]
        raise ConfigError(f"{source}: {getattr(err, 'full_key', '')}: {first_line}") from None


def _check_sections(schema: DictConfig, values: dict, source: str, prefix: str = "",
                    root: DictConfig | None = None) -> None:
    """Raise :class:`ConfigError` where ``values`` (a layer, as plain containers) gives a
    section of ``schema`` (a mapping of keys: ``data``, ``federated.dp``, a method's, a
    party's) as a single value, a list or null.

    omegaconf's own report of it names neither the key nor the file ("None: Merge error: int
    is not a subclass of DataConfig"); this names the key, the file's line and column where
    the YAML gives one (:func:`_where`), and the section's keys. ``root``: the whole schema
    (a party's sections are the top level's ``model`` and ``train``).
    """
    root = schema if root is None else root
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        node = schema.get(key) if key in schema else None
        if prefix == "federated.parties.":  # a party: a mapping of its own model and train
            keys, node = list(PARTY_SECTIONS), root
        elif isinstance(node, DictConfig):
            keys = sorted(node.keys())
        else:
            continue
        if not isinstance(value, dict):
            raise ConfigError(_not_a_section(source, dotted, value, keys))
        _check_sections(node, value, source, f"{dotted}.", root)


def _not_a_section(source: str, dotted: str, value: Any, keys: list[str]) -> str:
    """The message for the section ``dotted`` given as ``value`` in ``source``."""
    listed = f" ({', '.join(keys)})" if keys else ""
    if source == "command line":
        shown = "null" if value is None else value
        return (f"command line: {dotted} is a section: set its keys as {dotted}.KEY=VALUE{listed}, "
                f"not {dotted}={shown}")
    kind = ("null (an empty section: give its keys, write {}, or remove it)" if value is None
            else "a list" if isinstance(value, list) else f"a single value ({value})")
    return _where(source, dotted, f"{dotted} is a section: give it as a mapping of its keys{listed}, not {kind}")


class YamlSource(str):
    """The name of a layer's source (its file's path) that keeps the YAML ``text`` it was
    parsed from: an error found after parsing (:func:`_check_sections`) points at its line
    (omegaconf's layers no longer know where their values were written)."""

    text: str

    def __new__(cls, name: str, text: str) -> "YamlSource":
        source = super().__new__(cls, name)
        source.text = text
        return source


def _where(source: str, dotted: str, reason: str) -> str:
    """``source:line:column: reason`` at the value of ``dotted`` where ``source`` is a
    :class:`YamlSource` that has it, else ``source: reason`` (the command line, a party)."""
    text = getattr(source, "text", None)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader) if text is not None else None
    except yaml.YAMLError:
        node = None
    for part in dotted.split("."):
        if not isinstance(node, yaml.MappingNode):
            node = None
            break
        node = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
    return at_position(source, node.start_mark, reason) if node is not None else f"{source}: {reason}"


def at_position(source: str, mark: yaml.Mark, reason: str) -> str:
    return f"{source}:{mark.line + 1}:{mark.column + 1}: {reason}"


def validate_model_and_train(cfg: ExperimentConfig) -> ExperimentConfig:
    """Check the names and options of ``cfg.model`` / ``cfg.train`` against what exists.

    ``model.name`` must be a registered KGE model (or an import path to one), ``train.loss``
    a known loss, and every model option that is set must be one the model takes. Raises
    :class:`ConfigError` listing the valid choices; returns ``cfg`` unchanged.
    """
    # Resolving the name imports the model's module (torch): here, not at module level,
    # so that `import lightning_fedkg.config` stays light.
    from lightning_fedkg.registry import MODELS, RegistryError

    try:
        model_cls = MODELS.get(cfg.model.name)
    except RegistryError as err:
        raise ConfigError(f"model.name: {err}") from None
    if cfg.train.loss not in LOSSES:
        raise ConfigError(f"train.loss: unknown loss {cfg.train.loss!r}; valid: {', '.join(LOSSES)}")
    if cfg.trainer.compile and cfg.trainer.capture:
        raise ConfigError("trainer.capture: a recorded step and a compiled loss exclude each other; "
                          "set trainer.compile=false or trainer.capture=null")
    if cfg.train.optimizer == "sparse_adam":
        # Sparse gradients' shapes follow each batch's distinct rows: nothing to record once
        # and replay, and dynamo does not trace sparse embedding backward.
        for key in ("capture", "compile"):
            if getattr(cfg.trainer, key):
                raise ConfigError(f"trainer.{key}=true cannot run train.optimizer=sparse_adam, whose row-sparse "
                                  f"steps change shape with every batch; set trainer.{key}=null (the row-sparse "
                                  f"step runs eagerly) or train.optimizer=adam")
    accepted = model_cls.option_names()
    for key in cfg.model.options():
        if accepted is not None and key not in accepted:
            raise ConfigError(
                f"model.{key}: KGE model {cfg.model.name!r} does not take {key} "
                f"(its options: {', '.join(accepted) or 'none'}); remove it or set it to null"
            )
    return cfg


#: Sections a party may override in ``federated.parties.<name>``.
PARTY_SECTIONS = ("model", "train")


def party_config(cfg: ExperimentConfig, name: str) -> ExperimentConfig:
    """``cfg`` with ``federated.parties[name]`` merged in (per-party model/train overrides)."""
    overrides = (cfg.federated.parties or {}).get(name)
    if not overrides:
        return cfg
    bad = set(overrides) - set(PARTY_SECTIONS)
    if bad:
        raise ConfigError(f"federated.parties.{name}: only {list(PARTY_SECTIONS)} may differ per party, "
                          f"got {sorted(bad)}")
    base = OmegaConf.structured(cfg)
    merged = merge_layer(base, OmegaConf.create({k: dict(v) for k, v in overrides.items()}), f"federated.parties.{name}")
    return validate_ranges(OmegaConf.to_object(merged))


def trained_differences(saved: ExperimentConfig, cfg: ExperimentConfig) -> list[str]:
    """``key: saved -> new`` for every setting of what a run trained that ``cfg`` changes
    from the run's ``saved`` config: the fields whose metadata says ``{"trained": True}``
    (whole sections too: ``data``, ``model``; a task's encoder, ...), in any section, and
    each party's model (``federated.parties``). ``fedkg test --from`` refuses these: the
    run's saved state was trained with the saved values (another ``model.dim`` would not
    even load), so only how it is tested may change."""
    out = _trained_differences(saved, cfg, "")
    parties = sorted(set(saved.federated.parties or {}) | set(cfg.federated.parties or {}))
    for name in parties:
        before, after = party_config(saved, name).model, party_config(cfg, name).model
        out += fingerprint_differences(_plain(before), _plain(after), f"federated.parties.{name}.model.")
    return out


def _trained_differences(saved: Any, cfg: Any, prefix: str) -> list[str]:
    out = []
    for f in fields(cfg):
        before, after = getattr(saved, f.name, None), getattr(cfg, f.name)
        if f.metadata.get("trained"):
            out += fingerprint_differences({f.name: _plain(before)}, {f.name: _plain(after)}, prefix)
        elif is_dataclass(after) and is_dataclass(before):
            out += _trained_differences(before, after, f"{prefix}{f.name}.")
    return out


def _plain(value: Any) -> Any:
    """A dataclass as a nested dict of its fields (what :func:`fingerprint_differences` walks)."""
    if not is_dataclass(value):
        return value
    return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}


def validate_names(cfg: ExperimentConfig) -> ExperimentConfig:
    """Every name a config gives must resolve: the model and loss
    (:func:`validate_model_and_train`) and each per-party override (the strategy, task and
    phases resolved when the sections were built). Raises :class:`ConfigError`."""
    validate_model_and_train(cfg)
    for name in cfg.federated.parties or {}:
        try:
            validate_model_and_train(party_config(cfg, name))
        except ConfigError as err:
            message, prefix = str(err), f"federated.parties.{name}"
            raise ConfigError(message if message.startswith(prefix) else f"{prefix}: {message}") from None
    return cfg


def _leaves(node, prefix: str = ""):
    """``(dotted key, dataclass field, value)`` of every non-dataclass field, depth first."""
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value):
            yield from _leaves(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, value


def validate_ranges(cfg: ExperimentConfig) -> ExperimentConfig:
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
    return cfg


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


def resume_differences(saved: dict, cfg: ExperimentConfig) -> list[str]:
    """:func:`fingerprint_differences` of a saved fingerprint and ``cfg``'s, where sections of
    methods ``cfg`` does not use (earlier versions saved every method's) are left out."""
    current = resume_fingerprint(cfg)
    federated = dict(saved.get("federated") or {})
    used = current.get("federated", {})
    for key in [k for k, v in federated.items() if isinstance(v, dict) and k != "parties" and k not in used]:
        del federated[key]
    # A setting added after the run was written did not exist then: it reads as its
    # default, which is the behaviour the run had (new fields default to the old behaviour).
    saved = _with_missing(dict(saved, federated=federated), resume_fingerprint(type(cfg)()))
    return fingerprint_differences(saved, current)


def _with_missing(saved: dict, defaults: dict) -> dict:
    """``saved`` with every key of ``defaults`` it lacks taken from ``defaults`` (recursively)."""
    out = dict(saved)
    for key, default in defaults.items():
        if key not in out:
            out[key] = default
        elif isinstance(out[key], dict) and isinstance(default, dict):
            out[key] = _with_missing(out[key], default)
    return out


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
