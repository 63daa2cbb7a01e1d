"""What both halves of secure aggregation share: the stage names, how masks and statements
are derived from keys, the t of t-of-n, the check of ``federated.secure_aggregation`` and the
provisioning of identities (the steps themselves: :mod:`.keys`, :mod:`.masking`,
:mod:`.unmask`, :mod:`.hidden`; the halves: :mod:`.server`, :mod:`.client`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.holder_mean import HolderMeanServer
from lightning_fedkg.federated.strategy import STRATEGIES, num_selected
from lightning_fedkg.privacy import identities
from lightning_fedkg.privacy.mechanisms import secagg

__all__ = ["SA_KEYS", "SA_SHARES", "SA_CHECK", "SA_UNMASK", "MASKED", "PREFIX", "check_secure_config",
           "default_threshold", "provision_identities", "new_attempt"]

SA_KEYS, SA_SHARES, SA_CHECK, SA_UNMASK = "sa_keys", "sa_shares", "sa_check", "sa_unmask"
#: The stages whose replies are masked (a training round's and a phase's upload).
MASKED = ("train", "upload")
SA_STAGES = (SA_KEYS, SA_SHARES, SA_CHECK, SA_UNMASK)
#: Secure-aggregation arrays in a download are named ``sa.<what>...``; hidden rows ``<tensor>@<what>``.
PREFIX = "sa."


def default_threshold(parties: int, active: bool = False) -> int:
    """t of t-of-n when ``threshold`` is unset: a strict majority, ``⌊n/2⌋ + 1``; with
    ``active``, ``⌊2n/3⌋ + 1``, so that the signed survivor list holds against a server
    colluding with fewer than n/3 clients (it needs 2t > n + |C|, see the module doc)."""
    return 2 * parties // 3 + 1 if active else parties // 2 + 1


def _sign(me: str, peer: str) -> int:
    return 1 if me < peer else -1


def _pair_info(round: int, stage: str, tensor: str, a: str, b: str) -> str:
    lo, hi = sorted((a, b))
    return f"fedkg-sa-pair|{round}|{stage}|{tensor}|{lo}|{hi}"


def _bytes(t: Tensor) -> bytes:
    return t.to(torch.uint8).numpy().tobytes()


def _tensor(data: bytes) -> Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def _words(key: bytes, shape) -> Tensor:
    n = 1
    for s in shape:
        n *= int(s)
    return secagg.keystream_words(key, n).view(*shape)


def _offset(key: bytes, round: int, stage: str, tensor: str, name: str, public: bytes, rows: int,
            width: int) -> Tensor:
    """Client ``name``'s hidden-aggregate offset of ``tensor`` for the first ``rows`` rows.

    Keyed by the federation key and by what the client itself knows of the aggregation: the
    round, the stage and its own fresh mask public key of that attempt, so no server message
    can make two aggregations share an offset. Each holder adds its own independent offset:
    their sum is uniform in ℤ_{2^32} whatever the holder count (one offset added c times
    would leave the low bits of the sum for an even c)."""
    info = f"fedkg-sa-offset|{round}|{stage}|{tensor}|{name}|{bytes(public).hex()}"
    return _words(secagg.derive_key(key, info), (rows, width))


def _check_statement(federation: str, round: int, attempt: str, stage: str, survivors: list[str],
                     keys: bytes) -> bytes:
    """What a client signs in the consistency check: this attempt's survivor list and the
    digest of the round keys it shared under (:func:`_key_set`), so that a signature of
    another attempt, or of a client that saw other keys, does not count."""
    return (f"fedkg-sa-check|{federation}|{round}|{attempt}|{stage}|{','.join(sorted(survivors))}|".encode()
            + bytes(keys))


def _keys_statement(federation: str, round: int, attempt: str, name: str, c_pk: bytes, s_pk: bytes) -> bytes:
    """What a client signs when it advertises its round keys (``active``): bound to the
    federation (its roster's digest), the round and the attempt."""
    return f"fedkg-sa-keys|{federation}|{round}|{attempt}|{name}|".encode() + bytes(c_pk) + bytes(s_pk)


def _key_set(c_pk: dict[str, bytes], s_pk: dict[str, bytes]) -> bytes:
    """SHA-256 of every party's round keys, as one client saw them."""
    import hashlib

    h = hashlib.sha256()
    for name in sorted(c_pk):
        h.update(name.encode() + b"\0" + bytes(c_pk[name]) + bytes(s_pk[name]))
    return h.digest()


def new_attempt() -> str:
    """A fresh attempt id (128 random bits): a round's every try is named anew, so nothing
    signed in one try (or one run) verifies in another, and a client keys each id once."""
    import secrets

    return secrets.token_hex(16)


def check_secure_config(cfg, strategy, num_clients: int | None = None) -> int:
    """Validate ``federated.secure_aggregation`` for ``strategy`` in a federation of
    ``num_clients`` (default ``data.num_clients``); returns the threshold t."""
    sc = cfg.federated.secure_aggregation
    if not issubclass(strategy.Server, HolderMeanServer):
        raise ConfigError(f"federated.secure_aggregation needs a holder-mean strategy (one whose "
                          f"server is a HolderMeanServer); {cfg.federated.strategy!r} aggregates otherwise")
    if tuple(strategy.Server.stages) != ("train",):
        raise ConfigError(f"federated.secure_aggregation wraps a one-stage training round; {strategy.name!r} "
                          f"runs {tuple(strategy.Server.stages)}")
    n = num_selected(cfg.federated.fraction, num_clients or cfg.data.num_clients)
    t = sc.threshold if sc.threshold is not None else default_threshold(n, sc.active)
    if n >= 2 and not default_threshold(n) <= t <= n:
        raise ConfigError(f"federated.secure_aggregation.threshold={t} must be in [{default_threshold(n)}, {n}] "
                          f"(a strict majority of the {n} clients selected per round): with t <= n/2 a server "
                          "telling half the clients that a peer survived and half that it dropped gets t shares "
                          "of both its secrets")
    if sc.active and sc.mode == "dense" and not sc.hide_aggregate:
        raise ConfigError("federated.secure_aggregation.active with mode=dense needs hide_aggregate=true: a dense "
                          "client cannot count the holders of its rows, so a server that lies about the alignment "
                          "could give a row a place only that client fills and read it as an aggregate; "
                          "shared_rows counts them (min_holders), hide_aggregate hides what any place sums to")
    if sc.hide_aggregate and not cfg.federated.federation_key:
        raise ConfigError("federated.secure_aggregation.hide_aggregate needs federated.federation_key: the offset "
                          "comes from it, and the default key derives from the seed, which the server knows")
    if sc.hide_aggregate and (num_clients or cfg.data.num_clients) > 63:
        raise ConfigError("federated.secure_aggregation.hide_aggregate supports at most 63 clients: each row's "
                          "holders are a bit mask in one int64")
    if cfg.federated.aggregation == "named_rows":
        raise ConfigError("federated.secure_aggregation needs federated.aggregation=selected_holders or "
                          "all_holders: under named_rows each client tells the server which rows it trained on")
    if sc.hide_aggregate and cfg.federated.aggregation == "all_holders":
        raise ConfigError("federated.secure_aggregation.hide_aggregate needs federated.aggregation="
                          "selected_holders: the damped mean needs the server's current rows, which it cannot see")
    return min(t, n)


def provision_identities(folder, cfg, names: list[str]) -> identities.Roster:
    """:func:`~lightning_fedkg.privacy.identities.provision` for the clients ``names`` of ``cfg``, with the t that
    :func:`check_secure_config` gives for them."""
    t = check_secure_config(cfg, STRATEGIES.get(cfg.federated.strategy), len(names))
    return identities.provision(folder, names, t)


@dataclass
class _ServerRound:
    """One round as the server sees it: the keys, shares and uploads of its attempt."""

    round: int
    threshold: int
    attempt: str = ""
    parties: list[str] = field(default_factory=list)            # U1, in Shamir order
    c_pk: dict[str, bytes] = field(default_factory=dict)
    s_pk: dict[str, bytes] = field(default_factory=dict)
    signatures: dict[str, bytes] = field(default_factory=dict)   # active: the signed key advertisements
    checks: dict[str, bytes] = field(default_factory=dict)       # active: the signed survivor list
    ciphertexts: dict[str, dict[str, Tensor]] = field(default_factory=dict)  # receiver -> sender -> ct
    shared: list[str] = field(default_factory=list)             # U2
    stage: str = "train"
    serial: int = 0
    uploads: dict[str, dict[str, Tensor]] = field(default_factory=dict)      # U3 -> tensor -> words


@dataclass
class _ClientRound:
    """One round's secrets and what the client learnt in it; never in a saved state."""

    round: int
    threshold: int
    c_sk: bytes
    c_pk: bytes
    s_sk: bytes
    s_pk: bytes
    seed: bytes
    attempt: str = ""
    parties: list[str] = field(default_factory=list)
    own: tuple[bytes, bytes] | None = None                      # my shares of my own secrets
    c_pk_of: dict[str, bytes] = field(default_factory=dict)       # the peers' share-encryption keys
    s_pk_of: dict[str, bytes] = field(default_factory=dict)       # active: the peers' signed mask keys
    received: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)  # peer -> (b share, s share)
    shared: list[str] = field(default_factory=list)             # U2, as told with the masked stage
    stage: str = ""
    checked: list[str] | None = None                            # active: the survivor list I signed
    keys: bytes = b""                                            # active: digest of the round keys I shared under
    #: shared_rows: ``{tensor: {peer: my row positions I mask with that peer}}`` (who holds my rows)
    peer_rows: dict[str, dict[str, Tensor]] = field(default_factory=dict)
    #: shared_rows: ``{tensor: which of my rows I uploaded}`` (held by at least ``min_holders``)
    uploaded: dict[str, Tensor] = field(default_factory=dict)
