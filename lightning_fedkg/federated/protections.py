"""The hook that composes the protections a config turns on onto a strategy's halves.

A protection (:class:`Protection`) is a pair of mixins, one for the server half and one for
the client half, placed before a holder-mean strategy's own halves, so every such method
gets it without a line of its own. The protections are found by name in
:data:`~lightning_fedkg.registry.PROTECTIONS` (the built-ins, DP of uploads and secure
aggregation, live in :mod:`lightning_fedkg.privacy`); ``federated.<name>.enabled`` switches
one on. Each says where its mixins go: on a client, secure aggregation is outermost (it
masks what differential privacy noised); on the server, DP is outermost (it annotates the
downloads secure aggregation has built and reads the clients' ε from their replies).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["IDENTITIES", "Protection", "enabled_protections", "protected_halves", "provision"]

#: The folder of a run directory that holds what :func:`provision` wrote (a party reads its
#: identity there: :attr:`~.party.Party.identities`).
IDENTITIES = "identities"


class Protection:
    """One mechanism any holder-mean strategy can switch on (``federated.<name>``).

    Attributes:
        name: its registry name and config section (``federated.<name>.enabled``).
        prefix: what the composed halves' class names start with (``DP``, ``Secure``).
        server_order, client_order: where its mixins go among the enabled ones, outermost
            (first in the method resolution order) lowest.
    """

    name: str = ""
    prefix: str = ""
    server_order: int = 0
    client_order: int = 0

    @classmethod
    def enabled(cls, cfg) -> bool:
        """Whether ``cfg`` switches it on: ``federated.<name>.enabled``."""
        section = getattr(cfg.federated, cls.name, None)
        return bool(section is not None and section.enabled)

    @classmethod
    def check(cls, cfg, strategy) -> None:
        """Refuse (``ConfigError``) a config or strategy it cannot protect; the extras it needs
        are checked here too."""

    @classmethod
    def halves(cls) -> tuple[type, type]:
        """``(server mixin, client mixin)``, imported when the protection is used."""
        raise NotImplementedError

    @classmethod
    def provisions(cls, cfg) -> bool:
        """Whether its clients read keys provisioned before the run (:func:`provision`)."""
        return False

    @classmethod
    def provision(cls, folder: str | Path, cfg, names: list[str]) -> None:
        """Write, in ``folder``, what the clients ``names`` read (the run is the provisioner
        when every party runs here)."""


def enabled_protections(cfg) -> list[type[Protection]]:
    """The protections ``cfg`` switches on (only their modules are imported)."""
    from lightning_fedkg.registry import PROTECTIONS

    out = []
    for name in PROTECTIONS.names():
        section = getattr(cfg.federated, name, None)
        # a protection's switch is its config section; one the config lacks is off
        if section is not None and getattr(section, "enabled", False):
            protection = PROTECTIONS.get(name)
            if protection.enabled(cfg):
                out.append(protection)
    return out


def provision(cfg, folder: str | Path, names: list[str]) -> bool:
    """Provision, in ``folder``, what the enabled protections' clients ``names`` read before
    the run (secure aggregation's identities in ``active`` mode); whether any did."""
    provisioning = [p for p in enabled_protections(cfg) if p.provisions(cfg)]
    for protection in provisioning:
        protection.provision(folder, cfg, names)
    return bool(provisioning)


def protected_halves(strategy, cfg) -> tuple[type, type]:
    """``(Server, Client)`` of ``strategy`` under ``cfg``: its own halves, or subclasses
    with the enabled protections."""
    protections = enabled_protections(cfg)
    if not protections:
        return strategy.Server, strategy.Client
    for protection in protections:
        protection.check(cfg, strategy)
    by_server = sorted(protections, key=lambda p: p.server_order)
    by_client = sorted(protections, key=lambda p: p.client_order)
    prefix = "".join(p.prefix for p in by_server)
    server = type(f"{prefix}{strategy.Server.__name__}", (*(p.halves()[0] for p in by_server), strategy.Server), {})
    client = type(f"{prefix}{strategy.Client.__name__}", (*(p.halves()[1] for p in by_client), strategy.Client), {})
    return server, client
