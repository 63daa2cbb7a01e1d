"""No tracked file cites the internal design notes (REFERENCE, LIBRARIES, ARCHITECTURE:
outside the repository, unseen by users).

Facts are cited from their papers or the official code; our own reasoning is written out in
place or in docs/DESIGN.md. This test fails on any ``REFERENCE §...`` (also broken across a
line, e.g. ``REFERENCE`` / ``# §4.5``) or ``REFERENCE.md`` in the code, configs, tests, docs,
README and scripts.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCOPE = ("lightning_fedkg", "configs", "tests", "docs", "README.md", "scripts", "pyproject.toml")
# the names are joined at run time so that this file never matches itself
NAMES = "|".join(("REF" + "ERENCE", "LIBR" + "ARIES", "ARCHI" + "TECTURE"))
PATTERN = re.compile(rf"(?:{NAMES})[\s#*>/]*§|(?:{NAMES})\.md|shared/" + "docs")


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *SCOPE], cwd=ROOT,
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / p for p in out.decode().split("\0") if p]


def test_no_internal_reference_citations():
    me = Path(__file__).resolve()
    hits = []
    for path in _tracked_files():
        if path.resolve() == me or not path.is_file():
            continue
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for m in PATTERN.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            hits.append(f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}")
    assert not hits, "cite the paper or official code instead:\n" + "\n".join(hits)
