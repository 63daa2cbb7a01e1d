"""The client half of secure aggregation: its steps' mixins composed, what it checks in
each field the server sends (:mod:`~lightning_fedkg.federated.stances`), its identity and the
state it keeps (never a round's secrets)."""

from __future__ import annotations

from dataclasses import asdict

from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.privacy import identities
from lightning_fedkg.privacy.mechanisms import secagg
from lightning_fedkg.privacy.secure.hidden import ClientHidden
from lightning_fedkg.privacy.secure.keys import ClientKeys
from lightning_fedkg.privacy.secure.masking import ClientMasking
from lightning_fedkg.privacy.secure.protocol import (
    SA_CHECK,
    SA_KEYS,
    SA_SHARES,
    SA_UNMASK,
    _ClientRound,
    check_secure_config,
)
from lightning_fedkg.privacy.secure.unmask import ClientUnmask
from lightning_fedkg.federated.stances import checked, harmless, pinned


_ACTIVE = "federated.secure_aggregation.active"
_HIDDEN = "federated.secure_aggregation.hide_aggregate"
_ROUND = {
    "config.sa.round": checked("the round the attempt was keyed for: every later stage must name it, and it is "
                               "in every statement the client signs"),
    "config.sa.attempt": checked("an id the client keyed once (spent: never keyed again), named by every later "
                                 "stage of the attempt and in every statement it signs"),
}
_NOT_READ = harmless("not read: the client's own value from an earlier stage of the attempt stands")
_HIDDEN_SUM = harmless("the hidden aggregate the client decodes with the federation key: a deviating value spoils "
                       "the rows it reads (quality); it reveals nothing")
_HIDDEN_FIELDS = {f"arrays.{{tensor}}@{k}": _HIDDEN_SUM for k in ("sum", "count", "serial", "holders")}
_HIDDEN_FIELDS["arrays.sa.okey.{n}.{n}.{stage}.{n}.{peer}"] = _HIDDEN_SUM
_HIDDEN_FIELDS["arrays.sa.gidx.{tensor}"] = harmless(
    "where the client's rows sit in the union: with hide_aggregate it only indexes the client's own offsets, "
    "which the server cannot take off, whatever the index. Without it (dense mode) it places the rows: a server "
    "lying about the alignment could give a row a place no other client fills, so active refuses dense mode "
    "without hide_aggregate, and an honest-but-curious server is trusted with it", when=_HIDDEN)
_MASKED = {
    **_ROUND, **_HIDDEN_FIELDS,
    "config.sa.threshold": _NOT_READ, "config.sa.parties": _NOT_READ, "config.sa.serial": _NOT_READ,
    "config.sa.shared": checked("the sharers: must include this client, at least t of them, all among the parties "
                                "it shared its secrets with; masked once per attempt"),
    "config.sa.holders.{tensor}": checked(
        "whom the client masks a tensor with: in dense mode every sharer or refused; in shared_rows a named peer "
        "without masking positions masks nothing, and a row is uploaded only if min_holders parties hold it by "
        "the client's own masking"),
    "config.sa.rows.{tensor}": harmless("dense: the union's size the rows are laid over: one that does not hold "
                                        "the client's indices is refused, a larger one adds masked zeros",
                                        when=_HIDDEN),
    "config.sa.whole": harmless("which tensors are masked as one row: one taken whole is masked whole with "
                                "every holder, or refused where its masking positions do not fit"),
    "arrays.sa.ct.{peer}": checked("the peer's shares, authenticated (ChaCha20-Poly1305) under the pair's key, "
                                   "bound to the round and direction"),
    "arrays.sa.s_pk.{peer}": harmless("not read under active: the client masks with the keys it verified in "
                                      "sa_shares (without active, the server is trusted to relay them)",
                                      when=_ACTIVE),
    "arrays.sa.pos.{peer}.{tensor}": checked(
        "which rows of mine a peer holds: a position counts that peer only if it masks the row too (else the "
        "row's sum, count column included, is noise to the server); a row fewer than min_holders hold is kept, "
        "and the client refuses to unmask when the survivors leave an uploaded row below min_holders"),
}
_SURVIVORS = checked("at least t of the sharers, with this client; under active the list it signed (one per "
                     "attempt), with t valid signatures; no uploaded row left below min_holders")


