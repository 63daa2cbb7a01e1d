"""The protections a config turns on, composed onto a strategy's halves.

``federated.dp`` (:mod:`.dp`) and ``federated.secure_aggregation`` (:mod:`~lightning_fedkg.privacy.secure`) are
mixins placed before a holder-mean strategy's own halves, so every such method gets them
without a line of its own. On a client, secure aggregation is outermost: it masks what
differential privacy noised. On the server, DP is outermost: it annotates the downloads
secure aggregation has built and reads the clients' ε from their replies.
"""

from __future__ import annotations

__all__ = ["protected_halves"]


def protected_halves(strategy, cfg) -> tuple[type, type]:
    """``(Server, Client)`` of ``strategy`` under ``cfg``: its own halves, or subclasses
    with the enabled protections."""
    fc = cfg.federated
    servers, clients = [], []
    if fc.dp.enabled:
        from lightning_fedkg.privacy.dp_uploads import DPClient, DPServer, check_dp_config
        from lightning_fedkg.privacy.mechanisms import accounting as dp

        dp.require()
        check_dp_config(cfg, strategy)
        servers.append(DPServer)
        clients.append(DPClient)
    if fc.secure_aggregation.enabled:
        from lightning_fedkg.privacy.secure import SecureClient, SecureServer, check_secure_config
        from lightning_fedkg.privacy.mechanisms import secagg

        secagg.require()
        check_secure_config(cfg, strategy)  # the server checks again with the federation's real size
        servers.append(SecureServer)
        clients.insert(0, SecureClient)
    if not servers:
        return strategy.Server, strategy.Client
    prefix = "".join("DP" if s.__name__.startswith("DP") else "Secure" for s in servers)
    server = type(f"{prefix}{strategy.Server.__name__}", (*servers, strategy.Server), {})
    client = type(f"{prefix}{strategy.Client.__name__}", (*clients, strategy.Client), {})
    return server, client
