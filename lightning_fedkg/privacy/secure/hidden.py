"""Secure aggregation's ``hide_aggregate`` mode: the server keeps each row's sum with the
holders' offsets in it and sends it on as it is; only the clients, who derive the offsets
from the federation key, read the rows back."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_fedkg.privacy.mechanisms import secagg
from lightning_fedkg.privacy.secure.protocol import PREFIX, _bytes, _offset, _tensor


class ServerHidden:
    """The server's hidden sums: stored per row with their holders and serial, sent as they are."""

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


class ClientHidden:
    """A client's reading of hidden sums, and its own values for the rows it kept."""

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
