"""Every `fedkg` command the docs show with a shipped config names a config that exists and
whose overrides parse: a renamed config or key breaks this test, not a reader's first try.
Every command line of a code block parses as ``fedkg`` parses it, its overrides written
after its options (as ``--help`` and the resume hint write them)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from lightning_fedkg.cli import build_parser
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


# A command in a code block: at a line's start (after "$ " or indentation) or after "&&".
SHOWN = re.compile(r"(?:^\s*(?:\$\s+)?|&&\s*)fedkg\s+(\S.*)$")


def code_block_commands() -> list[tuple[str, str]]:
    """``(where, text after "fedkg ")`` of every ``fedkg`` command in a fenced code block,
    a line ending in a backslash joined with the next; synopses (``[--out DIR]``, ``...``)
    and ``fedkg --version``-like lines (an option first) are left out."""
    found = []
    for doc in DOCS:
        inside, pending = False, None
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                inside = not inside
                continue
            if pending is not None:
                pending = (pending[0], pending[1] + " " + line.strip())
            elif inside and (m := SHOWN.search(line)):
                pending = (f"{doc.relative_to(ROOT)}:{number}", m.group(1).rstrip())
            if pending is not None and not pending[1].endswith("\\"):
                found.append(pending)
                pending = None
            elif pending is not None:
                pending = (pending[0], pending[1][:-1])
    return [(where, text) for where, text in found
            if "[" not in text and "..." not in text and not text.startswith("-")]


def test_the_docs_show_command_lines():
    assert len(code_block_commands()) >= 50  # the pattern still finds the code blocks' commands


@pytest.mark.parametrize("where, text", [pytest.param(w, t, id=w) for w, t in code_block_commands()])
def test_a_documented_command_line_parses_with_its_overrides_last(where, text, capsys):
    """docs/methods/fkge.md showed ``fedkg fit -c X data.name=... --out D federated.fkge...=0``,
    which the old parser refused ("unrecognized arguments"); the old test checked only the
    overrides against the config, not the command line."""
    tokens = shlex.split(text, comments=True)
    if tokens and tokens[-1] == "&":  # started in the background
        tokens.pop()
    try:
        args = build_parser().parse_args(tokens)
    except SystemExit:
        pytest.fail(f"{where}: fedkg {text!r} does not parse: {capsys.readouterr().err.strip()}")
    overrides = getattr(args, "overrides", None) or []
    if overrides:
        last_option = max(i for i, t in enumerate(tokens) if t.startswith("-"))
        assert last_option < tokens.index(overrides[0]), f"{where}: write the overrides after the options"
