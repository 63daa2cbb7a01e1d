"""The cryptography of private retrieval (``task.retrieval: private``).

Query states travel between clients sealed with ChaCha20-Poly1305 under a key per query
(HKDF-SHA256 of the federation key, the structure and the query's index), a fresh random
96-bit nonce per state and the query's place (structure, index, node) as associated data:
the server routes ciphertext it can neither read nor move to another query unnoticed.
Score tables are fixed point (:data:`SCORE_BITS` fractional bits) in ℤ_{2^64}, laid out over
the union of entities, with one more row, the client's holder indicator, plus a one-time
pad from a fresh random seed that the client seals for the querier under a key derived from
the federation key; the server adds the tables mod 2^64 and only the querier can take the
pads off. See docs/methods/fedcqa.md.
"""

from __future__ import annotations

import os
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from lightning_fedkg.privacy.mechanisms.secagg import decrypt, derive_key, encrypt

__all__ = ["SCORE_BITS", "SEALED_SEED_BYTES", "RetrievalRefused", "seal_states", "open_states", "mask_scores",
           "add_words", "unmask_mean"]

#: Fractional bits of a score in the padded tables: a float32 score of magnitude at least
#: 2^-9 is exact, a smaller one within 2^-(SCORE_BITS+1).
SCORE_BITS = 32
#: A score's magnitude must stay below this, so a sum over up to 128 clients fits 64 bits.
SCORE_LIMIT = float(1 << 24)
_NONCE, _TAG, _SEED = 12, 16, 16
#: Bytes of a sealed pad seed: nonce, seed, tag.
SEALED_SEED_BYTES = _NONCE + _SEED + _TAG


class RetrievalRefused(RuntimeError):
    """A client refused a private retrieval step: what it was asked would reveal more than
    the protocol allows, or what it was sent is not what the protocol sends."""


@lru_cache(maxsize=1 << 16)
def _query_key(federation_key: bytes, structure: str, index: int) -> bytes:
    return derive_key(federation_key, f"fedkg-cq-state|{structure}|{index}")


