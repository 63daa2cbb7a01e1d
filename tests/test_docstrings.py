"""Every module docstring in lightning_fedkg/ is short: what the module is for, its entry
points and a pointer to its docs page. The research record and threat models live in docs/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_fedkg"
MAX_LINES = 15


def docstring_lines(path: Path) -> int:
    """Lines the module docstring spans in the file, its quotes included (0 without one)."""
    body = ast.parse(path.read_text()).body
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        return 0
    return body[0].end_lineno - body[0].lineno + 1


MODULES = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_the_scan_finds_the_package():
    assert len(MODULES) > 50 and "cli.py" in MODULES


def test_docstring_lines_counts_the_quotes(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('"""One.\n\nTwo.\n"""\nx = 1\n')
    assert docstring_lines(module) == 4
    module.write_text("x = 1\n")
    assert docstring_lines(module) == 0


@pytest.mark.parametrize("module", MODULES)
def test_module_docstring_is_at_most_15_lines(module):
    lines = docstring_lines(PACKAGE / module)
    assert lines <= MAX_LINES, f"lightning_fedkg/{module}: module docstring of {lines} lines; move the detail to docs/"
