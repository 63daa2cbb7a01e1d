"""The federation key against the review's finding on weak secrets: the key was SHA-256 of
the secret, and the server holds ``HMAC(key, name)`` of public entity names (alignment), so
it can test a guess of the secret in microseconds; the key also opens FedCQA's sealed states
and secure aggregation's hidden-aggregate offsets. A user's secret is now stretched with
scrypt; the seed-derived default (public, for simulation) keeps its SHA-256 key so that
existing runs stay bit-identical. Each test says what it measured on the old code."""

from __future__ import annotations

import hashlib
import hmac
import time

import pytest

from lightning_fedkg.federated import alignment
from lightning_fedkg.federated.alignment import federation_key, federation_secret, hash_names

#: A secret of the kind a federation picks, and the reviewer's kind of word list.
SECRET = "umls-federation-2026"
WORDS = ["umls-federation-2023", "umls-federation-2024", "federation-2026", "umls-2026", SECRET]
#: A public UMLS entity name (any client that holds it sends its keyed hash in alignment).
PUBLIC_NAME = "amino_acid_sequence"


def test_a_dictionary_attack_on_the_alignment_hashes_costs_ms_per_guess():
    """The server's attack: it knows a public name and the digest a client sent for it, and
    tries each word of a list as the secret. On the old code (SHA-256) the five guesses took
    about 25 µs in all (5 µs a guess); scrypt makes each guess cost tens of ms (87 ms on the
    2-core machine the parameters were chosen on), asserted here as at least 10 ms. The
    attack still finds a dictionary secret: stretching makes it slower, not impossible."""
    observed = bytes(hash_names([PUBLIC_NAME], federation_key(SECRET, 0))[0].tolist())
    alignment._stretch.cache_clear()  # the attacker has no cache of the clients' derivations
    start = time.perf_counter()
    found = [w for w in WORDS
             if hmac.new(federation_key(w, 0), PUBLIC_NAME.encode(), hashlib.sha256).digest() == observed]
    per_guess = (time.perf_counter() - start) / len(WORDS)
    assert found == [SECRET]
    assert per_guess >= 0.010, f"{per_guess * 1e6:.1f} µs per guess"


def test_the_seed_derived_default_keeps_its_sha256_key():
    """``federation_secret("", seed)`` is public (it follows from the seed) and used in
    simulation: its key stays SHA-256 of the string, byte for byte, whether the default
    comes from an empty setting or from the key file a Flower simulation writes (its
    clients call ``federation_key(secret_from_file, 0)``). Holds on the old code too."""
    for seed in (0, 7, 12345, -3):
        default = f"lightning_fedkg-federation-{seed}"
        assert federation_secret("", seed) == default
        expected = hashlib.sha256(default.encode()).digest()
        assert federation_key("", seed) == expected
        assert federation_key(default, 0) == expected  # the Flower client's call, from its key file


def test_a_user_secret_is_stretched_with_scrypt_the_same_way_every_time():
    """Same secret, same key (twice, across a cleared cache, whatever the seed), equal to
    scrypt with the documented parameters and salt, and not SHA-256 of the secret (the old
    key). Strings that only look like the default are secrets like any other."""
    from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

    key = federation_key(SECRET, 0)
    alignment._stretch.cache_clear()
    assert federation_key(SECRET, 5) == key and len(key) == 32
    expected = Scrypt(salt=alignment.SCRYPT_SALT, length=32, n=alignment.SCRYPT_N, r=alignment.SCRYPT_R,
                      p=alignment.SCRYPT_P).derive(SECRET.encode("utf-8"))
    assert key == expected
    assert key != hashlib.sha256(SECRET.encode()).digest()
    assert federation_key("another secret", 0) != key
    for lookalike in ("lightning_fedkg-federation-07", "lightning_fedkg-federation-7 ", "lightning_fedkg-federation-",
                      "xlightning_fedkg-federation-7", "lightning_fedkg-federation-7\n"):
        assert federation_key(lookalike, 0) != hashlib.sha256(lookalike.encode()).digest(), lookalike
