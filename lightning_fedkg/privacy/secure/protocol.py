"""Secure aggregation for every holder-mean strategy (``federated.secure_aggregation``).

After Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning" (CCS 2017). A training round becomes the stages ``sa_keys``, ``sa_shares``,
``train`` (masked fixed-point uploads), ``sa_check`` (``active`` only: signed survivor list)
and ``sa_unmask``; fewer than t answers retry the round (:class:`~.strategy.RetryRound`).
Modes: ``shared_rows`` (default), ``dense``, and ``hide_aggregate`` (the server learns
neither an upload nor the mean). t comes from the client's own roster or config, never
from the server, and no restorable state holds a round's secrets. The protocol, what the
server learns per mode, collusion and the ``active`` threat model: docs/privacy.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.privacy import identities
from lightning_fedkg.federated.holder_mean import ONE_ROW, HolderMeanServer
from lightning_fedkg.federated.message import Message
from lightning_fedkg.privacy.stances import checked, harmless, pinned
from lightning_fedkg.federated.strategy import STRATEGIES, RetryRound, num_selected
from lightning_fedkg.privacy.mechanisms import secagg

__all__ = ["SecureServer", "SecureClient", "check_secure_config", "default_threshold", "provision_identities"]

SA_KEYS, SA_SHARES, SA_CHECK, SA_UNMASK = "sa_keys", "sa_shares", "sa_check", "sa_unmask"
#: The stages whose replies are masked (a training round's and a phase's upload).
MASKED = ("train", "upload")
SA_STAGES = (SA_KEYS, SA_SHARES, SA_CHECK, SA_UNMASK)
#: Secure-aggregation arrays in a download are named ``sa.<what>...``; hidden rows ``<tensor>@<what>``.
PREFIX = "sa."


def default_threshold(parties: int, active: bool = False) -> int:
    """t of t-of-n when ``threshold`` is unset: a strict majority, ``⌊n/2⌋ + 1``; with
    ``active``, ``⌊2n/3⌋ + 1``, so that the signed survivor list holds against a server
    colluding with fewer than n/3 clients (it needs 2t > n + |C|, see the module doc)."""
    return 2 * parties // 3 + 1 if active else parties // 2 + 1


def _sign(me: str, peer: str) -> int:
    return 1 if me < peer else -1


def _pair_info(round: int, stage: str, tensor: str, a: str, b: str) -> str:
    lo, hi = sorted((a, b))
    return f"fedkg-sa-pair|{round}|{stage}|{tensor}|{lo}|{hi}"


def _bytes(t: Tensor) -> bytes:
    return t.to(torch.uint8).numpy().tobytes()


def _tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _words(key: bytes, shape) -> Tensor:
    n = 1
    for s in shape:
        n *= int(s)
    return secagg.keystream_words(key, n).view(*shape)


def _offset(key: bytes, round: int, stage: str, tensor: str, name: str, public: bytes, rows: int,
            width: int) -> Tensor:
    """Client ``name``'s hidden-aggregate offset of ``tensor`` for the first ``rows`` rows.

    Keyed by the federation key and by what the client itself knows of the aggregation: the
    round, the stage and its own fresh mask public key of that attempt, so no server message
    can make two aggregations share an offset. Each holder adds its own independent offset:
    their sum is uniform in ℤ_{2^32} whatever the holder count (one offset added c times
    would leave the low bits of the sum for an even c)."""
    info = f"fedkg-sa-offset|{round}|{stage}|{tensor}|{name}|{bytes(public).hex()}"
    return _words(secagg.derive_key(key, info), (rows, width))


def _check_statement(federation: str, round: int, attempt: str, stage: str, survivors: list[str],
                     keys: bytes) -> bytes:
    """What a client signs in the consistency check: this attempt's survivor list and the
    digest of the round keys it shared under (:func:`_key_set`), so that a signature of
    another attempt, or of a client that saw other keys, does not count."""
    return (f"fedkg-sa-check|{federation}|{round}|{attempt}|{stage}|{','.join(sorted(survivors))}|".encode()
            + bytes(keys))


def _keys_statement(federation: str, round: int, attempt: str, name: str, c_pk: bytes, s_pk: bytes) -> bytes:
    """What a client signs when it advertises its round keys (``active``): bound to the
    federation (its roster's digest), the round and the attempt."""
    return f"fedkg-sa-keys|{federation}|{round}|{attempt}|{name}|".encode() + bytes(c_pk) + bytes(s_pk)


def _key_set(c_pk: dict[str, bytes], s_pk: dict[str, bytes]) -> bytes:
    """SHA-256 of every party's round keys, as one client saw them."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(c_pk):
        h.update(name.encode() + b"\0" + bytes(c_pk[name]) + bytes(s_pk[name]))
    return h.digest()


def new_attempt() -> str:
    """A fresh attempt id (128 random bits): a round's every try is named anew, so nothing
    signed in one try (or one run) verifies in another, and a client keys each id once."""
    import secrets

    return secrets.token_hex(16)


def check_secure_config(cfg, strategy, num_clients: int | None = None) -> int:
    """Validate ``federated.secure_aggregation`` for ``strategy`` in a federation of
    ``num_clients`` (default ``data.num_clients``); returns the threshold t."""
    sc = cfg.federated.secure_aggregation
    if not issubclass(strategy.Server, HolderMeanServer):
        raise ConfigError(f"federated.secure_aggregation needs a holder-mean strategy (one whose "
                          f"server is a HolderMeanServer); {cfg.federated.strategy!r} aggregates otherwise")
    if tuple(strategy.Server.stages) != ("train",):
        raise ConfigError(f"federated.secure_aggregation wraps a one-stage training round; {strategy.name!r} "
                          f"runs {tuple(strategy.Server.stages)}")
    n = num_selected(cfg.federated.fraction, num_clients or cfg.data.num_clients)
    t = sc.threshold if sc.threshold is not None else default_threshold(n, sc.active)
    if n >= 2 and not default_threshold(n) <= t <= n:
        raise ConfigError(f"federated.secure_aggregation.threshold={t} must be in [{default_threshold(n)}, {n}] "
                          f"(a strict majority of the {n} clients selected per round): with t <= n/2 a server "
                          "telling half the clients that a peer survived and half that it dropped gets t shares "
                          "of both its secrets")
    if sc.active and sc.mode == "dense" and not sc.hide_aggregate:
        raise ConfigError("federated.secure_aggregation.active with mode=dense needs hide_aggregate=true: a dense "
                          "client cannot count the holders of its rows, so a server that lies about the alignment "
                          "could give a row a place only that client fills and read it as an aggregate; "
                          "shared_rows counts them (min_holders), hide_aggregate hides what any place sums to")
    if sc.hide_aggregate and not cfg.federated.federation_key:
        raise ConfigError("federated.secure_aggregation.hide_aggregate needs federated.federation_key: the offset "
                          "comes from it, and the default key derives from the seed, which the server knows")
    if sc.hide_aggregate and (num_clients or cfg.data.num_clients) > 63:
        raise ConfigError("federated.secure_aggregation.hide_aggregate supports at most 63 clients: each row's "
                          "holders are a bit mask in one int64")
    if cfg.federated.aggregation == "named_rows":
        raise ConfigError("federated.secure_aggregation needs federated.aggregation=selected_holders or "
                          "all_holders: under named_rows each client tells the server which rows it trained on")
    if sc.hide_aggregate and cfg.federated.aggregation == "all_holders":
        raise ConfigError("federated.secure_aggregation.hide_aggregate needs federated.aggregation="
                          "selected_holders: the damped mean needs the server's current rows, which it cannot see")
    return min(t, n)


def provision_identities(folder, cfg, names: list[str]) -> identities.Roster:
    """:func:`~.identities.provision` for the clients ``names`` of ``cfg``, with the t that
    :func:`check_secure_config` gives for them."""
    t = check_secure_config(cfg, STRATEGIES.get(cfg.federated.strategy), len(names))
    return identities.provision(folder, names, t)


# ====================================================================== server
@dataclass
class _ServerRound:
    round: int
    threshold: int
    attempt: str = ""
    parties: list[str] = field(default_factory=list)            # U1, in Shamir order
    c_pk: dict[str, bytes] = field(default_factory=dict)
    s_pk: dict[str, bytes] = field(default_factory=dict)
    signatures: dict[str, bytes] = field(default_factory=dict)   # active: the signed key advertisements
    checks: dict[str, bytes] = field(default_factory=dict)       # active: the signed survivor list
    ciphertexts: dict[str, dict[str, Tensor]] = field(default_factory=dict)  # receiver -> sender -> ct
    shared: list[str] = field(default_factory=list)             # U2
    stage: str = "train"
    serial: int = 0
    uploads: dict[str, dict[str, Tensor]] = field(default_factory=dict)      # U3 -> tensor -> words


class SecureServer:
    """Mixin before a :class:`~.holder_mean.HolderMeanServer` (see the module doc)."""

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

    # ---------------------------------------------------------------- schedule
    def protocol(self, stage: str) -> tuple[str, ...]:
        if stage in MASKED:
            check = (SA_CHECK,) if self.sa.active else ()
            return (SA_KEYS, SA_SHARES, stage, *check, SA_UNMASK)
        return super().protocol(stage)

    @property
    def stages(self) -> tuple[str, ...]:
        return self.protocol("train")

    # ---------------------------------------------------------------- keys
    def configure_sa_keys(self, round, selected):
        t = min(self.threshold, len(selected))
        self._round = _ServerRound(round=round, threshold=t, attempt=new_attempt())
        return {name: Message(config={"sa": {**self._sa_head(), "threshold": t}}) for name in selected}

    def _sa_head(self) -> dict:
        """What every stage of the attempt names: the round and the attempt id."""
        return {"round": int(self._round.round), "attempt": self._round.attempt}

    def _enough(self, answered, stage: str) -> None:
        if len(answered) < self._round.threshold:
            raise RetryRound(f"secure aggregation: {len(answered)} clients answered {stage}, "
                             f"fewer than the threshold t={self._round.threshold}")

    def aggregate_sa_keys(self, round, replies, failures) -> None:
        st = self._round
        self._enough(replies, SA_KEYS)
        st.parties = sorted(replies)
        for name in st.parties:
            st.c_pk[name] = _bytes(replies[name].arrays["c_pk"])
            st.s_pk[name] = _bytes(replies[name].arrays["s_pk"])
            if self.sa.active:
                st.signatures[name] = _bytes(replies[name].arrays["sig"])

    # ---------------------------------------------------------------- shares
    def configure_sa_shares(self, round, selected):
        st = self._round
        keys = {f"c_pk.{n}": _tensor(st.c_pk[n]) for n in st.parties}
        if self.sa.active:  # each client checks every advertisement against its author's identity
            keys.update({f"s_pk.{n}": _tensor(st.s_pk[n]) for n in st.parties})
            keys.update({f"sig.{n}": _tensor(st.signatures[n]) for n in st.parties})
        config = {"sa": {**self._sa_head(), "threshold": st.threshold, "parties": st.parties}}
        return {name: Message(arrays=dict(keys), config=config) for name in st.parties}

    def aggregate_sa_shares(self, round, replies, failures) -> None:
        st = self._round
        self._enough(replies, SA_SHARES)
        st.shared = sorted(replies)
        st.ciphertexts = {n: {} for n in st.shared}
        for sender in st.shared:
            for key, ct in replies[sender].arrays.items():
                receiver = key.removeprefix("ct.")
                if receiver in st.ciphertexts:
                    st.ciphertexts[receiver][sender] = ct

    # ---------------------------------------------------------------- masked stage
    def _index(self, tensor: str, name: str) -> Tensor:
        idx = self.client_index(tensor, name)
        return ONE_ROW if idx is None else idx

    def _rows_of(self, tensor: str) -> int:
        return 1 if self.alignments[self.group_of[tensor]] is None else int(self.table[tensor].shape[0])

    def positions(self, tensor: str, me: str, peer: str) -> Tensor:
        """Local positions, in ``me``'s rows of ``tensor``, of the rows ``peer`` holds too,
        in the order of their global ids (so both sides mask the same rows in one order)."""
        key = (tensor, me, peer)
        if key not in self._positions:
            rows = self._rows_of(tensor)
            mine, theirs = self._index(tensor, me), self._index(tensor, peer)
            local = torch.full((rows,), -1, dtype=torch.long)
            local[mine] = torch.arange(mine.numel())
            both = torch.zeros(rows, dtype=torch.bool)
            both[theirs] = True
            both &= local >= 0
            self._positions[key] = local[both.nonzero().squeeze(1)]
        return self._positions[key]

    def _holders(self, tensor: str, among: list[str]) -> list[str]:
        return [n for n in among if n in self.holders_of[tensor]]

    def _secure_download(self, stage: str, base: dict[str, Message]) -> dict[str, Message]:
        st = self._round
        st.stage = stage
        self.serial += 1
        st.serial = self.serial
        out = {}
        for name, message in base.items():
            arrays = dict(message.arrays)
            for sender, ct in st.ciphertexts[name].items():
                arrays[f"{PREFIX}ct.{sender}"] = ct
            for peer in st.shared:
                if peer != name:
                    arrays[f"{PREFIX}s_pk.{peer}"] = _tensor(st.s_pk[peer])
            holders = {}
            for t in self.table:
                if name not in self.holders_of[t]:
                    continue
                holders[t] = self._holders(t, st.shared)
                if self.sa.mode == "dense" or self.sa.hide_aggregate:
                    arrays[f"{PREFIX}gidx.{t}"] = self._index(t, name).to(torch.int32)
                if self.sa.mode == "shared_rows":
                    for peer in holders[t]:
                        pos = self.positions(t, name, peer) if peer != name else None
                        if pos is not None and pos.numel():
                            arrays[f"{PREFIX}pos.{peer}.{t}"] = pos.to(torch.int32)
            config = dict(message.config)
            config["sa"] = {**self._sa_head(), "threshold": st.threshold, "parties": st.parties,
                            "shared": st.shared, "holders": holders, "serial": st.serial,
                            "rows": {t: self._rows_of(t) for t in holders},
                            "whole": sorted(t for t in holders if t in self._whole())}
            out[name] = Message(arrays=arrays, metrics=dict(message.metrics), config=config)
        return out

    def configure_train(self, round, selected):
        return self._secure_download("train", super().configure_train(round, self._round.shared))

    def configure_upload(self, round, selected):
        return self._secure_download("upload", super().configure_upload(round, self._round.shared))

    def aggregate_train(self, round, replies, failures) -> None:
        st = self._round
        self._enough(replies, st.stage)
        st.uploads = {n: {t: secagg.from_wire(v) for t, v in replies[n].arrays.items()} for n in sorted(replies)}

    def aggregate_upload(self, round, replies, failures) -> None:
        self.aggregate_train(round, replies, failures)

    # ---------------------------------------------------------------- consistency check (active)
    def configure_sa_check(self, round, selected):
        st = self._round
        survivors = sorted(st.uploads)
        config = {"sa": {**self._sa_head(), "survivors": survivors}}
        return {name: Message(config=config) for name in survivors}

    def aggregate_sa_check(self, round, replies, failures) -> None:
        st = self._round
        self._enough(replies, SA_CHECK)
        st.checks = {n: _bytes(replies[n].arrays["sig"]) for n in sorted(replies)}

    # ---------------------------------------------------------------- unmask
    def configure_sa_unmask(self, round, selected):
        st = self._round
        survivors = sorted(st.uploads)
        dropped = [n for n in st.shared if n not in st.uploads]
        config = {"sa": {**self._sa_head(), "survivors": survivors, "dropped": dropped}}
        arrays = {f"check.{n}": _tensor(sig) for n, sig in st.checks.items()}
        asked = sorted(st.checks) if self.sa.active else survivors
        return {name: Message(arrays=dict(arrays), config=config) for name in asked}

    def aggregate_sa_unmask(self, round, replies, failures) -> None:
        st = self._round
        self._enough(replies, SA_UNMASK)
        order = {n: i + 1 for i, n in enumerate(st.parties)}  # Shamir indices
        survivors = sorted(st.uploads)
        dropped = [n for n in st.shared if n not in st.uploads]

        def rebuild(kind: str, owner: str) -> bytes:
            shares = {order[h]: _bytes(replies[h].arrays[f"{kind}.{owner}"])
                      for h in sorted(replies) if f"{kind}.{owner}" in replies[h].arrays}
            if len(shares) < st.threshold:
                raise RetryRound(f"secure aggregation: {len(shares)} shares of {owner}'s {kind}, below t={st.threshold}")
            return secagg.combine_secret(shares, st.threshold)

        seeds = {n: rebuild("b", n) for n in survivors}
        private = {d: rebuild("s", d) for d in dropped}
        bits = self.sa.fractional_bits
        if self.sa.hide_aggregate:
            self.offset_keys[st.serial] = (st.round, st.stage, {u: st.s_pk[u] for u in survivors})
        for t in self.table:
            holders = [n for n in survivors if t in st.uploads[n]]
            if not holders:
                continue
            rows = self._rows_of(t)
            total = None
            for u in holders:
                y = st.uploads[u][t]
                y = y - _words(secagg.derive_key(seeds[u], f"fedkg-sa-self|{st.round}|{st.stage}|{t}"), y.shape)
                for d in self._holders(t, dropped):
                    key = secagg.derive_key(secagg.agree(private[d], st.s_pk[u]),
                                            _pair_info(st.round, st.stage, t, u, d))
                    if self.sa.mode == "dense":
                        y = y - _sign(u, d) * _words(key, y.shape)
                    else:
                        pos = self.positions(t, u, d)
                        if pos.numel():
                            y[pos] -= _sign(u, d) * _words(key, (pos.numel(), y.shape[1]))
                if self.sa.mode == "dense":
                    total = y if total is None else total + y
                else:
                    if total is None:
                        total = torch.zeros(rows, y.shape[1], dtype=torch.int64)
                    total.index_add_(0, self._index(t, u), y)
            total = torch.remainder(total, secagg.MODULUS)
            # each row's count of uploads is the sum of the clients' own indicators: a row a
            # client kept to itself (too few holders) counts neither its zeros nor itself
            counts = secagg.signed(total[:, -1])
            total = total[:, :-1]
            table = self.table[t]
            shape = (1, *table.shape) if t in self._whole() else tuple(table.shape)
            if self.sa.hide_aggregate:
                self._store_hidden(t, total, counts, st.serial, self._holder_bits(t, rows, holders))
            else:
                sums = secagg.signed(total).to(torch.float64) / float(1 << bits)
                self.apply_sums(t, sums.view(shape), counts)
        if self.sa.hide_aggregate:  # forget the keys of aggregations no row reads any more
            live = {int(s) for h in self.hidden.values() for s in torch.unique(h["serial"][h["count"] > 0]).tolist()}
            self.offset_keys = {s: v for s, v in self.offset_keys.items() if s in live}
        self._round = None

    def _holder_bits(self, tensor: str, rows: int, holders: list[str]) -> Tensor:
        """Per row, the bit mask of the clients whose offsets are in its sum: the row's
        holders (``shared_rows``), or every survivor (``dense`` uploads, and offsets, span
        every row, so the mask tells a client nothing of its peers' rows)."""
        bits = torch.zeros(rows, dtype=torch.int64)
        for u in holders:
            if self.sa.mode == "dense":
                bits |= 1 << self.bit[u]
            else:
                bits[self._index(tensor, u)] |= 1 << self.bit[u]
        return bits

    def _whole(self) -> set[str]:
        return {t for t in self.table if self.alignments[self.group_of[t]] is None}

    def _store_hidden(self, tensor: str, total: Tensor, counts: Tensor, serial: int, holders: Tensor) -> None:
        rows = total.shape[0]
        h = self.hidden.setdefault(tensor, {
            "sum": torch.zeros(rows, total.shape[1], dtype=torch.int64),
            "count": torch.zeros(rows, dtype=torch.int64),
            "serial": torch.zeros(rows, dtype=torch.int64),
            "holders": torch.zeros(rows, dtype=torch.int64),
        })
        held = counts > 0
        h["sum"][held] = total[held]
        h["count"][held] = counts[held]
        h["serial"][held] = serial
        h["holders"][held] = holders[held]

    # ---------------------------------------------------------------- downloads
    def rows(self, name: str) -> dict[str, Tensor]:
        """The rows as the plain server sends them; with ``hide_aggregate``, the rows never
        aggregated as they are (the initial rows) and the others as offset sums with their
        holder counts and serials, which only the clients can read (:meth:`SecureClient.receive`)."""
        out = super().rows(name)
        if not self.sa.hide_aggregate:
            return out
        for t in list(out):
            idx = self._index(t, name)
            out[f"{PREFIX}gidx.{t}"] = idx.to(torch.int32)
            h = self.hidden.get(t)
            if h is None:
                continue
            counts = h["count"][idx]
            if bool((counts > 0).all()):
                del out[t]  # every row is in the sums: the initial rows would only cost bytes
            out[f"{t}@sum"] = secagg.to_wire(h["sum"][idx])
            out[f"{t}@count"] = counts.to(torch.int32)
            out[f"{t}@serial"] = h["serial"][idx].to(torch.int32)
            out[f"{t}@holders"] = h["holders"][idx]
            for serial in torch.unique(h["serial"][idx][counts > 0]).tolist():
                round, stage, keys = self.offset_keys[int(serial)]
                for u, public in keys.items():
                    out[f"{PREFIX}okey.{int(serial)}.{round}.{stage}.{self.bit[u]}.{u}"] = _tensor(public)
        return out

    # ---------------------------------------------------------------- state
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


# ====================================================================== client
@dataclass
class _ClientRound:
    """One round's secrets and what the client learnt in it; never in a saved state."""

    round: int
    threshold: int
    c_sk: bytes
    c_pk: bytes
    s_sk: bytes
    s_pk: bytes
    seed: bytes
    attempt: str = ""
    parties: list[str] = field(default_factory=list)
    own: tuple[bytes, bytes] | None = None                      # my shares of my own secrets
    c_pk_of: dict[str, bytes] = field(default_factory=dict)       # the peers' share-encryption keys
    s_pk_of: dict[str, bytes] = field(default_factory=dict)       # active: the peers' signed mask keys
    received: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # peer -> (b share, s share)
    shared: list[str] = field(default_factory=list)             # U2, as told with the masked stage
    stage: str = ""
    checked: list[str] | None = None                            # active: the survivor list I signed
    keys: bytes = b""                                            # active: digest of the round keys I shared under
    #: shared_rows: ``{tensor: {peer: my row positions I mask with that peer}}`` (who holds my rows)
    peer_rows: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    #: shared_rows: ``{tensor: which of my rows I uploaded}`` (held by at least ``min_holders``)
    uploaded: dict[str, Tensor] = field(default_factory=dict)


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


class SecureClient:
    """Mixin before a :class:`~.strategy.ClientHalf` (see the module doc)."""

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
        #: the policy provisioned beside this client (:mod:`.identities`), or None
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

    # ---------------------------------------------------------------- state
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

    # ---------------------------------------------------------------- dispatch
    def handle(self, stage, message, round):
        if stage not in MASKED:
            return super().handle(stage, message, round)
        extra = {k: v for k, v in message.arrays.items() if k.startswith(PREFIX)}
        keep = f"{PREFIX}okey."  # the offset keys of hidden sums go on to receive()
        plain = Message(arrays={k: v for k, v in message.arrays.items() if not k.startswith(PREFIX) or k.startswith(keep)},
                        metrics=message.metrics, config={k: v for k, v in message.config.items() if k != "sa"})
        self._gidx.update({k[len(PREFIX) + 5:]: v.long() for k, v in extra.items() if k.startswith(f"{PREFIX}gidx.")})
        self._current(message.config["sa"], stage).peer_rows = self._peer_rows(message.config["sa"], extra)
        reply = super().handle(stage, plain, round) or Message()
        return Message(arrays=self._mask(stage, reply.arrays, extra, message.config["sa"]),
                       metrics=reply.metrics, config=reply.config)

    def _peer_rows(self, sa: dict, extra: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
        """``{tensor: {peer: positions}}``: the rows of mine each peer holds, as the masking
        positions of this stage give them (shared_rows; empty in dense mode)."""
        me = self.party.name
        return {t: {p: extra[f"{PREFIX}pos.{p}.{t}"].long() for p in peers
                    if p != me and f"{PREFIX}pos.{p}.{t}" in extra}
                for t, peers in sa["holders"].items()}

    def row_holders(self, tensor: str, rows: int, among: list[str] | None = None) -> Tensor:
        """Per row of my ``rows`` of ``tensor`` (one for a tensor shared whole), how many
        parties of this round hold it: me and the peers I mask it with (of ``among`` only, if
        given). Counted from my own masking: a peer the server claims for a row of mine masks
        it with me, or the row's masks do not cancel in the sum."""
        st = self._round
        if st is None or tensor not in st.peer_rows:
            raise RuntimeError(f"secure aggregation: {self.party.name} has no masking positions of {tensor!r} "
                               "this round")
        count = torch.ones(rows, dtype=torch.long)
        for peer, pos in st.peer_rows[tensor].items():
            if among is None or peer in among:
                count[pos] += 1
        return count

    def _current(self, sa: dict, what: str) -> _ClientRound:
        """The round in progress, if ``sa`` names it; refuses otherwise (an unmasked round
        has no secrets left: a second unmasking of it is refused here, by name)."""
        st = self._round
        if st is None or st.round != int(sa["round"]) or st.attempt != sa.get("attempt"):
            raise RuntimeError(f"secure aggregation: {self.party.name} has no secrets of round {sa['round']}, attempt "
                               f"{sa.get('attempt')} for {what}: that attempt was already unmasked or never keyed "
                               "here; refusing")
        return st

    # ---------------------------------------------------------------- keys and shares
    def on_sa_keys(self, message: Message, round: int) -> Message:
        sa = message.config["sa"]
        if int(sa["threshold"]) != self.threshold:
            source = "roster" if self.roster is not None else "config"
            raise RuntimeError(f"secure aggregation: the server asks for threshold t={sa['threshold']}, this "
                               f"client's {source} gives t={self.threshold}; refusing")
        attempt = sa.get("attempt")
        if not isinstance(attempt, str) or len(attempt) != 32 or attempt in self._attempts:
            raise RuntimeError(f"secure aggregation: {self.party.name} is asked for keys under attempt {attempt!r}, "
                               "which is not a fresh attempt id (it keys each one once); refusing")
        self._attempts.add(attempt)
        c_sk, c_pk = secagg.new_keypair()
        s_sk, s_pk = secagg.new_keypair()
        self._round = _ClientRound(round=int(sa["round"]), threshold=self.threshold, c_sk=c_sk, c_pk=c_pk,
                                   s_sk=s_sk, s_pk=s_pk, seed=secagg.new_seed(), attempt=attempt)
        out = {"c_pk": _tensor(c_pk), "s_pk": _tensor(s_pk)}
        if self.sa.active:
            out["sig"] = _tensor(secagg.sign(self._identity, _keys_statement(
                self._federation, int(sa["round"]), attempt, self.party.name, c_pk, s_pk)))
        return Message(arrays=out)

    def _share_key(self, peer: str, peer_public: bytes) -> bytes:
        st = self._round
        lo, hi = sorted((self.party.name, peer))
        return secagg.derive_key(secagg.agree(st.c_sk, peer_public), f"fedkg-sa-share|{st.round}|{lo}|{hi}")

    def _verified_keys(self, parties: list[str], arrays: dict[str, Tensor], st: _ClientRound) -> dict[str, bytes]:
        """active: ``{peer: mask public key}`` once every peer's advertisement carries its
        author's signature on this round and attempt; a substituted or replayed key aborts
        the round before any share is made."""
        out = {}
        for peer in parties:
            if peer == self.party.name:
                continue
            c_pk, s_pk = _bytes(arrays[f"c_pk.{peer}"]), _bytes(arrays[f"s_pk.{peer}"])
            if not secagg.verify(self._identity_of(peer), _bytes(arrays[f"sig.{peer}"]),
                                 _keys_statement(self._federation, st.round, st.attempt, peer, c_pk, s_pk)):
                raise RuntimeError(f"secure aggregation: {peer}'s keys do not carry its signature on round {st.round}, "
                                   f"attempt {st.attempt}; refusing to share (a substituted or replayed key)")
            out[peer] = s_pk
        return out

    def on_sa_shares(self, message: Message, round: int) -> Message:
        sa, me = message.config["sa"], self.party.name
        st = self._current(sa, SA_SHARES)
        parties = list(sa["parties"])
        if me not in parties or len(parties) < st.threshold or st.parties:
            raise RuntimeError(f"secure aggregation: {me} is asked to share among {parties} (t={st.threshold})")
        if 2 * st.threshold <= len(parties):
            # t must stay a strict majority of those who share: else a split view of the
            # survivors gets t shares of both secrets of one client
            raise RuntimeError(f"secure aggregation: {me} is asked to share t={st.threshold}-of-{len(parties)}, "
                               "not a strict majority; refusing")
        unknown = sorted(set(parties) - set(self.roster.members)) if self.roster is not None else []
        if unknown:
            raise RuntimeError(f"secure aggregation: {unknown} are not in {me}'s roster; refusing to share with them")
        if self.sa.active:
            st.s_pk_of = self._verified_keys(parties, message.arrays, st)
        st.parties = parties
        b_shares = secagg.split_secret(st.seed, st.threshold, len(parties))
        s_shares = secagg.split_secret(st.s_sk, st.threshold, len(parties))
        out = {}
        for i, peer in enumerate(parties):
            if peer == me:
                st.own = (b_shares[i], s_shares[i])
                continue
            key = self._share_key(peer, _bytes(message.arrays[f"c_pk.{peer}"]))
            out[f"ct.{peer}"] = _tensor(secagg.encrypt(key, b_shares[i] + s_shares[i], f"{st.round}|{me}->{peer}"))
        st.c_pk_of = {p: _bytes(message.arrays[f"c_pk.{p}"]) for p in parties if p != me}
        if self.sa.active:
            st.keys = _key_set({**st.c_pk_of, me: st.c_pk}, {**st.s_pk_of, me: st.s_pk})
        return Message(arrays=out)

    # ---------------------------------------------------------------- masking
    def _mask(self, stage: str, arrays: dict[str, Tensor], extra: dict[str, Tensor], sa: dict) -> dict[str, Tensor]:
        me = self.party.name
        st = self._current(sa, stage)
        shared = list(sa["shared"])
        if me not in shared or len(shared) < st.threshold or not set(shared) <= set(st.parties) or st.shared:
            raise RuntimeError(f"secure aggregation: {me} cannot mask among {shared}")
        for peer in shared:
            if peer == me:
                continue
            data = secagg.decrypt(self._share_key(peer, st.c_pk_of[peer]), _bytes(extra[f"{PREFIX}ct.{peer}"]),
                                  f"{st.round}|{peer}->{me}")
            st.received[peer] = (data[:secagg.CHUNK], data[secagg.CHUNK:])
        st.shared, st.stage = shared, stage
        bits, bound = self.sa.fractional_bits, secagg.MODULUS // 2 // max(len(shared), 1)
        out = {}
        for t, x in arrays.items():
            q = secagg.quantise(x.reshape(1 if t in sa["whole"] else x.shape[0], -1), bits, bound)
            if self.sa.mode == "dense" and sorted(sa["holders"][t]) != sorted(shared):
                # dense masks every row of the union with every sharer: a peer left out of
                # the masking would leave rows that only the self-mask hides
                raise RuntimeError(f"secure aggregation: dense mode masks {t!r} with every sharer {shared}, but "
                                   f"the server names {sorted(sa['holders'][t])}; refusing")
            if self.sa.mode == "dense":
                full = torch.zeros(sa["rows"][t], q.shape[1] + 1, dtype=torch.int64)
                full[self._gidx[t], :-1] = q
                full[self._gidx[t], -1] = 1  # the holder indicator, an integer, not fixed point
                if self.sa.hide_aggregate:  # over every row: the readers need not know whose rows these are
                    full[:, :-1] += _offset(self._key, st.round, stage, t, me, st.s_pk, full.shape[0], q.shape[1])
                q = full
            else:
                # a row fewer than min_holders parties hold (by my own masking) would be shown
                # to the server by its aggregate: kept to myself, uploaded as zeros, and the
                # indicator column (the server's count of each row's uploads) says so
                kept = self.row_holders(t, q.shape[0]) < self.sa.min_holders
                q[kept] = 0
                st.uploaded[t], self._kept[t] = ~kept, kept
                if self.sa.hide_aggregate:
                    gidx = self._gidx[t]
                    q = q + _offset(self._key, st.round, stage, t, me, st.s_pk, int(gidx.max()) + 1, q.shape[1])[gidx]
                q = torch.cat([q, (~kept).long().unsqueeze(1)], dim=1)
            words = q + _words(secagg.derive_key(st.seed, f"fedkg-sa-self|{st.round}|{stage}|{t}"), q.shape)
            # active: the signed keys of on_sa_shares, never what this message says they are
            s_pk = {p: (st.s_pk_of[p] if self.sa.active else _bytes(extra[f"{PREFIX}s_pk.{p}"]))
                    for p in sa["holders"][t] if p != me}
            for peer, public in s_pk.items():
                key = secagg.derive_key(secagg.agree(st.s_sk, public), _pair_info(st.round, stage, t, me, peer))
                if self.sa.mode == "dense":
                    words += _sign(me, peer) * _words(key, words.shape)
                elif f"{PREFIX}pos.{peer}.{t}" in extra:
                    pos = extra[f"{PREFIX}pos.{peer}.{t}"].long()
                    words[pos] += _sign(me, peer) * _words(key, (pos.numel(), words.shape[1]))
            out[t] = secagg.to_wire(words)
        return out

    # ---------------------------------------------------------------- consistency check (active)
    def _check_survivors(self, st: _ClientRound, survivors: list[str]) -> None:
        me = self.party.name
        if not st.shared:
            raise RuntimeError(f"secure aggregation: {me} has not uploaded in round {st.round}; refusing")
        if me not in survivors or len(survivors) < st.threshold or not set(survivors) <= set(st.shared):
            raise RuntimeError(f"secure aggregation: survivors {survivors} are not at least t={st.threshold} "
                               f"of {st.shared} with {me}; refusing")

    def on_sa_check(self, message: Message, round: int) -> Message:
        """active: sign the survivor list, once per round (a second, other list is refused)."""
        sa = message.config["sa"]
        st = self._current(sa, SA_CHECK)
        survivors = sorted(sa["survivors"])
        self._check_survivors(st, survivors)
        if st.checked is not None and st.checked != survivors:
            raise RuntimeError(f"secure aggregation: {self.party.name} signed the survivors {st.checked} of round "
                               f"{st.round} already; refusing to sign {survivors}")
        st.checked = survivors
        return Message(arrays={"sig": _tensor(secagg.sign(self._identity, self._check(st, survivors)))})

    def _check(self, st: _ClientRound, survivors: list[str]) -> bytes:
        return _check_statement(self._federation, st.round, st.attempt, st.stage, survivors, st.keys)

    def _verify_check(self, st: _ClientRound, survivors: list[str], arrays: dict[str, Tensor]) -> None:
        """active: the list is the one I signed, and at least t survivors signed it too."""
        if st.checked != survivors:
            raise RuntimeError(f"secure aggregation: unmasking for survivors {survivors}, but {self.party.name} "
                               f"signed {st.checked}; refusing")
        statement = self._check(st, survivors)
        signed = [n for n in survivors if f"check.{n}" in arrays
                  and secagg.verify(self._identity_of(n), _bytes(arrays[f"check.{n}"]), statement)]
        if len(signed) < st.threshold:
            raise RuntimeError(f"secure aggregation: {len(signed)} valid signatures on the survivor list, below "
                               f"t={st.threshold}; refusing to reveal any share")

    # ---------------------------------------------------------------- unmask
    def on_sa_unmask(self, message: Message, round: int) -> Message:
        sa, me = message.config["sa"], self.party.name
        st = self._current(sa, SA_UNMASK)
        survivors = sorted(sa["survivors"])
        if set(survivors) & set(sa["dropped"]):
            raise RuntimeError(f"secure aggregation: {sorted(set(survivors) & set(sa['dropped']))} asked as "
                               "survivors and as dropped; refusing to reveal both secrets of one client")
        self._check_survivors(st, survivors)
        if self.sa.active:
            self._verify_check(st, survivors, message.arrays)
        for t, uploaded in st.uploaded.items():
            left = self.row_holders(t, uploaded.numel(), survivors)[uploaded]
            if bool((left < self.sa.min_holders).any()):
                raise RuntimeError(f"secure aggregation: with the survivors {survivors}, {int((left < self.sa.min_holders).sum())} "
                                   f"uploaded rows of {t!r} would be held by fewer than min_holders="
                                   f"{self.sa.min_holders} parties, whose aggregate shows them; refusing to unmask")
        # Spent before anything leaves: whatever happens next, this round is never unmasked again.
        self._round = None
        dropped = [n for n in st.shared if n not in survivors]  # from what I was told when masking
        shares = dict(st.received)
        shares[me] = st.own
        out = {}
        for name in survivors:
            if name in shares:
                out[f"b.{name}"] = _tensor(shares[name][0])
        for name in dropped:
            if name in shares and name != me:
                out[f"s.{name}"] = _tensor(shares[name][1])
        return Message(arrays=out)

    # ---------------------------------------------------------------- hidden aggregate
    def _offsets(self, arrays: dict) -> dict[int, tuple[int, str, dict[int, tuple[str, bytes]]]]:
        """Pop the offset keys of a download: ``{serial: (round, stage, {bit: (client, key)})}``."""
        out: dict = {}
        for k in [k for k in arrays if k.startswith(f"{PREFIX}okey.")]:
            serial, rnd, stage, bit, name = k[len(PREFIX) + 5:].split(".", 4)
            entry = out.setdefault(int(serial), (int(rnd), stage, {}))
            entry[2][int(bit)] = (name, _bytes(arrays.pop(k)))
        return out

    def receive(self, arrays) -> None:
        """Apply a download; with ``hide_aggregate`` first read the offset sums back into rows:
        remove, from each row's sum, the offsets of the clients whose uploads it holds."""
        arrays = dict(arrays)
        offsets = self._offsets(arrays)
        for k in [k for k in arrays if k.startswith(f"{PREFIX}gidx.")]:
            self._gidx[k[len(PREFIX) + 5:]] = arrays.pop(k).long()
        for k in [k for k in arrays if k.startswith(PREFIX)]:
            arrays.pop(k)
        for t in [k for k in arrays if k.endswith("@sum")]:
            name = t[:-4]
            sums, counts = secagg.from_wire(arrays.pop(t)), arrays.pop(f"{name}@count").long()
            serials, holders = arrays.pop(f"{name}@serial").long(), arrays.pop(f"{name}@holders").long()
            # the initial rows come only while some row was never aggregated
            base = arrays[name] if name in arrays else self.upload()[name]
            flat = base.reshape(counts.numel(), -1)  # one row for a tensor shared whole
            gidx = self._gidx[name]
            value = flat.to(torch.float64).clone()
            for serial in torch.unique(serials[counts > 0]).tolist():
                rnd, stage, keys = offsets[int(serial)]
                rows = (serials == serial) & (counts > 0)
                plain = sums[rows].clone()
                for bit, (client, public) in keys.items():
                    held = ((holders[rows] >> bit) & 1).bool()
                    if bool(held.any()):
                        o = _offset(self._key, rnd, stage, name, client, public, int(gidx.max()) + 1, flat.shape[1])
                        plain[held] -= o[gidx[rows][held]]
                plain = secagg.signed(plain)
                value[rows] = plain.to(torch.float64) / float(1 << self.sa.fractional_bits) / counts[rows, None]
            arrays[name] = value.to(base.dtype).view(base.shape)
        super().receive(self._keep_own(arrays))

    def _keep_own(self, arrays: dict[str, Tensor]) -> dict[str, Tensor]:
        """``arrays`` with the rows this client kept to itself (too few holders to upload)
        replaced by its own values: what the server sends for them is not an aggregate."""
        kept = {t: k for t, k in self._kept.items() if t in arrays and bool(k.any())}
        if not kept:
            return arrays
        own = self.upload()
        arrays = dict(arrays)
        for t, k in kept.items():
            value = arrays[t].clone()
            if k.numel() == 1 and (value.dim() == 0 or value.shape[0] != 1):  # a tensor shared whole
                value = own[t].to(value.dtype).clone()
            else:
                value[k] = own[t][k].to(value.dtype)
            arrays[t] = value
        return arrays
