"""`fedkg query`'s parser: every example its docstrings and the method page show parses to
the structure it names, and a negation is refused by name."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from lightning_fedkg.methods.fedcqa import query_text
from lightning_fedkg.methods.fedcqa.queries import STRUCTURES, num_slots
from lightning_fedkg.methods.fedcqa.query_text import QuerySyntaxError, parse_query

ROOT = Path(__file__).resolve().parents[1]
# a literal that reads as a query: a chain, an intersection or a union, maybe under a projection
QUERY_LIKE = re.compile(r"^\(?[iu]\(|^\(e:")


def docstrings(path: Path) -> list[str]:
    """The module's docstring and those of its classes and functions, nested ones too."""
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef)))]
    return [doc for doc in map(ast.get_docstring, nodes) if doc]


def examples(text: str) -> list[tuple[str, str | None]]:
    """``(query, structure it is said to be or None)`` for every query-like ``literal``."""
    found = []
    for m in re.finditer(r"``([^`]+)``(\s*\((\w+)\))?", " ".join(text.split())):
        if QUERY_LIKE.match(m.group(1)):
            found.append((m.group(1), m.group(3)))
    return found


def test_examples_finds_literals_and_their_structures():
    text = "a chain ``(e:a, (r:x))`` (1p), a pattern ``i(q, q, ...)``, a grammar note ``(r:x,)`` and ``up``"
    assert examples(text) == [("(e:a, (r:x))", "1p"), ("i(q, q, ...)", None)]


def test_every_docstring_example_of_query_text_parses_to_its_structure():
    found = [e for doc in docstrings(Path(query_text.__file__)) for e in examples(doc)]
    named = {}
    for text, structure in found:
        parsed, slots = parse_query(text)  # raises on an example the grammar rejects
        assert len(slots) == num_slots(STRUCTURES[parsed])
        if structure is not None:
            assert parsed == structure, text
            named[structure] = text
    assert sorted(named) == sorted(STRUCTURES)  # one example per structure, the up among them


def test_the_method_page_queries_parse():
    page = (ROOT / "docs" / "methods" / "fedcqa.md").read_text()
    typed = re.findall(r'fedkg query [^"\n]*"([^"]+)"', page)
    typed += [t for t, _ in examples(page.replace("`(", "``(").replace(")`", ")``"))]
    assert typed
    for text in typed:
        parse_query(text)


NEGATION = "negation is not supported (types: 1p, 2p, 3p, 2i, 3i, ip, pi, 2u, up)"


@pytest.mark.parametrize("text, column", [
    ("i((e:a, (r:x)), n((e:b, (r:y))))", 17),    # BetaE's n around a branch
    ("i((e:a, (r:x)), (e:b, (r:y, n)))", 29),    # BetaE's tuple marker (r, n)
    ("not (e:a, (r:x))", 1),
    ("i((e:a, (r:x)), -(e:b, (r:y)))", 17),
    ("i((e:a, (r:x)), NOT(e:b, (r:y)))", 17),
    ("(~(e:a, (r:x)), (r:y))", 2),
    ("(e:a, (r:x, !r:y))", 13),
    ("(e:a, (\u00acr:x))", 8),
])
def test_negation_is_refused_by_name(text, column):
    with pytest.raises(QuerySyntaxError) as info:
        parse_query(text)
    message = str(info.value)
    assert message.startswith(f"{NEGATION} at character {column}:")
    assert message.splitlines()[-1] == "  " + " " * (column - 1) + "^"


@pytest.mark.parametrize("text", ["(e:notes, (r:negates))", '(e:"n", (r:n))', "(e:-1, (r:not))"])
def test_names_that_look_like_negation_are_names(text):
    assert parse_query(text)[0] == "1p"


def test_other_slips_keep_their_own_errors():
    with pytest.raises(QuerySyntaxError, match="expected an entity 'e:NAME'"):
        parse_query("(aspirin, (r:treats))")
    with pytest.raises(QuerySyntaxError, match="expected a query"):
        parse_query("x((e:a, (r:x)))")
