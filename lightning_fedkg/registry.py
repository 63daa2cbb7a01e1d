"""Open registries: one resolver per kind of pluggable class (models, strategies, tasks, ...).

A registry maps short names (``"transe"``, ``"fede"``) to classes from entry points of an
installed distribution (listed without importing, imported on first :meth:`Registry.get`),
from built-ins named in code by import path, from :meth:`Registry.register`, or from an
import path in a config (``"my_pkg.my_module:MyStrategy"``). :data:`MODELS`,
:data:`STRATEGIES`, :data:`TASKS`, :data:`PHASES`, :data:`BACKENDS`, :data:`CLIENT_POOLS`,
:data:`PROTECTIONS` and :data:`COMMANDS` live here, at the bottom of the package,
so the config layer resolves names without importing the layers above it. A misspelled name lists the valid ones.
See docs/DESIGN.md.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Callable, Generic, Iterator, TypeVar

__all__ = ["Registry", "RegistryError", "import_path", "MODELS", "STRATEGIES", "TASKS", "PHASES", "BACKENDS",
           "CLIENT_POOLS", "PROTECTIONS", "COMMANDS"]

T = TypeVar("T")


class RegistryError(ValueError):
    """An unknown name or an import path that does not resolve; the message lists the valid names."""


def import_path(path: str) -> object:
    """The object ``module.sub:attr`` (or ``module.sub.attr``) names; raises :class:`RegistryError`."""
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise RegistryError(f"{path!r} is not an import path of the form 'package.module:Name'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise RegistryError(f"cannot import {module_name!r} for {path!r}: {err}") from None
    obj = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RegistryError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


class Registry(Generic[T]):
    """Name → class resolver for one kind of pluggable component.

    Args:
        kind: what is registered, used in error messages (``"federated strategy"``).
        base: optional base class every resolved class must subclass, or its import path
            (resolved on first use, so a low-level registry need not import its base).
        loader: optional callable that imports the modules holding the built-in classes
            (called once, on first lookup, so importing the registry stays cheap).
        group: optional entry-point group whose entries are registered lazily.
        builtins: optional ``{name: "package.module:Class"}`` of the package's own entries,
            imported on first use like entry points and taking precedence over one of the
            same name (so an installed distribution's stale metadata cannot hide them).
    """

    def __init__(self, kind: str, base: type | str | None = None, loader: Callable[[], None] | None = None,
                 group: str | None = None, builtins: dict[str, str] | None = None) -> None:
        self.kind = kind
        self._builtins = {k.lower(): v for k, v in (builtins or {}).items()}
        self._base = base
        self._classes: dict[str, type[T]] = {}
        self._loader = loader
        self._loaded = loader is None
        self.group = group
        self._entry_points: dict | None = None

    @property
    def base(self) -> type | None:
        if isinstance(self._base, str):
            self._base = import_path(self._base)
        return self._base

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            assert self._loader is not None
            self._loader()

    def _declared(self) -> dict:
        """``{name: EntryPoint}`` of the group (read once; nothing is imported)."""
        if self._entry_points is None:
            found = entry_points(group=self.group) if self.group else ()
            self._entry_points = {ep.name.lower(): ep for ep in found}
        return self._entry_points

    def register(self, name: str | None = None) -> Callable[[type[T]], type[T]]:
        """Class decorator: register under ``name`` (default: the class's ``name`` attribute)."""

        def decorate(cls: type[T]) -> type[T]:
            key = (name or getattr(cls, "name", None) or cls.__name__).lower()
            if key in self._classes and self._classes[key] is not cls:
                raise RegistryError(f"{self.kind} {key!r} is already registered to {self._classes[key]!r}")
            self._classes[key] = cls
            return cls

        return decorate

    def add(self, name: str, cls: type[T]) -> None:
        """Register ``cls`` under ``name`` (non-decorator form)."""
        self.register(name)(cls)

    def names(self) -> list[str]:
        """Registered short names: built-ins and entry points (sorted by name), then classes
        registered in code."""
        self._ensure_loaded()
        out = sorted({*self._builtins, *self._declared()})
        return out + [n for n in self._classes if n not in out]

    def __contains__(self, name: str) -> bool:
        return self.is_valid(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __getitem__(self, name: str) -> type[T]:
        return self.get(name)

    def keys(self) -> list[str]:
        return self.names()

    def items(self) -> list[tuple[str, type[T]]]:
        """``(name, class)`` of every name (entry points are imported)."""
        return [(n, self.get(n)) for n in self.names()]

    def is_valid(self, name: str) -> bool:
        """Whether :meth:`get` would resolve ``name`` (an import path is imported to check)."""
        try:
            self.get(name)
        except RegistryError:
            return False
        return True

    def get(self, name: str) -> type[T]:
        """The class registered as ``name`` (case-insensitive) or named by an import path."""
        self._ensure_loaded()
        if not isinstance(name, str) or not name:
            raise RegistryError(f"a {self.kind} name must be a non-empty string, got {name!r}")
        if ":" in name:
            cls = import_path(name)
        else:
            key = name.lower()
            cls = self._classes.get(key)
            if cls is None and key in self._builtins:
                cls = self._classes[key] = import_path(self._builtins[key])
            if cls is None and key in self._declared():
                cls = self._load_entry_point(key)
            if cls is None:
                raise RegistryError(
                    f"unknown {self.kind} {name!r}; valid: {', '.join(self.names())} "
                    "(or an import path 'package.module:Class')"
                )
        if not isinstance(cls, type) or (self.base is not None and not issubclass(cls, self.base)):
            expected = self.base.__name__ if self.base is not None else "a class"
            raise RegistryError(f"{name!r} is not a subclass of {expected}")
        return cls

    def _load_entry_point(self, key: str) -> type[T]:
        ep = self._declared()[key]
        try:
            cls = ep.load()
        except Exception as err:  # a broken plugin must say which entry point it is
            raise RegistryError(f"{self.kind} {key!r} ({ep.value}) cannot be loaded: "
                                f"{type(err).__name__}: {err}") from None
        self._classes[key] = cls
        return cls


#: ``model.name`` → :class:`~lightning_fedkg.models.kge.KGEModel` subclass (dict-like: ``MODELS["transe"]``).
MODELS: Registry = Registry("KGE model", base="lightning_fedkg.models.kge:KGEModel", group="lightning_fedkg.models")
#: ``federated.strategy`` name → :class:`~lightning_fedkg.federated.strategy.Strategy` subclass.
STRATEGIES: Registry = Registry("federated strategy", base="lightning_fedkg.federated.strategy:Strategy",
                                group="lightning_fedkg.strategies")
#: ``federated.task`` name → :class:`~lightning_fedkg.federated.tasks.Task` subclass.
TASKS: Registry = Registry("task", base="lightning_fedkg.federated.tasks:Task", group="lightning_fedkg.tasks")
#: Phase name → :class:`~lightning_fedkg.federated.phases.Phase` subclass.
PHASES: Registry = Registry("phase", base="lightning_fedkg.federated.phases:Phase", group="lightning_fedkg.phases")
#: ``federated.backend`` → a backend that runs a federated run other than in this process's
#: loops (Ray actors, Flower): a class with ``run(cfg, run_dir, resume) -> metrics`` (``local``,
#: the in-process default, is the core's own and not registered).
BACKENDS: Registry = Registry("federated backend", group="lightning_fedkg.backends", builtins={
    "ray": "lightning_fedkg.backends.ray.peer:RayBackend",
    "flower": "lightning_fedkg.backends.flower:FlowerBackend",
})
#: ``federated.clients`` → the client pool of an in-process server: a callable ``(run) ->``
#: :class:`~lightning_fedkg.federated.clients.ClientPool` (``local``, the default, is the
#: core's own :class:`~lightning_fedkg.federated.clients.LocalClients` and not registered).
CLIENT_POOLS: Registry = Registry("client pool", group="lightning_fedkg.client_pools", builtins={
    "ray": "lightning_fedkg.backends.ray.clients:RayClients",
})
#: ``federated.<name>`` → the :class:`~lightning_fedkg.federated.protections.Protection` it
#: switches on (``enabled: true``) for every holder-mean strategy; a new mechanism is one
#: module and one entry here (or in the entry-point group).
PROTECTIONS: Registry = Registry("protection", base="lightning_fedkg.federated.protections:Protection",
                                 group="lightning_fedkg.protections", builtins={
    "dp": "lightning_fedkg.privacy.dp_uploads:DPUploads",
    "secure_aggregation": "lightning_fedkg.privacy.secure:SecureAggregation",
})
#: ``fedkg <name>`` → the :class:`~lightning_fedkg.commands.Command` a method adds to the
#: command line (FedLU's ``unlearn``, FedCQA's ``query``).
COMMANDS: Registry = Registry("command", base="lightning_fedkg.commands:Command", group="lightning_fedkg.commands",
                              builtins={"flower": "lightning_fedkg.backends.flower.commands:Flower"})