class SecureClient(ClientKeys, ClientMasking, ClientUnmask, ClientHidden):
    """Mixin before a :class:`~lightning_fedkg.federated.strategy.ClientHalf` (see the module doc)."""

    RECEIVES = {
        SA_KEYS: {**_ROUND, "config.sa.threshold": pinned("must equal t of the client's roster (in process, of "
                                                          "its own config)")},
        SA_SHARES: {
            **_ROUND, "config.sa.threshold": _NOT_READ,
            "config.sa.parties": checked("must include this client, be at least t with t a strict majority of "
                                         "them, and (with a roster) hold only its members"),
            "arrays.c_pk.{peer}": checked("covered by the peer's signature on the federation, round and attempt "
                                          "(without active, the server is trusted to relay it)", when=_ACTIVE),
            "arrays.s_pk.{peer}": checked("as the peer's share key: signed", when=_ACTIVE),
            "arrays.sig.{peer}": checked("verified with the peer's key in the client's roster", when=_ACTIVE),
        },
        "train": _MASKED,
        # an upload outside the round (FedLU's unlearning) sends no rows, so no hidden sums
        "upload": {k: v for k, v in _MASKED.items() if "@" not in k and ".okey." not in k},
        SA_CHECK: {**_ROUND, "config.sa.survivors": checked("at least t of the sharers, with this client; it signs "
                                                            "one list per attempt")},
        SA_UNMASK: {
            **_ROUND, "config.sa.survivors": _SURVIVORS,
            "config.sa.dropped": checked("disjoint from the survivors; the client reveals mask-key shares only of "
                                         "the sharers it recorded that are not survivors"),
            "arrays.check.{peer}": checked("signatures on the survivor list, round, attempt and round keys, verified "
                                           "with the roster", when=_ACTIVE),
        },
        "evaluate": _HIDDEN_FIELDS, "deliver": _HIDDEN_FIELDS,
    }

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        self.sa = party.cfg.federated.secure_aggregation
        #: the policy provisioned beside this client (:mod:`~lightning_fedkg.privacy.identities`), or None
        self.roster = identities.read_roster(party.identities) if identities.has_roster(party.identities) else None
        # t from what this client holds itself, never from the server: the roster where there
        # is one (a Flower client's config came from the server at registration), else this
        # process's own config (an in-process run). A server-sent t is checked against it.
        self.threshold = check_secure_config(party.cfg, strategy)
        if self.roster is not None:
            self.threshold = self.roster.threshold
        self._round: _ClientRound | None = None
        self._gidx: dict[str, Tensor] = {}
        #: shared_rows: ``{tensor: my rows kept to myself}`` (too few holders to upload them);
        #: a download does not overwrite them
        self._kept: dict[str, Tensor] = {}
        self._identity = self._own_identity(party) if self.sa.active else b""
        #: the federation a signature names: the digest of the roster this client holds
        self._federation = self.roster.digest() if self.roster is not None else ""
        #: every attempt id this client has made keys for (spent: never keyed twice)
        self._attempts: set[str] = set()

    def _own_identity(self, party) -> bytes:
        """active: this client's private identity key, checked against its roster entry."""
        if self.roster is None:
            raise ConfigError(f"federated.secure_aggregation.active: {party.name} has no identity roster in "
                              f"{party.identities}; active mode needs each client's own private key and the "
                              "roster of its peers' public keys (lightning_fedkg.privacy.identities)")
        private = identities.read_private_key(party.identities, party.name)
        try:
            listed = self.roster.public_key(party.name)
        except KeyError as err:
            raise ConfigError(f"{party.identities}: {err.args[0]}") from None
        if secagg.identity_public(private) != listed:
            raise ConfigError(f"{party.identities}: {party.name}'s private key does not match its roster entry")
        return private

    def _identity_of(self, peer: str) -> bytes:
        """A peer's identity public key, from the roster only; a peer not in it is refused."""
        try:
            return self.roster.public_key(peer)
        except KeyError as err:
            raise RuntimeError(f"secure aggregation: {err.args[0]}; {self.party.name} refuses it as a peer") from None

    def state_dict(self) -> dict:
        # The round's secrets are never part of a saved state: a state can be restored (a
        # resumed run, or a Flower "restore" request from the server) and a restored secret
        # could be revealed twice. A client process that ends between two messages keeps
        # them through round_secrets() instead, which the unmasking spends.
        state = super().state_dict()
        state["secure_client"] = {"gidx": {k: v.clone() for k, v in self._gidx.items()},
                                  "kept": {k: v.clone() for k, v in self._kept.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        saved = state.get("secure_client") or {}
        self._gidx = {k: v.long() for k, v in saved.get("gidx", {}).items()}
        self._kept = {k: v.bool() for k, v in saved.get("kept", {}).items()}

    def spent_state(self) -> dict:
        return {**super().spent_state(), "sa_attempts": sorted(self._attempts)}

    def load_spent_state(self, state: dict) -> None:
        super().load_spent_state(state)
        self._attempts |= set(state.get("sa_attempts", []))

    def round_secrets(self) -> dict | None:
        """The secrets of the round in progress, or ``None`` once unmasked (or before any).
        :class:`~lightning_fedkg.backends.flower.client.ClientRuntime` keeps them in one file of its
        own, never in a numbered state, and deletes it when this returns ``None``."""
        return None if self._round is None else asdict(self._round)

    def load_round_secrets(self, secrets: dict | None) -> None:
        """Take back :meth:`round_secrets` written by an earlier process of this client."""
        self._round = None if secrets is None else _ClientRound(**secrets)

    def _current(self, sa: dict, what: str) -> _ClientRound:
        """The round in progress, if ``sa`` names it; refuses otherwise (an unmasked round
        has no secrets left: a second unmasking of it is refused here, by name)."""
        st = self._round
        if st is None or st.round != int(sa["round"]) or st.attempt != sa.get("attempt"):
            raise RuntimeError(f"secure aggregation: {self.party.name} has no secrets of round {sa['round']}, attempt "
                               f"{sa.get('attempt')} for {what}: that attempt was already unmasked or never keyed "
                               "here; refusing")
        return st
