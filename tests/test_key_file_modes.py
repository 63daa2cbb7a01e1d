"""Identity keys and the federation-key file against the review's finding on permissions:
``mkdir(exist_ok=True, mode=0o700)`` leaves an existing identities folder as it was (0755),
a private key file readable by others was read without a word, and so was a federation-key
file. Now provisioning makes the folder 0700, and reading refuses, as ssh does, a private
file with any group or other bit and an identities folder others can write to. Each test
says what it measured on the old code."""

from __future__ import annotations

import os
import stat

import pytest

from lightning_fedkg.config import ConfigError
from lightning_fedkg.privacy import identities
from lightning_fedkg.backends.flower.backend import write_key_file
from lightning_fedkg.backends.flower.data import read_key_file

NAMES = ["client_0", "client_1", "client_2"]


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_provisioning_makes_an_existing_identities_folder_private(tmp_path):
    """An identities folder made 0755 before provisioning (by hand, or an older run) stayed
    0755 on the old code; provisioning now sets 0700, writing it or reusing it, and every
    private key it writes is 0600."""
    folder = tmp_path / "identities"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)  # whatever the umask
    identities.write_identities(folder, NAMES, threshold=2)
    assert mode(folder) == 0o700, f"{mode(folder):04o}"
    assert all(mode(folder / f"{n}.key") == 0o600 for n in NAMES)
    os.chmod(folder, 0o755)  # an existing provisioned folder, reused as it is
    identities.provision(folder, NAMES, 2)
    assert mode(folder) == 0o700, f"{mode(folder):04o}"


@pytest.mark.parametrize("bits", [0o644, 0o640, 0o604, 0o610, 0o601], ids=oct)
def test_a_private_identity_key_readable_by_others_is_refused(tmp_path, bits):
    """A key file with any group or other bit: the old code read it (and signed with it);
    now a ConfigError names the file, its mode and the fix. 0600 and 0400 are read."""
    identities.write_identities(tmp_path, NAMES, threshold=2)
    path = tmp_path / "client_1.key"
    os.chmod(path, bits)
    with pytest.raises(ConfigError, match=rf"{path}.*{bits:04o}.*chmod 600 {path}"):
        identities.read_private_key(tmp_path, "client_1")
    for fine in (0o600, 0o400):
        os.chmod(path, fine)
        assert len(identities.read_private_key(tmp_path, "client_1")) == 32


@pytest.mark.parametrize("bits", [0o770, 0o707, 0o777, 0o720], ids=oct)
def test_an_identities_folder_others_can_write_to_is_refused(tmp_path, bits):
    """A folder others can write to lets them replace a key or the roster: the old code read
    from it; now reading a key or the roster is a ConfigError naming the folder, its mode
    and ``chmod 700``. 0700 and 0755 (readable, not writable, by others) are read."""
    folder = tmp_path / "ids"
    identities.write_identities(folder, NAMES, threshold=2)
    os.chmod(folder, bits)
    try:
        with pytest.raises(ConfigError, match=rf"{folder}.*{bits:04o}.*chmod 700 {folder}"):
            identities.read_private_key(folder, "client_0")
        with pytest.raises(ConfigError, match=rf"{folder}.*{bits:04o}.*chmod 700 {folder}"):
            identities.read_roster(folder)
        for fine in (0o700, 0o755):
            os.chmod(folder, fine)
            assert identities.read_roster(folder).threshold == 2
            assert len(identities.read_private_key(folder, "client_0")) == 32
    finally:
        os.chmod(folder, 0o700)


@pytest.mark.parametrize("bits", [0o644, 0o640, 0o660, 0o604], ids=oct)
def test_a_federation_key_file_readable_by_others_is_refused(tmp_path, bits):
    """The old code read the federation secret from a 0644 file; now a ConfigError (still a
    ValueError, as the missing and empty file's) names the file, its mode and the fix."""
    path = tmp_path / "federation.key"
    path.write_text("a long shared secret\n")
    os.chmod(path, bits)
    with pytest.raises(ConfigError, match=rf"{path}.*{bits:04o}.*chmod 600 {path}"):
        read_key_file(path)
    os.chmod(path, 0o600)
    assert read_key_file(path) == "a long shared secret"
    os.chmod(path, 0o400)
    assert read_key_file(path) == "a long shared secret"


def test_write_key_file_makes_an_existing_file_private(tmp_path):
    """``os.open(..., O_CREAT, 0o600)`` sets the mode of a new file only: over an existing
    0644 file the old code left it 0644 (and readable by others). Now it is 0600 either way."""
    path = tmp_path / "federation.key"
    path.write_text("old\n")
    os.chmod(path, 0o644)
    write_key_file("new secret", path)
    assert mode(path) == 0o600, f"{mode(path):04o}"
    assert read_key_file(path) == "new secret"
    fresh = write_key_file("another", tmp_path / "sub" / "federation.key")
    assert mode(fresh) == 0o600
