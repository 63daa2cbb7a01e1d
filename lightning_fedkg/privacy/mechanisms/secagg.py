"""Cryptographic pieces of secure aggregation (Bonawitz et al., CCS 2017), from maintained libraries.

X25519 key agreement, HKDF-SHA256 key derivation, ChaCha20 keystream masks (never
``torch.Generator`` or ``numpy.random``), Shamir t-of-n sharing (pycryptodome, 16-byte
pieces), ChaCha20-Poly1305 share encryption and Ed25519 signatures (``active``). Uploads
are fixed point in ℤ_{2^32} (:func:`quantise`, :func:`signed`), so masks cancel exactly and
the only error is rounding, at most ``2^-(bits+1)``. The two packages form the ``[secure]``
extra; :func:`require` names it when one is missing. See docs/privacy.md.
"""

from __future__ import annotations

import os

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "MODULUS",
    "require",
    "new_keypair",
    "agree",
    "derive_key",
    "keystream_words",
    "encrypt",
    "decrypt",
    "split_secret",
    "combine_secret",
    "new_seed",
    "quantise",
    "signed",
    "to_wire",
    "from_wire",
    "quantisation_error",
    "new_identity",
    "identity_public",
    "sign",
    "verify",
]

#: Uploads and masks live in ℤ_MODULUS.
MODULUS = 1 << 32
_WORD = MODULUS - 1
#: pycryptodome's Shamir shares secrets of exactly this many bytes.
CHUNK = 16


def require() -> None:
    """Raise ImportError naming the ``[secure]`` extra unless its packages import."""
    try:
        import cryptography  # noqa: F401
        import Crypto.Protocol.SecretSharing  # noqa: F401
    except ImportError as err:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "federated.secure_aggregation needs the 'secure' extra (cryptography, pycryptodome): "
            "pip install 'lightning-fedkg[secure]'"
        ) from err


def new_keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 ``(private, public)`` pair, 32 raw bytes each, from the OS's randomness."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    key = X25519PrivateKey.generate()
    return key.private_bytes_raw(), key.public_key().public_bytes_raw()


def agree(private: bytes, public: bytes) -> bytes:
    """The X25519 shared secret of ``private`` with a peer's ``public`` (symmetric)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    return X25519PrivateKey.from_private_bytes(bytes(private)).exchange(X25519PublicKey.from_public_bytes(bytes(public)))


def derive_key(secret: bytes, info: str) -> bytes:
    """HKDF-SHA256 of ``secret`` for the purpose ``info``: 32 bytes."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info.encode("utf-8")).derive(bytes(secret))


def keystream_words(key: bytes, count: int) -> Tensor:
    """``count`` 32-bit words of ChaCha20's keystream under ``key`` (a fresh key per use, so
    the nonce is fixed at zero), as ``int64`` values in ``[0, 2^32)``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

    if count == 0:
        return torch.zeros(0, dtype=torch.int64)
    encryptor = Cipher(algorithms.ChaCha20(bytes(key), b"\0" * 16), mode=None).encryptor()
    stream = encryptor.update(bytes(4 * count))
    return torch.from_numpy(np.frombuffer(stream, dtype="<u4").astype(np.int64))


def encrypt(key: bytes, plaintext: bytes, associated: str) -> bytes:
    """ChaCha20-Poly1305 under ``key``: a random 12-byte nonce followed by the ciphertext."""
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    nonce = os.urandom(12)
    return nonce + ChaCha20Poly1305(bytes(key)).encrypt(nonce, bytes(plaintext), associated.encode("utf-8"))


def decrypt(key: bytes, data: bytes, associated: str) -> bytes:
    """Inverse of :func:`encrypt`; raises ``cryptography.exceptions.InvalidTag`` on any change."""
    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    data = bytes(data)
    return ChaCha20Poly1305(bytes(key)).decrypt(data[:12], data[12:], associated.encode("utf-8"))


def new_seed() -> bytes:
    """A 16-byte secret from the OS (a client's self-mask seed)."""
    return os.urandom(CHUNK)


def split_secret(secret: bytes, threshold: int, parties: int) -> list[bytes]:
    """Shamir ``threshold``-of-``parties`` shares of ``secret`` (a multiple of 16 bytes).

    Share ``i`` (0-based) belongs to the party with Shamir index ``i + 1`` and is the
    concatenation of its shares of each 16-byte chunk.
    """
    from Crypto.Protocol.SecretSharing import Shamir

    secret = bytes(secret)
    if len(secret) % CHUNK or not secret:
        raise ValueError(f"a shared secret is a non-empty multiple of {CHUNK} bytes, got {len(secret)}")
    if not 1 <= threshold <= parties:
        raise ValueError(f"threshold {threshold} must be in [1, {parties}]")
    out = [b""] * parties
    for start in range(0, len(secret), CHUNK):
        chunk = secret[start:start + CHUNK]
        # pycryptodome refuses a 1-of-n split; a 1-of-n share is the secret itself.
        shares = Shamir.split(threshold, parties, chunk) if threshold > 1 else [(i + 1, chunk) for i in range(parties)]
        for index, share in shares:
            out[index - 1] += share
    return out


def combine_secret(shares: dict[int, bytes], threshold: int) -> bytes:
    """The secret from at least ``threshold`` shares ``{Shamir index (1-based): share}``."""
    from Crypto.Protocol.SecretSharing import Shamir

    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} shares cannot rebuild a {threshold}-of-n secret")
    chosen = sorted(shares.items())[:threshold]
    length = len(chosen[0][1])
    secret = b""
    for start in range(0, length, CHUNK):
        parts = [(i, bytes(s[start:start + CHUNK])) for i, s in chosen]
        secret += Shamir.combine(parts) if threshold > 1 else parts[0][1]
    return secret


