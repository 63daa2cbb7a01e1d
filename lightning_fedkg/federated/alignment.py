"""Alignment as a protocol step: parties find shared entities/relations from keyed hashes.

Each client sends ``HMAC-SHA256(federation key, name)`` of its items in local id order; the
server sorts the union of the digests (fixing the global ids) and reads each client's
local→global map and every row's holder count off them (:func:`union_alignment`).
:func:`pairwise_alignment` is the two-peer variant (FKGE). The key never reaches the
server; what the digests still reveal is listed in docs/privacy.md.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["DIGEST_BYTES", "federation_secret", "federation_key", "hash_names", "Alignment", "union_alignment", "pairwise_alignment"]

DIGEST_BYTES = 32


def federation_secret(secret: str, seed: int) -> str:
    """``secret`` when set, else one derived from the experiment seed (fine for simulation,
    where every party is in one process; set a real secret otherwise)."""
    return secret if secret else f"lightning_fedkg-federation-{int(seed)}"


def federation_key(secret: str, seed: int) -> bytes:
    """The clients' HMAC key, from :func:`federation_secret`."""
    return hashlib.sha256(federation_secret(secret, seed).encode()).digest()


def hash_names(names: Sequence[str], key: bytes) -> Tensor:
    """``uint8 [n, 32]``: ``HMAC-SHA256(key, name)`` of every name, in order."""
    out = bytearray()
    for name in names:
        out += hmac.new(key, name.encode("utf-8"), hashlib.sha256).digest()
    return torch.frombuffer(out, dtype=torch.uint8).reshape(len(names), DIGEST_BYTES).clone() if names else \
        torch.zeros(0, DIGEST_BYTES, dtype=torch.uint8)


@dataclass
class Alignment:
    """The server's view after alignment of one kind of item (entities or relations).

    Attributes:
        digests: ``uint8 [N, 32]`` sorted union; row ``i`` is global item ``i``.
        index: ``{party: LongTensor[n_c]}`` local id → global id.
        holders: ``LongTensor[N]``, how many parties hold each item.
    """

    digests: Tensor
    index: dict[str, Tensor]
    holders: Tensor

    @property
    def size(self) -> int:
        return int(self.digests.shape[0])


def union_alignment(digests: Mapping[str, Tensor]) -> Alignment:
    """Union and per-party index maps from each party's digests (local order)."""
    names = list(digests)
    for name in names:
        d = digests[name]
        if d.dim() != 2 or d.shape[1] != DIGEST_BYTES or d.dtype != torch.uint8:
            raise ValueError(f"{name}: digests must be uint8 [n, {DIGEST_BYTES}], got {d.dtype} {tuple(d.shape)}")
    allrows = torch.cat([digests[n] for n in names]) if names else torch.zeros(0, DIGEST_BYTES, dtype=torch.uint8)
    union, inverse = torch.unique(allrows, dim=0, return_inverse=True)
    index, start = {}, 0
    for name in names:
        n = digests[name].shape[0]
        index[name] = inverse[start : start + n].long()
        if index[name].unique().numel() != n:
            raise ValueError(f"{name} sent the same digest twice (duplicate names)")
        start += n
    holders = torch.zeros(union.shape[0], dtype=torch.long)
    holders.index_add_(0, inverse.long(), torch.ones_like(inverse, dtype=torch.long))
    return Alignment(union, index, holders)


def pairwise_alignment(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Positions ``(i_a, i_b)`` of the items two peers share, ordered by digest."""
    al = union_alignment({"a": a, "b": b})
    pos_a = torch.full((al.size,), -1, dtype=torch.long)
    pos_b = torch.full((al.size,), -1, dtype=torch.long)
    pos_a[al.index["a"]] = torch.arange(a.shape[0])
    pos_b[al.index["b"]] = torch.arange(b.shape[0])
    both = (pos_a >= 0) & (pos_b >= 0)
    return pos_a[both], pos_b[both]
