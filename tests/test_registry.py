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


def test_a_builtin_is_found_by_path_and_hides_a_stale_entry_point(monkeypatch):
    """The package's own entries are named in code: an installed distribution whose metadata
    still points at an old module path cannot hide them."""
    from importlib.metadata import EntryPoint

    reg = Registry("thing", base=Base, group="no_such_group_xyz", builtins={"plugin": f"{__name__}:Plugin"})
    monkeypatch.setattr(reg, "_entry_points", {"plugin": EntryPoint("plugin", "old_module_xyz:Plugin", "g"),
                                               "other": EntryPoint("other", f"{__name__}:Plugin", "g")})
    assert reg.names() == ["other", "plugin"]
    assert reg.get("plugin") is Plugin


def test_the_builtins_in_code_are_the_entry_points_pyproject_declares():
    import tomllib
    from pathlib import Path

    from lightning_fedkg import registry

    declared = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "entry-points"]
    with_builtins = [r for r in vars(registry).values() if isinstance(r, Registry) and r._builtins]
    assert {r.group for r in with_builtins} >= {"lightning_fedkg.backends", "lightning_fedkg.client_pools",
                                                "lightning_fedkg.protections", "lightning_fedkg.commands"}
    for reg in with_builtins:
        assert reg._builtins.items() <= declared[reg.group].items(), reg.group
        for name in reg._builtins:
            reg.get(name)  # each resolves (and is of the registry's base)


def test_the_protections_compose_as_the_if_chain_did():
    """DP outermost on the server, secure aggregation outermost on a client, the class names
    as before: ``DPSecure<Server>``."""
    from pathlib import Path

    from lightning_fedkg.config import load_config
    from lightning_fedkg.federated.protections import protected_halves
    from lightning_fedkg.privacy.dp_uploads import DPClient, DPServer
    from lightning_fedkg.privacy.secure import SecureClient, SecureServer
    from lightning_fedkg.registry import CLIENT_POOLS, STRATEGIES

    fede = STRATEGIES.get("fede")
    config = Path(__file__).resolve().parents[1] / "configs" / "fede" / "umls_fede.yaml"
    plain = load_config(config, [])
    assert protected_halves(fede, plain) == (fede.Server, fede.Client)
    both = load_config(config, [
        "federated.secure_aggregation.enabled=true", "federated.dp.enabled=true", "federated.dp.noise_multiplier=1"])
    server, client = protected_halves(fede, both)
    assert server.__mro__[1:3] == (DPServer, SecureServer)
    assert server.__mro__.index(SecureServer) < server.__mro__.index(fede.Server)
    assert client.__mro__[1] is SecureClient and client.__mro__.index(DPClient) > client.__mro__.index(SecureClient)
    assert server.__name__ == f"DPSecure{fede.Server.__name__}" and client.__name__ == f"DPSecure{fede.Client.__name__}"
    assert CLIENT_POOLS.get("ray").__name__ == "RayClients"
