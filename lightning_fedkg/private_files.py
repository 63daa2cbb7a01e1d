"""Owner-only files and folders: the federation-key file, identity keys and their folder.

:func:`check_private_file` refuses a secret file with any group or other permission bit and
:func:`check_private_folder` a folder of secrets that others can write to, as ssh does with
its keys; :func:`make_private_folder` creates or tightens a folder to 0700. No torch, no
config at import: a forwarding ClientApp reads its key file through these. Threat model:
docs/privacy.md ("Identities").
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["check_private_file", "check_private_folder", "make_private_folder"]

#: POSIX permission bits only exist off Windows; there the checks have nothing to read.
_POSIX = os.name == "posix"


def _config_error(message: str) -> Exception:
    from lightning_fedkg.config import ConfigError  # only when refusing: keeps the import light

    return ConfigError(message)


def check_private_file(path: str | Path, what: str) -> None:
    """Raise ConfigError unless ``path`` (an existing file holding ``what``) has no group or
    other permission bit (``mode & 0o077 == 0``): a secret others can read is no longer the
    owner's alone, and one they can write can be replaced."""
    if not _POSIX:
        return
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        raise _config_error(f"{what} {path} has mode {mode:04o}: others may read or change it, and it must be its "
                            f"owner's only. Run chmod 600 {path} (and replace the secret if others could read it)")


def check_private_folder(path: str | Path, what: str) -> None:
    """Raise ConfigError if group or others may write to the folder ``path`` (holding
    ``what``): they could replace the files in it."""
    if not _POSIX:
        return
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o022:
        raise _config_error(f"{path} holds {what} but has mode {mode:04o}: others may write to it and replace "
                            f"them. Run chmod 700 {path}")


def make_private_folder(path: str | Path) -> None:
    """Create ``path`` (and its parents) and set it to 0700, also when it existed: ``mkdir``'s
    mode applies to a new folder only, and not past the umask."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if _POSIX:
        os.chmod(path, 0o700)
