"""One seeding scheme for every party and purpose, and order-free per-row random draws.

:func:`derive_seed` gives each ``(party, purpose)`` its own seed from the experiment seed,
so a party's initial weights or sampler do not depend on how many parties were built
before it, and no two purposes share a stream. :func:`keyed_uniform` draws per-row uniform
numbers from a 64-bit key per row (a counter-based generator, SplitMix64 by Steele, Lea and
Flood, OOPSLA 2014): the value of row ``i`` depends only on its key, never on the row's
position, which is what makes hash-aligned federations independent of the global id order.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch
from torch import Tensor

__all__ = ["derive_seed", "keyed_uniform", "key_from_digest", "purpose_key"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def derive_seed(base: int, party: str, purpose: str) -> int:
    """A seed in ``[0, 2**31 - 1)`` for ``purpose`` (``"model"``, ``"data"``, ``"selection"``) at ``party``."""
    return (int(base) * 1_000_003 + zlib.crc32(f"{purpose}:{party}".encode())) % (2**31 - 1)


def purpose_key(base: int, purpose: str) -> int:
    """A 64-bit key mixing the experiment seed and a purpose string (e.g. a tensor name)."""
    return (int(base) * 0x100000001B3 + zlib.crc32(purpose.encode()) * 0x1000193) % 2**64


def key_from_digest(digests: Tensor) -> Tensor:
    """``int64 [n]`` keys from ``uint8 [n, >=8]`` digests (their first 8 bytes, little-endian)."""
    d = digests[:, :8].to(torch.int64)
    shifts = torch.arange(8, dtype=torch.int64) * 8
    return (d << shifts).sum(dim=1)  # wraps to a signed int64; only the bits matter


def _splitmix64(x: np.ndarray) -> np.ndarray:
    # numpy uint64 array arithmetic wraps modulo 2**64, which the mixer relies on.
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def keyed_uniform(row_keys: Tensor, width: int, salt: int = 0) -> Tensor:
    """``float64 [n, width]`` uniform numbers in ``[0, 1)``; row ``i`` depends only on
    ``row_keys[i]``, ``salt`` and the column, so permuting the keys permutes the rows."""
    keys = row_keys.cpu().numpy().astype(np.int64).view(np.uint64) ^ np.uint64(int(salt) % 2**64)
    cols = np.arange(1, width + 1, dtype=np.uint64) * _GOLDEN
    with np.errstate(over="ignore"):
        mixed = _splitmix64(_splitmix64(keys[:, None]) + cols[None, :])
    return torch.from_numpy((mixed >> np.uint64(11)).astype(np.float64) * 2.0**-53)