def _aead(key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    return ChaCha20Poly1305(key)


def seal_states(federation_key: bytes, structure: str, indices: Tensor, node: int, states: Tensor) -> Tensor:
    """``uint8 [r, 12 + 4·size + 16]``: each row of ``states`` (float32 ``[r, ...]``) sealed
    for the query ``indices[j]`` of ``structure`` at ``node`` (nonce | ciphertext | tag)."""
    data = states.detach().to("cpu", torch.float32).contiguous().numpy()
    out = np.empty((data.shape[0], _NONCE + data[0].nbytes + _TAG if len(data) else 0), dtype=np.uint8)
    for j, index in enumerate(indices.tolist()):
        nonce = os.urandom(_NONCE)
        sealed = _aead(_query_key(federation_key, structure, index)).encrypt(
            nonce, data[j].tobytes(), f"{structure}|{index}|{node}".encode())
        out[j] = np.frombuffer(nonce + sealed, dtype=np.uint8)
    return torch.from_numpy(out)


def open_states(federation_key: bytes, structure: str, indices: Tensor, node: int, sealed: Tensor,
                dim: int) -> Tensor:
    """Inverse of :func:`seal_states`: float32 ``[r, -1, dim]``; raises
    ``cryptography.exceptions.InvalidTag`` if a row was changed or belongs elsewhere."""
    data = sealed.numpy()
    rows = []
    for j, index in enumerate(indices.tolist()):
        row = data[j].tobytes()
        plain = _aead(_query_key(federation_key, structure, index)).decrypt(
            row[:_NONCE], row[_NONCE:], f"{structure}|{index}|{node}".encode())
        rows.append(np.frombuffer(plain, dtype=np.float32))
    if not rows:
        return torch.zeros(0, 1, dim)
    return torch.from_numpy(np.stack(rows)).reshape(len(rows), -1, dim)


def _pad(seed: bytes, shape: tuple[int, int]) -> np.ndarray:
    """ChaCha20's keystream under ``HKDF(seed)`` as ``uint64`` words of ``shape``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    count = shape[0] * shape[1]
    stream = Cipher(algorithms.ChaCha20(derive_key(seed, "fedkg-cq-pad"), b"\0" * 16), mode=None).encryptor()
    return np.frombuffer(stream.update(bytes(8 * count)), dtype="<u8").reshape(shape)


def _seed_key(federation_key: bytes) -> bytes:
    return derive_key(federation_key, "fedkg-cq-pad-seed")


def mask_scores(federation_key: bytes, scores: Tensor, columns: Tensor, width: int,
                context: str) -> tuple[Tensor, Tensor]:
    """A client's padded table and its sealed pad seed: ``(int64 [b + 1, width], uint8
    [SEALED_SEED_BYTES])``. Rows ``0..b-1``: ``scores [b, n_c]`` at the union's ``columns``,
    fixed point; row ``b``: the client's holder indicator (the integer 1 on its columns), so
    that the querier counts each entity's holders from the tables, not from the server. A
    fresh seed's pad covers every word, so the table is uniform to whoever lacks it.
    ``context`` (the batch and the client) is bound to the sealed seed."""
    x = scores.detach().to("cpu", torch.float64)
    if not bool(torch.isfinite(x).all()) or (x.numel() and float(x.abs().max()) >= SCORE_LIMIT):
        raise ValueError(f"private retrieval: a score is not finite or not below {SCORE_LIMIT:g} in magnitude")
    table = np.zeros((x.shape[0] + 1, width), dtype=np.int64)
    table[:-1, columns.numpy()] = torch.round(x * float(1 << SCORE_BITS)).to(torch.int64).numpy()
    table[-1, columns.numpy()] = 1
    seed = os.urandom(_SEED)
    words = table.view(np.uint64) + _pad(seed, table.shape)  # wraps mod 2^64
    sealed = encrypt(_seed_key(federation_key), seed, context)
    return torch.from_numpy(words.view(np.int64)), torch.frombuffer(bytearray(sealed), dtype=torch.uint8)


def add_words(tables: list[Tensor]) -> Tensor:
    """The sum mod 2^64 of int64 tables of words (the server's only operation on them)."""
    total = np.zeros(tables[0].shape, dtype=np.uint64)
    for t in tables:
        total += t.numpy().view(np.uint64)
    return torch.from_numpy(total.view(np.int64))


def unmask_mean(federation_key: bytes, total: Tensor, seeds: list[tuple[Tensor, str]], members: int) -> Tensor:
    """The querier's holder-mean ``float64 [b, width]`` from the server's ``total`` (``int64
    [b + 1, width]``): each ``(sealed seed, context)`` opened and its pad taken off, the
    last row read as each entity's number of holders, the fixed point read back and divided
    by it; an entity no contributor holds scores ``-inf``.

    Raises :class:`RetrievalRefused` when a holder count is outside ``[0, members]``: the
    total is then not the sum of exactly the tables these seeds padded (a pad left in, or
    one taken off that was never added, leaves that row uniform in ℤ_{2^64}, where a count
    passes with probability (members + 1) / 2^64 per entity)."""
    if total.dim() != 2 or total.shape[0] < 1:
        raise RetrievalRefused(f"private retrieval: a total of shape {tuple(total.shape)} has no holder-count row")
    words = total.numpy().view(np.uint64).copy()
    for sealed, context in seeds:
        seed = decrypt(_seed_key(federation_key), bytes(sealed.numpy().tobytes()), context)
        words -= _pad(seed, words.shape)
    plain = torch.from_numpy(words.view(np.int64).copy())
    counts = plain[-1]
    if len(counts) and not bool(((counts >= 0) & (counts <= members)).all()):
        bad = int(((counts < 0) | (counts > members)).sum())
        raise RetrievalRefused(f"private retrieval: {bad} of {len(counts)} holder counts are outside [0, {members}] "
                               f"(the total is not the sum of every contributor's padded table for this context)")
    sums = plain[:-1].to(torch.float64) / float(1 << SCORE_BITS)
    held = counts > 0
    return torch.where(held[None, :], sums / counts.clamp(min=1).to(torch.float64)[None, :],
                       torch.tensor(float("-inf"), dtype=torch.float64))
