"""Secure aggregation's first two steps: each client advertises two fresh key pairs
(``sa_keys``; signed under ``active``), then secret-shares its mask seed and mask key among
the parties, each share encrypted to its receiver (``sa_shares``)."""

from __future__ import annotations

from torch import Tensor

from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import RetryRound
from lightning_fedkg.privacy.mechanisms import secagg
from lightning_fedkg.privacy.secure.protocol import (
    SA_KEYS,
    SA_SHARES,
    _ClientRound,
    _ServerRound,
    _bytes,
    _key_set,
    _keys_statement,
    new_attempt,
    _tensor,
)


class ServerKeys:
    """The server's ``sa_keys`` and ``sa_shares``: relay the advertised keys, then the encrypted shares."""

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


class ClientKeys:
    """A client's ``sa_keys`` and ``sa_shares``: fresh keys for each attempt, shares for the peers."""

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
