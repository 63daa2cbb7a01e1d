"""Secure aggregation for every holder-mean strategy (``federated.secure_aggregation``).

After Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine
Learning" (CCS 2017), for an honest-but-curious server. A training round (or the
``upload`` stage of a phase) becomes four exchanges of the core's stage API::

    sa_keys     each selected client makes two fresh X25519 key pairs and sends the
                public halves (U1: those that answered)
    sa_shares   the server forwards U1's public keys; each client splits its self-mask
                seed b and its mask private key s t-of-|U1| (Shamir) and encrypts one share
                to each peer (ChaCha20-Poly1305 under an X25519 key); U2: those that answered
    train       the download as the method sends it, plus the peers' ciphertexts and mask
                keys; each client trains, quantises its upload to fixed point and adds, in
                ℤ_{2^32}, a self mask PRG(b) and one pairwise mask ±PRG(s_u·s_v) per peer
                of U2 (U3: those that uploaded)
    sa_unmask   the survivors U3 send their shares of b for every survivor and of s for
                every client of U2 that dropped (never both for one client); from t of them
                the server removes the self masks and the dropped clients' pairwise masks;
                the survivors' pairwise masks cancel in the sum

If fewer than t answer any exchange the round is retried (:class:`~.strategy.RetryRound`,
then ``federated.max_retries``). Fresh keys every attempt, from the OS.

What the server learns, per mode (README, "Privacy"):

* ``shared_rows`` (default): the per-row sum over the surviving holders and their number,
  hence the holder-mean it needs, and nothing about one upload beyond it; a row held by
  one survivor only *is* its value (that is its holder-mean). Each client learns which of
  its rows each peer holds (the positions of the rows it masks with that peer).
* ``dense``: as above, without learning which rows a client uploaded (each upload spans
  the union, with a masked holder indicator); clients learn the union's size and their
  rows' positions in it, not their peers' rows. Bytes: ``N / n_c`` times FedE's.
* ``hide_aggregate``: every client also adds one offset per round, derived from the
  federation key the server does not hold; the server stores and forwards the offset sums
  and the clients remove the offset. The server learns neither the uploads nor the
  aggregate (it still knows the holder sets from alignment, the sizes and the timing).

Collusion: the server with a client knows that client's pair keys and, under
``hide_aggregate``, the federation key: it then learns the aggregate, and on a row that
only the two of them hold, the other holder's value. Fewer than t colluding clients learn
nothing from the shares; t of them with the server can rebuild any peer's masks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.aggregation import holder_counts
from lightning_fedkg.federated.holder_mean import ONE_ROW, HolderMeanServer
from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import RetryRound, num_selected
from lightning_fedkg.privacy import secagg

__all__ = ["SecureServer", "SecureClient", "check_secure_config", "default_threshold"]

SA_KEYS, SA_SHARES, SA_UNMASK = "sa_keys", "sa_shares", "sa_unmask"
#: The stages whose replies are masked (a training round's and a phase's upload).
MASKED = ("train", "upload")
SA_STAGES = (SA_KEYS, SA_SHARES, SA_UNMASK)
#: Secure-aggregation arrays in a download are named ``sa.<what>...``; hidden rows ``<tensor>@<what>``.
PREFIX = "sa."


def default_threshold(parties: int) -> int:
    """t of t-of-n when ``threshold`` is unset: a strict majority, ``⌊n/2⌋ + 1``."""
    return parties // 2 + 1


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


def _offset(key: bytes, serial: int, tensor: str, rows: int, width: int) -> Tensor:
    """The hidden-aggregate offset of aggregation ``serial`` for the first ``rows`` rows."""
    return _words(secagg.derive_key(key, f"fedkg-sa-offset|{serial}|{tensor}"), (rows, width))


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
    t = sc.threshold if sc.threshold is not None else default_threshold(n)
    if n >= 2 and not 2 <= t <= n:
        raise ConfigError(f"federated.secure_aggregation.threshold={t} must be in [2, {n}] (the clients selected "
                          "per round); below 2 a single client could rebuild a peer's masks")
    if sc.hide_aggregate and not cfg.federated.federation_key:
        raise ConfigError("federated.secure_aggregation.hide_aggregate needs federated.federation_key: the offset "
                          "comes from it, and the default key derives from the seed, which the server knows")
    if sc.hide_aggregate and cfg.federated.aggregation == "all_holders":
        raise ConfigError("federated.secure_aggregation.hide_aggregate needs federated.aggregation="
                          "selected_holders: the damped mean needs the server's current rows, which it cannot see")
    return min(t, n)


# ====================================================================== server
@dataclass
class _ServerRound:
    round: int
    threshold: int
    parties: list[str] = field(default_factory=list)            # U1, in Shamir order
    c_pk: dict[str, bytes] = field(default_factory=dict)
    s_pk: dict[str, bytes] = field(default_factory=dict)
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
        #: hide_aggregate: ``{tensor: {"sum", "count", "serial"}}`` of the rows aggregated so far.
        self.hidden: dict[str, dict[str, Tensor]] = {}
        self.serial = 0

    # ---------------------------------------------------------------- schedule
    def protocol(self, stage: str) -> tuple[str, ...]:
        if stage in MASKED:
            return (SA_KEYS, SA_SHARES, stage, SA_UNMASK)
        return super().protocol(stage)

    @property
    def stages(self) -> tuple[str, ...]:
        return self.protocol("train")

    # ---------------------------------------------------------------- keys
    def configure_sa_keys(self, round, selected):
        t = min(self.threshold, len(selected))
        self._round = _ServerRound(round=round, threshold=t)
        return {name: Message(config={"sa": {"round": int(round), "threshold": t}}) for name in selected}

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

    # ---------------------------------------------------------------- shares
    def configure_sa_shares(self, round, selected):
        st = self._round
        keys = {f"c_pk.{n}": _tensor(st.c_pk[n]) for n in st.parties}
        config = {"sa": {"round": int(round), "threshold": st.threshold, "parties": st.parties}}
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
            config["sa"] = {"round": int(st.round), "threshold": st.threshold, "parties": st.parties,
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

    # ---------------------------------------------------------------- unmask
    def configure_sa_unmask(self, round, selected):
        st = self._round
        survivors = sorted(st.uploads)
        dropped = [n for n in st.shared if n not in st.uploads]
        config = {"sa": {"round": int(round), "survivors": survivors, "dropped": dropped}}
        return {name: Message(config=config) for name in survivors}

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
            if self.sa.mode == "dense":
                counts = secagg.signed(total[:, -1])
                total = total[:, :-1]
            else:
                counts = holder_counts(rows, [self._index(t, u) for u in holders])
            table = self.table[t]
            shape = (1, *table.shape) if t in self._whole() else tuple(table.shape)
            if self.sa.hide_aggregate:
                self._store_hidden(t, total, counts, st.serial)
            else:
                sums = secagg.signed(total).to(torch.float64) / float(1 << bits)
                self.apply_sums(t, sums.view(shape), counts)
        self._round = None

    def _whole(self) -> set[str]:
        return {t for t in self.table if self.alignments[self.group_of[t]] is None}

    def _store_hidden(self, tensor: str, total: Tensor, counts: Tensor, serial: int) -> None:
        rows = total.shape[0]
        h = self.hidden.setdefault(tensor, {
            "sum": torch.zeros(rows, total.shape[1], dtype=torch.int64),
            "count": torch.zeros(rows, dtype=torch.int64),
            "serial": torch.zeros(rows, dtype=torch.int64),
        })
        held = counts > 0
        h["sum"][held] = total[held]
        h["count"][held] = counts[held]
        h["serial"][held] = serial

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
        return out

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        state = super().state_dict()
        state["secure"] = {"serial": self.serial,
                           "hidden": {t: {k: v.clone() for k, v in h.items()} for t, h in self.hidden.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        secure = state.get("secure") or {}
        self.serial = int(secure.get("serial", 0))
        self.hidden = {t: {k: v.clone() for k, v in h.items()} for t, h in secure.get("hidden", {}).items()}


# ====================================================================== client
@dataclass
class _ClientRound:
    round: int
    threshold: int
    c_sk: bytes
    c_pk: bytes
    s_sk: bytes
    s_pk: bytes
    seed: bytes
    parties: list[str] = field(default_factory=list)
    own: tuple[bytes, bytes] | None = None                      # my shares of my own secrets
    c_pk_of: dict[str, bytes] = field(default_factory=dict)       # the peers' share-encryption keys
    received: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # peer -> (b share, s share)


class SecureClient:
    """Mixin before a :class:`~.strategy.ClientHalf` (see the module doc)."""

    def __init__(self, party, strategy) -> None:
        super().__init__(party, strategy)
        self.sa = party.cfg.federated.secure_aggregation
        self._round: _ClientRound | None = None
        self._gidx: dict[str, Tensor] = {}

    # ---------------------------------------------------------------- state
    def state_dict(self) -> dict:
        # Between the key stage and the unmasking, the round's secrets: a client whose
        # process ends between two messages (a Flower ClientApp) needs them back, from its
        # own disk. A finished round has none (on_sa_unmask drops them), so the checkpoint
        # of a committed round holds no key material.
        state = super().state_dict()
        state["secure_client"] = {"round": None if self._round is None else asdict(self._round),
                                  "gidx": {k: v.clone() for k, v in self._gidx.items()}}
        return state

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        saved = state.get("secure_client") or {}
        self._round = None if saved.get("round") is None else _ClientRound(**saved["round"])
        self._gidx = {k: v.long() for k, v in saved.get("gidx", {}).items()}

    # ---------------------------------------------------------------- dispatch
    def handle(self, stage, message, round):
        if stage not in MASKED:
            return super().handle(stage, message, round)
        extra = {k: v for k, v in message.arrays.items() if k.startswith(PREFIX)}
        plain = Message(arrays={k: v for k, v in message.arrays.items() if not k.startswith(PREFIX)},
                        metrics=message.metrics, config={k: v for k, v in message.config.items() if k != "sa"})
        self._gidx.update({k[len(PREFIX) + 5:]: v.long() for k, v in extra.items() if k.startswith(f"{PREFIX}gidx.")})
        reply = super().handle(stage, plain, round) or Message()
        return Message(arrays=self._mask(stage, reply.arrays, extra, message.config["sa"]),
                       metrics=reply.metrics, config=reply.config)

    # ---------------------------------------------------------------- keys and shares
    def on_sa_keys(self, message: Message, round: int) -> Message:
        sa = message.config["sa"]
        c_sk, c_pk = secagg.new_keypair()
        s_sk, s_pk = secagg.new_keypair()
        self._round = _ClientRound(round=int(sa["round"]), threshold=int(sa["threshold"]), c_sk=c_sk, c_pk=c_pk,
                                   s_sk=s_sk, s_pk=s_pk, seed=secagg.new_seed())
        return Message(arrays={"c_pk": _tensor(c_pk), "s_pk": _tensor(s_pk)})

    def _share_key(self, peer: str, peer_public: bytes) -> bytes:
        st = self._round
        lo, hi = sorted((self.party.name, peer))
        return secagg.derive_key(secagg.agree(st.c_sk, peer_public), f"fedkg-sa-share|{st.round}|{lo}|{hi}")

    def on_sa_shares(self, message: Message, round: int) -> Message:
        st, sa, me = self._round, message.config["sa"], self.party.name
        parties = list(sa["parties"])
        if me not in parties or len(parties) < st.threshold:
            raise RuntimeError(f"secure aggregation: {me} is asked to share among {parties} (t={st.threshold})")
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
            st.received.pop(peer, None)
        st.c_pk_of = {p: _bytes(message.arrays[f"c_pk.{p}"]) for p in parties if p != me}
        return Message(arrays=out)

    # ---------------------------------------------------------------- masking
    def _mask(self, stage: str, arrays: dict[str, Tensor], extra: dict[str, Tensor], sa: dict) -> dict[str, Tensor]:
        st, me = self._round, self.party.name
        if st is None or me not in sa["shared"] or len(sa["shared"]) < st.threshold:
            raise RuntimeError(f"secure aggregation: {me} cannot mask among {sa['shared']}")
        for peer in sa["shared"]:
            if peer == me:
                continue
            data = secagg.decrypt(self._share_key(peer, st.c_pk_of[peer]), _bytes(extra[f"{PREFIX}ct.{peer}"]),
                                  f"{st.round}|{peer}->{me}")
            st.received[peer] = (data[:secagg.CHUNK], data[secagg.CHUNK:])
        bits, bound = self.sa.fractional_bits, secagg.MODULUS // 2 // max(len(sa["shared"]), 1)
        out = {}
        for t, x in arrays.items():
            q = secagg.quantise(x.reshape(1 if t in sa["whole"] else x.shape[0], -1), bits, bound)
            if self.sa.hide_aggregate:
                q = q + _offset(self._key, sa["serial"], t, int(self._gidx[t].max()) + 1, q.shape[1])[self._gidx[t]]
            if self.sa.mode == "dense":
                full = torch.zeros(sa["rows"][t], q.shape[1] + 1, dtype=torch.int64)
                full[self._gidx[t], :-1] = q
                full[self._gidx[t], -1] = 1  # the holder indicator, an integer, not fixed point
                q = full
            words = q + _words(secagg.derive_key(st.seed, f"fedkg-sa-self|{st.round}|{stage}|{t}"), q.shape)
            s_pk = {p: _bytes(extra[f"{PREFIX}s_pk.{p}"]) for p in sa["holders"][t] if p != me}
            for peer, public in s_pk.items():
                key = secagg.derive_key(secagg.agree(st.s_sk, public), _pair_info(st.round, stage, t, me, peer))
                if self.sa.mode == "dense":
                    words += _sign(me, peer) * _words(key, words.shape)
                elif f"{PREFIX}pos.{peer}.{t}" in extra:
                    pos = extra[f"{PREFIX}pos.{peer}.{t}"].long()
                    words[pos] += _sign(me, peer) * _words(key, (pos.numel(), words.shape[1]))
            out[t] = secagg.to_wire(words)
        return out

    # ---------------------------------------------------------------- unmask
    def on_sa_unmask(self, message: Message, round: int) -> Message:
        st, sa, me = self._round, message.config["sa"], self.party.name
        survivors, dropped = list(sa["survivors"]), list(sa["dropped"])
        if set(survivors) & set(dropped):
            raise RuntimeError(f"secure aggregation: {sorted(set(survivors) & set(dropped))} asked as survivors "
                               "and as dropped; refusing to reveal both secrets of one client")
        if me not in survivors or len(survivors) < st.threshold:
            raise RuntimeError(f"secure aggregation: {len(survivors)} survivors, below t={st.threshold}")
        shares = dict(st.received)
        shares[me] = st.own
        out = {}
        for name in survivors:
            if name in shares:
                out[f"b.{name}"] = _tensor(shares[name][0])
        for name in dropped:
            if name in shares and name != me:
                out[f"s.{name}"] = _tensor(shares[name][1])
        self._round = None
        return Message(arrays=out)

    # ---------------------------------------------------------------- hidden aggregate
    def receive(self, arrays) -> None:
        """Apply a download; with ``hide_aggregate`` first read the offset sums back into rows."""
        arrays = dict(arrays)
        for k in [k for k in arrays if k.startswith(f"{PREFIX}gidx.")]:
            self._gidx[k[len(PREFIX) + 5:]] = arrays.pop(k).long()
        for k in [k for k in arrays if k.startswith(PREFIX)]:
            arrays.pop(k)
        for t in [k for k in arrays if k.endswith("@sum")]:
            name = t[:-4]
            sums, counts, serials = secagg.from_wire(arrays.pop(t)), arrays.pop(f"{name}@count").long(), \
                arrays.pop(f"{name}@serial").long()
            # the initial rows come only while some row was never aggregated
            base = arrays[name] if name in arrays else self.upload()[name]
            flat = base.reshape(counts.numel(), -1)  # one row for a tensor shared whole
            gidx = self._gidx[name]
            value = flat.to(torch.float64).clone()
            for serial in torch.unique(serials[counts > 0]).tolist():
                rows = (serials == serial) & (counts > 0)
                offset = _offset(self._key, serial, name, int(gidx.max()) + 1, flat.shape[1])[gidx[rows]]
                plain = secagg.signed(sums[rows] - counts[rows, None] * offset)
                value[rows] = plain.to(torch.float64) / float(1 << self.sa.fractional_bits) / counts[rows, None]
            arrays[name] = value.to(base.dtype).view(base.shape)
        super().receive(arrays)
