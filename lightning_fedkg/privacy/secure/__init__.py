"""Secure aggregation for every holder-mean strategy (``federated.secure_aggregation``).

After Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning" (CCS 2017). A training round becomes the stages ``sa_keys``, ``sa_shares``,
``train`` (masked fixed-point uploads), ``sa_check`` (``active`` only: signed survivor list)
and ``sa_unmask``; fewer than t answers retry the round
(:class:`~lightning_fedkg.federated.strategy.RetryRound`). Modes: ``shared_rows``
(default), ``dense``, and ``hide_aggregate`` (the server learns neither an upload nor the
mean). t comes from the client's own roster or config, never from the server, and no
restorable state holds a round's secrets. The protocol, what the server learns per mode,
collusion and the ``active`` threat model: docs/privacy.md.

One module per step, each with the server's and the client's part as mixins:

* :mod:`.protocol` -- stage names, key derivations and signed statements, the config check;
* :mod:`.keys` -- ``sa_keys`` and ``sa_shares``: fresh keys advertised, secrets shared;
* :mod:`.masking` -- the masked ``train``/``upload`` stage;
* :mod:`.unmask` -- ``sa_check`` (``active``) and ``sa_unmask``: the survivors' shares, the sum;
* :mod:`.hidden` -- ``hide_aggregate``: sums only the clients can read;
* :mod:`.server`, :mod:`.client` -- :class:`SecureServer` and :class:`SecureClient`, the
  steps composed, with their state and the client's checks of what it receives.

:class:`SecureAggregation` is the protection the registry names
(:data:`~lightning_fedkg.registry.PROTECTIONS`).
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
