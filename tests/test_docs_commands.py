"""Every `fedkg` command the docs show with a shipped config names a config that exists and
whose overrides parse: a renamed config or key breaks this test, not a reader's first try."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from lightning_fedkg.config import load_config

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# `fedkg <command> ... -c configs/<file>.yaml ...` up to a backtick, a comment or the line's end
COMMAND = re.compile(r"fedkg (?:fit|test|unlearn|flower up)\b[^`#\n]*?-c (configs/\S+\.yaml)([^`#\n]*)")
PLACEHOLDER = re.compile(r"[<>$]|\.\.\.|\b[A-Z]{2,}\b")


def commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for m in COMMAND.finditer(line):
                if PLACEHOLDER.search(m.group(1)):  # configs/kge/umls_<model>.yaml: a pattern
                    continue
                where = f"{doc.relative_to(ROOT)}:{number}"
                rest = m.group(2).rstrip(" \\")
                try:
                    tokens = shlex.split(rest)
                except ValueError:
                    tokens = rest.split()
                found.append((where, m.group(1), tokens))
    return found


def test_the_docs_show_commands():
    assert len(commands()) >= 30  # the pattern still finds the docs' commands


@pytest.mark.parametrize("where, config, tokens", commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_a_documented_command_names_a_config_that_loads(where, config, tokens):
    assert (ROOT / config).is_file(), f"{where}: {config} does not exist"
    overrides = [t for t in tokens if "=" in t and not t.startswith("-") and not PLACEHOLDER.search(t)]
    load_config(str(ROOT / config), overrides)  # raises ConfigError naming the bad key or value
