"""Registry: names, import paths, errors that list the valid names."""

import pytest

from lightning_fedkg.registry import Registry, RegistryError, import_path


class Base:
    pass


class Plugin(Base):
    name = "plugin"


def test_register_get_and_case_insensitive_names():
    reg = Registry("thing", base=Base)
    reg.register()(Plugin)
    assert reg.get("PLUGIN") is Plugin and reg["plugin"] is Plugin
    assert reg.names() == ["plugin"] and "plugin" in reg and len(reg) == 1


def test_unknown_name_lists_valid_names():
    reg = Registry("thing", base=Base)
    reg.add("a", Plugin)
    with pytest.raises(RegistryError, match="unknown thing 'b'; valid: a"):
        reg.get("b")


def test_import_path_resolves_and_is_type_checked():
    reg = Registry("thing", base=Base)
    assert reg.get(f"{__name__}:Plugin") is Plugin
    with pytest.raises(RegistryError, match="not a subclass of Base"):
        reg.get("collections:OrderedDict")
    with pytest.raises(RegistryError, match="cannot import"):
        reg.get("no_such_module_xyz:Thing")
    with pytest.raises(RegistryError, match="has no attribute"):
        import_path("collections:NoSuchThing")


def test_loader_runs_once_on_first_lookup():
    calls = []
    reg = Registry("thing", loader=lambda: calls.append(1))
    assert calls == []
    reg.names(), reg.names()
    assert calls == [1]


def test_double_registration_of_another_class_is_refused():
    reg = Registry("thing")
    reg.add("x", Plugin)
    with pytest.raises(RegistryError, match="already registered"):
        reg.add("x", Base)


def test_ray_and_flower_are_backends_registered_alike():
    """``federated.backend`` other than local is always a BACKENDS entry point (Ray used to be
    an if-chain in run_federated while Flower came through the registry)."""
    from lightning_fedkg.registry import BACKENDS

    assert {"ray", "flower"} <= set(BACKENDS)
    assert BACKENDS.get("ray").__name__ == "RayBackend" and BACKENDS.get("flower").__name__ == "FlowerBackend"
    assert callable(BACKENDS.get("ray").run) and callable(BACKENDS.get("flower").run)
