"""What the names a config gives add to its schema: method, task and phase sections and a
model's own options, resolved through :mod:`lightning_fedkg.registry` (nothing here imports
a method)."""

from __future__ import annotations

import functools
import types
from dataclasses import field, fields, make_dataclass
from typing import Any, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from .schema import ConfigError, ExperimentConfig, FederatedConfig, ModelConfig

#: A section a config gains from the names it gives: ``(key, dataclass, resume_free)``.
Section = tuple[str, type, bool]


def section_classes(raw: DictConfig, sections: Sequence[str] = (), strict: bool = False
                    ) -> tuple[tuple[Section, ...], tuple[Section, ...], tuple[tuple[str, Any], ...]]:
    """What the names in ``raw`` add to the schema: ``(federated sections, top-level
    sections, model options)``.

    * ``federated.<name>``: the ``config_class`` of the strategy ``federated.strategy`` names,
      and of every registered strategy whose section ``raw`` sets (a section of a method the
      run does not use changes nothing; ``strict`` refuses one, as a likely mistake, while
      a saved ``config.yaml`` of an earlier version may hold every method's);
    * ``task``: the ``config_class`` of ``federated.task``'s task, if it has one;
    * ``<phase>``: the ``config_class`` of each registered phase whose section ``raw`` sets,
      or that ``sections`` asks for (``fedkg unlearn`` asks for ``unlearn``). A phase is its
      own resume point (its block is stored with its settings), so its section is
      resume-free;
    * ``model.<option>``: each keyword option of ``model.name``'s model that
      :class:`ModelConfig` does not have already (:func:`model_option_fields`).

    Names resolve through :mod:`lightning_fedkg.registry` (entry points of the installed
    packages, or import paths): nothing here imports a method. Raises :class:`ConfigError`
    for a name that does not resolve.
    """
    from lightning_fedkg.registry import PHASES, STRATEGIES, TASKS, RegistryError

    def resolve(registry, name: str, key: str):
        try:
            return registry.get(name)
        except RegistryError as err:
            raise ConfigError(f"{key}: {err}") from None

    fed_raw = raw.get("federated") if isinstance(raw.get("federated"), DictConfig) else OmegaConf.create({})
    core_federated = {f.name for f in fields(FederatedConfig)}
    federated: dict[str, Section] = {}
    strategy = fed_raw.get("strategy", "none")
    if strategy != "none":
        cls = resolve(STRATEGIES, strategy, "federated.strategy")
        if cls.config_class is not None:
            federated[cls.name] = (cls.name, cls.config_class, False)
    registered = set(STRATEGIES.names())
    for key in fed_raw.keys():
        if key not in core_federated and key not in federated and key in registered:
            if strict:
                raise ConfigError(f"federated.{key} is the section of the strategy {key!r}, which this run does not "
                                  f"use (federated.strategy={strategy}); remove the section or set the strategy")
            cls = resolve(STRATEGIES, key, f"federated.{key}")
            if cls.config_class is not None:
                federated[key] = (key, cls.config_class, False)
    top: dict[str, Section] = {}
    if strategy != "none":  # a single-KG run has no task to configure
        task = resolve(TASKS, fed_raw.get("task", "link_prediction"), "federated.task")
        if task.config_class is not None:
            top["task"] = ("task", task.config_class, False)
    core_top = {f.name for f in fields(ExperimentConfig)}
    phases = set(PHASES.names())
    for key in [*raw.keys(), *sections]:
        if key not in core_top and key not in top and key in phases:
            phase = resolve(PHASES, key, key)
            if phase.config_class is not None:
                top[key] = (key, phase.config_class, True)
    model_raw = raw.get("model") if isinstance(raw.get("model"), DictConfig) else OmegaConf.create({})
    return tuple(federated.values()), tuple(top.values()), model_option_fields(model_raw.get("name", "transe"))


def model_option_fields(name: str) -> tuple[tuple[str, Any], ...]:
    """``(option, type)`` of every keyword option of the model ``name`` names that
    :class:`ModelConfig` lacks (a user model's own options), read from its ``__init__``
    (:meth:`~lightning_fedkg.models.kge.KGEModel.option_names`); None stands for the
    model's default, as for the built-in options."""
    import inspect
    import typing

    from lightning_fedkg.registry import MODELS, RegistryError

    try:
        cls = MODELS.get(name)
    except RegistryError as err:
        raise ConfigError(f"model.name: {err}") from None
    core = {f.name for f in fields(ModelConfig)}
    extra = [o for o in (cls.option_names() or ()) if o not in core]
    if not extra:
        return ()
    hints = typing.get_type_hints(cls.__init__)
    params = inspect.signature(cls.__init__).parameters
    out = []
    for option in extra:
        kind = hints.get(option, Any)
        if params[option].default is None or typing.get_origin(kind) in (typing.Union, types.UnionType):
            kind = next((a for a in typing.get_args(kind) if a is not type(None)), Any)
        out.append((option, Optional[kind]))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def experiment_class(federated: tuple[Section, ...] = (), top: tuple[Section, ...] = (),
                     model_options: tuple[tuple[str, Any], ...] = ()) -> type[ExperimentConfig]:
    """:class:`ExperimentConfig` with the given method sections and model options as typed fields.

    Each section is a dataclass field with its defaults, so a method's settings are checked
    like the core's (unknown keys, types, ranges) and read as ``cfg.federated.fedlu.mu``.
    The same sections give the same class.
    """
    if not federated and not top and not model_options:
        return ExperimentConfig

    def as_field(key, cls, free):
        return (key, cls, field(default_factory=cls, metadata={"resume": "free"} if free else {}))

    federated_class = make_dataclass("FederatedConfig", [as_field(*s) for s in federated], bases=(FederatedConfig,))
    model_class = make_dataclass("ModelConfig", [(o, kind, field(default=None)) for o, kind in model_options],
                                 bases=(ModelConfig,))
    experiment_class_ = make_dataclass(
        "ExperimentConfig",
        [("model", model_class, field(default_factory=model_class, metadata=_metadata(ExperimentConfig, "model"))),
         ("federated", federated_class, field(default_factory=federated_class)), *(as_field(*s) for s in top)],
        bases=(ExperimentConfig,),
    )
    for built, base in ((federated_class, FederatedConfig), (model_class, ModelConfig),
                        (experiment_class_, ExperimentConfig)):
        built.__module__, built.__doc__ = base.__module__, base.__doc__
    return experiment_class_


def _metadata(cls: type, name: str) -> dict:
    """The metadata of ``cls``'s field ``name``, for a subclass that redeclares the field."""
    return dict(cls.__dataclass_fields__[name].metadata)
