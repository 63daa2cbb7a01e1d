"""Secure aggregation for every holder-mean strategy (``federated.secure_aggregation``).

After Bonawitz et al. (CCS 2017): a round becomes ``sa_keys``, ``sa_shares``, the masked
``train``, ``sa_check`` (``active`` only) and ``sa_unmask``; fewer than t answers retry it.
Modes ``shared_rows``, ``dense`` and ``hide_aggregate``; t comes from the client's own
roster or config, and no restorable state holds a round's secrets. One module per step,
each with the server's and the client's mixin: :mod:`.protocol` (names, derivations, the
config check), :mod:`.keys`, :mod:`.masking`, :mod:`.unmask`, :mod:`.hidden`; composed in
:mod:`.server` and :mod:`.client`. :class:`SecureAggregation` is its entry in
:data:`~lightning_fedkg.registry.PROTECTIONS`. Protocol and threat model: docs/privacy.md.
"""

from __future__ import annotations

from lightning_fedkg.federated.protections import Protection
from lightning_fedkg.privacy.mechanisms import secagg
from lightning_fedkg.privacy.secure.client import SecureClient
from lightning_fedkg.privacy.secure.protocol import check_secure_config, default_threshold, provision_identities
from lightning_fedkg.privacy.secure.server import SecureServer

__all__ = ["SecureAggregation", "SecureServer", "SecureClient", "check_secure_config", "default_threshold",
           "provision_identities"]


class SecureAggregation(Protection):
    """``federated.secure_aggregation`` as a protection: outermost on a client (it masks what
    DP noised), inside DP on the server; provisions identities in ``active`` mode."""

    name = "secure_aggregation"
    prefix = "Secure"
    server_order = 1
    client_order = 0

    @classmethod
    def check(cls, cfg, strategy) -> None:
        secagg.require()
        check_secure_config(cfg, strategy)  # the server checks again with the federation's real size

    @classmethod
    def halves(cls) -> tuple[type, type]:
        return SecureServer, SecureClient

    @classmethod
    def provisions(cls, cfg) -> bool:
        return bool(cfg.federated.secure_aggregation.active)

    @classmethod
    def provision(cls, folder, cfg, names: list[str]) -> None:
        provision_identities(folder, cfg, names)
