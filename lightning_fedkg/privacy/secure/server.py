"""The server half of secure aggregation: its steps' mixins composed, the schedule of a
masked round, and the state that survives a resume (hidden sums, their keys)."""

from __future__ import annotations

from torch import Tensor

from lightning_fedkg.privacy.secure.hidden import ServerHidden
from lightning_fedkg.privacy.secure.keys import ServerKeys
from lightning_fedkg.privacy.secure.masking import ServerMasking
from lightning_fedkg.privacy.secure.protocol import (
    MASKED,
    SA_CHECK,
    SA_KEYS,
    SA_SHARES,
    SA_UNMASK,
    _ServerRound,
    check_secure_config,
)
from lightning_fedkg.privacy.secure.unmask import ServerUnmask


class SecureServer(ServerKeys, ServerMasking, ServerUnmask, ServerHidden):
    """Mixin before a :class:`~lightning_fedkg.federated.holder_mean.HolderMeanServer` (see the module doc)."""

    def __init__(self, ctx, strategy) -> None:
        super().__init__(ctx, strategy)
        self.sa = ctx.cfg.federated.secure_aggregation
        self.threshold = check_secure_config(ctx.cfg, strategy, len(ctx.clients))
        self._round: _ServerRound | None = None
        self._positions: dict[tuple[str, str, str], Tensor] = {}
        #: hide_aggregate: ``{tensor: {"sum", "count", "serial", "holders"}}`` of the rows aggregated
        #: so far (``holders``: a bit mask over :attr:`bit` of the clients in each row's sum).
        self.hidden: dict[str, dict[str, Tensor]] = {}
        #: hide_aggregate: ``{serial: (round, stage, {client: mask public key})}``, what the
        #: clients need to rebuild the offsets of that aggregation's sums (no secret).
        self.offset_keys: dict[int, tuple[int, str, dict[str, bytes]]] = {}
        self.bit = {name: i for i, name in enumerate(sorted(ctx.clients))}
        self.serial = 0

    def protocol(self, stage: str) -> tuple[str, ...]:
        if stage in MASKED:
            check = (SA_CHECK,) if self.sa.active else ()
            return (SA_KEYS, SA_SHARES, stage, *check, SA_UNMASK)
        return super().protocol(stage)

    @property
    def stages(self) -> tuple[str, ...]:
        return self.protocol("train")

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["secure"] = {"serial": self.serial, "offset_keys": dict(self.offset_keys),
                           "hidden": {t: {k: v.clone() for k, v in h.items()} for t, h in self.hidden.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        secure = state.get("secure") or {}
        self.serial = int(secure.get("serial", 0))
        self.offset_keys = dict(secure.get("offset_keys", {}))
        self.hidden = {t: {k: v.clone() for k, v in h.items()} for t, h in secure.get("hidden", {}).items()}
