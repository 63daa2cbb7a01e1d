"""Alignment as a protocol step: parties find shared entities/relations from keyed hashes.

Each client sends ``HMAC-SHA256(federation key, name)`` of its items in local id order; the
server sorts the union of the digests (fixing the global ids) and reads each client's
local→global map and every row's holder count off them (:func:`union_alignment`).
:func:`pairwise_alignment` is the two-peer variant (FKGE). The key never reaches the
server; what the digests still reveal is listed in docs/privacy.md. A user's secret is
stretched with scrypt (:func:`federation_key`), since the server can test guesses of it
against the digests of public names.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["DIGEST_BYTES", "SCRYPT_SALT", "SCRYPT_N", "SCRYPT_R", "SCRYPT_P", "federation_secret", "federation_key",
           "hash_names", "Alignment", "union_alignment", "pairwise_alignment"]

DIGEST_BYTES = 32

#: scrypt's fixed salt and cost for a user's federation secret: n = 2^15, r = 8, p = 1 takes
#: 32 MiB and about 90 ms a derivation on the 2-core machine the numbers were chosen on
#: (2^14: 34 ms, 2^16: 180 ms). The salt is public and the same for every federation: it
#: separates this use of the secret from any other, not one federation from another.
SCRYPT_SALT = b"lightning_fedkg federation key v1"
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2 ** 15, 8, 1

#: Exactly what :func:`federation_secret` makes of a seed.
_DEFAULT_SECRET = re.compile(r"lightning_fedkg-federation--?(0|[1-9][0-9]*)")


def federation_secret(secret: str, seed: int) -> str:
    """``secret`` when set, else one derived from the experiment seed (fine for simulation,
    where every party is in one process; set a real secret otherwise)."""
    return secret if secret else f"lightning_fedkg-federation-{int(seed)}"


def federation_key(secret: str, seed: int) -> bytes:
    """The clients' 32-byte HMAC key, from :func:`federation_secret`.

    A user's secret is stretched with scrypt (:data:`SCRYPT_N` and the rest; cached per
    process): the server holds ``HMAC(key, name)`` of public names, so it can test guesses of
    the secret offline, and each guess now costs a derivation. The seed-derived default
    keeps ``SHA-256(secret)``: it is public anyway, and every run made with it keeps its
    alignment order and numbers bit for bit. It is recognised by its exact form, not by an
    empty ``secret``, because a Flower simulation writes the default into the key file its
    clients read and call this with; they must get the in-process run's key."""
    text = federation_secret(secret, seed)
    if _DEFAULT_SECRET.fullmatch(text):
        return hashlib.sha256(text.encode()).digest()
    return _stretch(text)


@functools.lru_cache(maxsize=8)
def _stretch(secret: str) -> bytes:
    """scrypt of ``secret`` (UTF-8) with the fixed salt: every party derives the same key,
    each process once (a client calls :func:`federation_key` from several places)."""
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    kdf = Scrypt(salt=SCRYPT_SALT, length=DIGEST_BYTES, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    return kdf.derive(secret.encode("utf-8"))


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
