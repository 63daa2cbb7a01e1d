"""Secure aggregation's masked stage: the server sends each client whom it masks which
rows with (``train`` or ``upload``); the client uploads its rows in fixed point plus its
self-mask and the pairwise masks, which cancel in the sum."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.federated.holder_mean import ONE_ROW
from lightning_fedkg.federated.message import Message
from lightning_fedkg.privacy.mechanisms import secagg
from lightning_fedkg.privacy.secure.protocol import (
    MASKED,
    PREFIX,
    _bytes,
    _offset,
    _pair_info,
    _sign,
    _tensor,
    _words,
)


class ServerMasking:
    """The server's masked stage: the downloads that say who masks with whom, the masked uploads collected."""

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

    def _whole(self) -> set[str]:
        return {t for t in self.table if self.alignments[self.group_of[t]] is None}

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


class ClientMasking:
    """A client's masked stage: the method's own reply, masked (rows too few parties hold are kept)."""

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
