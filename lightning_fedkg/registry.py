"""Open registries: one resolver per kind of pluggable class (models, strategies, tasks, ...).

A registry maps short names (``"transe"``, ``"fede"``) to classes. Built-in classes
register themselves with :meth:`Registry.register`; a user adds a method *without editing
the package* by naming it in a config by import path, ``"my_pkg.my_module:MyStrategy"``
(as PyKEEN's class resolver and Hydra's ``_target_`` do). The config layer takes its
allowed names from :meth:`Registry.names`, so a misspelled name lists the valid ones.
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, Iterator, TypeVar

__all__ = ["Registry", "RegistryError", "import_path"]

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
        base: optional base class every resolved class must subclass.
        loader: optional callable that imports the modules holding the built-in classes
            (called once, on first lookup, so importing the registry stays cheap).
    """

    def __init__(self, kind: str, base: type | None = None, loader: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self.base = base
        self._classes: dict[str, type[T]] = {}
        self._loader = loader
        self._loaded = loader is None

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True
            assert self._loader is not None
            self._loader()

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
        """Registered short names, in registration order."""
        self._ensure_loaded()
        return list(self._classes)

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
        self._ensure_loaded()
        return list(self._classes.items())

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
            cls = self._classes.get(name.lower())
            if cls is None:
                raise RegistryError(
                    f"unknown {self.kind} {name!r}; valid: {', '.join(self._classes)} "
                    "(or an import path 'package.module:Class')"
                )
        if not isinstance(cls, type) or (self.base is not None and not issubclass(cls, self.base)):
            expected = self.base.__name__ if self.base is not None else "a class"
            raise RegistryError(f"{name!r} is not a subclass of {expected}")
        return cls
