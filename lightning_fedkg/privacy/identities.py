"""Per-client identity keys and the security policy of secure aggregation (``active``).

A provisioning folder ``identities/`` (mode 0700) holds ``<client>.key`` (an Ed25519 private
key, mode 0600, for that client only) and ``roster.json`` (every member's public key,
``threshold`` and ``num_clients``: the policy the clients agreed to). A client reads both
from its own disk, never from the server, and refuses a key others may read or a folder
others may write. :func:`provision` writes the folder; it must be handed out honestly and
out of band (threat model: docs/privacy.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from lightning_fedkg.config import ConfigError
from lightning_fedkg.federated.protections import IDENTITIES
from lightning_fedkg.private_files import check_private_file, check_private_folder, make_private_folder

__all__ = ["IDENTITIES", "ROSTER", "Roster", "write_identities", "provision", "read_roster", "read_private_key",
           "has_roster"]

#: The public file of the folder.
ROSTER = "roster.json"
_KEY_BYTES = 32


@dataclass(frozen=True)
class Roster:
    """The clients' agreed policy: ``members`` ``{client: Ed25519 public key (32 raw bytes)}``,
    ``threshold`` (t) and ``num_clients`` (n, the federation's size it was written for)."""

    members: dict[str, bytes]
    threshold: int
    num_clients: int

    def public_key(self, name: str) -> bytes:
        """``name``'s identity public key; raises ``KeyError`` for a client not in the roster
        (a peer the clients never agreed to, whatever the server says)."""
        if name not in self.members:
            raise KeyError(f"{name!r} is not in the roster ({', '.join(sorted(self.members))})")
        return self.members[name]

    def digest(self) -> str:
        """SHA-256 (hex) of the roster: the federation a client's signatures name."""
        import hashlib

        return hashlib.sha256(json.dumps(self.to_json(), sort_keys=True).encode()).hexdigest()

    def to_json(self) -> dict:
        return {"members": {n: k.hex() for n, k in sorted(self.members.items())}, "threshold": self.threshold,
                "num_clients": self.num_clients}


def _key_path(folder: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"{name!r} cannot name an identity key file")
    return folder / f"{name}.key"


def write_identities(folder: str | Path, names: list[str], threshold: int, num_clients: int | None = None) -> Roster:
    """Fresh random identity keys for ``names`` in ``folder`` (made 0700, also when it
    existed): one ``<name>.key`` (0600) each and ``roster.json`` with their public keys and
    the policy (t = ``threshold``, n = ``num_clients``, default ``len(names)``). Every file is
    written atomically, the roster last, so a roster on disk means its keys are all there.
    Overwrites what was there."""
    from lightning_fedkg.atomic import write_atomic
    from lightning_fedkg.privacy.mechanisms import secagg

    folder = Path(folder)
    n = len(names) if num_clients is None else int(num_clients)
    if len(set(names)) != len(names) or not names:
        raise ConfigError(f"identities need distinct client names, got {names}")
    if not 1 <= threshold <= n:
        raise ConfigError(f"an identity roster's threshold {threshold} must be in [1, {n}]")
    make_private_folder(folder)
    members = {}
    for name in names:
        private, members[name] = secagg.new_identity()
        write_atomic(_key_path(folder, name), lambda f, key=private: f.write(key.hex().encode() + b"\n"), mode=0o600)
    roster = Roster(members=members, threshold=int(threshold), num_clients=n)
    write_atomic(folder / ROSTER, lambda f: f.write(json.dumps(roster.to_json(), indent=1).encode() + b"\n"),
                 mode=0o644)
    return roster


def provision(folder: str | Path, names: list[str], t: int) -> Roster:
    """The identities of a federation of clients ``names`` with threshold ``t`` in
    ``folder``: written once and reused as they are afterwards (a resumed run keeps its
    keys). A folder written for other clients or another t is refused rather than
    replaced: the clients may already hold its keys. The folder is made 0700 either way.
    :func:`~lightning_fedkg.privacy.secure.provision_identities` takes t from a config."""
    folder = Path(folder)
    if not has_roster(folder):
        return write_identities(folder, list(names), t, len(names))
    make_private_folder(folder)
    roster = read_roster(folder)
    if set(roster.members) != set(names) or roster.threshold != t or roster.num_clients != len(names):
        raise ConfigError(f"{folder / ROSTER} was written for clients {sorted(roster.members)} with t="
                          f"{roster.threshold}, n={roster.num_clients}; this run has {sorted(names)} with t={t}, "
                          f"n={len(names)}. Remove {folder} to provision new identities (every client then needs "
                          "its new key and the new roster)")
    missing = [n for n in names if not _key_path(folder, n).is_file()]
    if missing:
        raise ConfigError(f"{folder} has a roster but no private key for {missing}")
    return roster


def has_roster(folder: str | Path | None) -> bool:
    """Whether ``folder`` holds a ``roster.json``."""
    return folder is not None and (Path(folder) / ROSTER).is_file()


def read_roster(folder: str | Path) -> Roster:
    """The :class:`Roster` in ``folder/roster.json``; a ConfigError names the file when it
    is missing or malformed, or the folder when others may write to it."""
    path = Path(folder) / ROSTER
    if not path.is_file():
        raise ConfigError(f"no identity roster at {path}: provision the federation's identities "
                          "(lightning_fedkg.privacy.identities.provision) and give every client the roster")
    check_private_folder(folder, "identity keys and the roster")
    try:
        data = json.loads(path.read_text())
        members = {str(n): bytes.fromhex(k) for n, k in data["members"].items()}
        threshold, num_clients = data["threshold"], data["num_clients"]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ConfigError(f"{path} is not an identity roster ({type(err).__name__}: {err}); expected "
                          '{"members": {client: public key hex}, "threshold": t, "num_clients": n}') from None
    if not isinstance(threshold, int) or not isinstance(num_clients, int) or not 1 <= threshold <= num_clients:
        raise ConfigError(f"{path}: threshold {threshold!r} and num_clients {num_clients!r} must be integers "
                          "with 1 <= threshold <= num_clients")
    bad = [n for n, k in members.items() if len(k) != _KEY_BYTES]
    if bad or len(members) != num_clients:
        raise ConfigError(f"{path}: {len(members)} members for num_clients={num_clients}, and the keys of {bad} "
                          f"are not {_KEY_BYTES} bytes")
    return Roster(members=members, threshold=threshold, num_clients=num_clients)


def read_private_key(folder: str | Path, name: str) -> bytes:
    """Client ``name``'s private identity key (32 raw bytes) from ``folder/<name>.key``; a
    ConfigError names the file when it is missing, not a key, or readable by others (any
    group or other bit), or the folder when others may write to it."""
    path = _key_path(Path(folder), name)
    if not path.is_file():
        raise ConfigError(f"no identity key for {name} at {path}: each client needs its own private key "
                          f"beside the roster")
    check_private_folder(folder, "identity keys and the roster")
    check_private_file(path, "the private identity key")
    try:
        key = bytes.fromhex(path.read_text().strip())
    except ValueError:
        key = b""
    if len(key) != _KEY_BYTES:
        raise ConfigError(f"{path} is not an identity key (hex of {_KEY_BYTES} bytes)")
    return key