def quantise(x: Tensor, bits: int, bound: int) -> Tensor:
    """``round(x · 2^bits)`` as ``int64``; raises when a value's magnitude reaches ``bound``
    (a sum of that many values would leave the signed 32-bit range)."""
    q = torch.round(x.detach().to(torch.float64) * float(1 << bits))
    if not bool(torch.isfinite(q).all()):
        raise ValueError("secure aggregation: an upload holds a non-finite value")
    limit = float(bound)
    if q.numel() and float(q.abs().max()) >= limit:
        raise ValueError(
            f"secure aggregation: an upload value {float(x.abs().max()):.4g} does not fit the fixed-point "
            f"range ±{limit / (1 << bits):.4g} (2^31 / holders at {bits} fractional bits); lower "
            "federated.secure_aggregation.fractional_bits"
        )
    return q.to(torch.int64)


def signed(words: Tensor) -> Tensor:
    """Words of ℤ_{2^32} (any int64 values, reduced here) read as signed 32-bit integers."""
    w = torch.remainder(words, MODULUS)
    return torch.where(w >= MODULUS // 2, w - MODULUS, w)


def to_wire(words: Tensor) -> Tensor:
    """``int32`` tensor carrying the words of ℤ_{2^32} (4 bytes each, as a float32 upload)."""
    return signed(words).to(torch.int32)


def from_wire(data: Tensor) -> Tensor:
    """Inverse of :func:`to_wire`: ``int64`` words in ``[0, 2^32)``."""
    return torch.remainder(data.to(torch.int64), MODULUS)


def quantisation_error(bits: int) -> float:
    """The largest error of a securely aggregated mean per coordinate: ``2^-(bits+1)``."""
    return 2.0 ** -(bits + 1)


# ---------------------------------------------------------------- identity (active mode)
def new_identity() -> tuple[bytes, bytes]:
    """A fresh Ed25519 ``(private, public)`` identity pair, 32 raw bytes each, from the OS's
    randomness. Each client gets its own at provisioning
    (:mod:`lightning_fedkg.privacy.identities`): nothing it is derived from is shared, so
    only its holder can sign for it."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    return key.private_bytes_raw(), key.public_key().public_bytes_raw()


def identity_public(private: bytes) -> bytes:
    """The Ed25519 public key (32 raw bytes) of the identity ``private`` key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(bytes(private)).public_key().public_bytes_raw()


def sign(private: bytes, message: bytes) -> bytes:
    """The Ed25519 signature (64 bytes) of ``message`` under ``private``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(bytes(private)).sign(bytes(message))


def verify(public: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is ``public``'s Ed25519 signature of ``message``."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        Ed25519PublicKey.from_public_bytes(bytes(public)).verify(bytes(signature), bytes(message))
    except (InvalidSignature, ValueError):
        return False
    return True
