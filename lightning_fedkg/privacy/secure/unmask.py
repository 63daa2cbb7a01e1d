"""Secure aggregation's last steps: under ``active`` the survivors sign one survivor
list (``sa_check``); then each reveals the shares that remove the survivors' self-masks and
the dropped clients' pairwise masks, and the server sums (``sa_unmask``)."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.federated.message import Message
from lightning_fedkg.federated.strategy import RetryRound
from lightning_fedkg.privacy.mechanisms import secagg
from lightning_fedkg.privacy.secure.protocol import (
    SA_CHECK,
    SA_UNMASK,
    _ClientRound,
    _bytes,
    _check_statement,
    _pair_info,
    _sign,
    _tensor,
    _words,
)


class ServerUnmask:
    """The server's ``sa_check`` and ``sa_unmask``: collect the signatures, rebuild the secrets, sum."""

    def configure_sa_check(self, round, selected):
        st = self._round
        survivors = sorted(st.uploads)
        config = {"sa": {**self._sa_head(), "survivors": survivors}}
        return {name: Message(config=config) for name in survivors}

    def aggregate_sa_check(self, round, replies, failures) -> None:
        st = self._round
        self._enough(replies, SA_CHECK)
        st.checks = {n: _bytes(replies[n].arrays["sig"]) for n in sorted(replies)}

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


class ClientUnmask:
    """A client's ``sa_check`` and ``sa_unmask``: sign the survivors once, reveal shares once."""

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
