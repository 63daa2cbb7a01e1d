"""The docs are a map that holds: every registered strategy has a method page, the docs
index lists pages that exist, and every relative link in README.md and docs/ resolves, anchors included."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
# Strategies that share a page with their method (FedCQA's baselines under the query task,
# FedE's Isolation and Collection settings).
PAGE_OF = {"fedcqa_fede": "fedcqa", "fedcqa_fedr": "fedcqa", "single": "baselines", "entire": "baselines"}
# [text](target) outside code spans; the target up to whitespace or ')'
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def registered_strategies() -> list[str]:
    """The names of the lightning_fedkg.strategies entry points, from pyproject.toml (the
    source, not the installed metadata, so a strategy added on a branch needs its page)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return sorted(project["entry-points"]["lightning_fedkg.strategies"])


def relative_links(page: Path) -> list[tuple[int, str]]:
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), page.read_text(), flags=re.S)
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#"):
                found.append((number, target))
    return found


def test_the_strategies_are_found():
    assert {"fede", "fedr", "fedlu", "fkge", "fedcqa", "single"} <= set(registered_strategies())


@pytest.mark.parametrize("strategy", registered_strategies())
def test_every_registered_strategy_has_a_method_page(strategy):
    page = DOCS / "methods" / f"{PAGE_OF.get(strategy, strategy)}.md"
    assert page.is_file(), f"strategy {strategy!r} has no page {page.relative_to(ROOT)}"
    assert re.search(rf"\b{strategy}\b", page.read_text()), f"{page.name} never names the strategy {strategy!r}"


def test_every_page_in_docs_is_listed_in_the_index():
    index = DOCS / "README.md"
    listed = {(index.parent / target).resolve() for _, target in relative_links(index)}
    for page in DOCS.rglob("*.md"):
        if page != index:
            assert page.resolve() in listed, f"{page.relative_to(ROOT)} is not linked from docs/README.md"


def test_the_pages_have_links():
    assert sum(len(relative_links(page)) for page in PAGES) > 100  # the pattern still finds them


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as '-'."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def broken_links(page: Path) -> list[str]:
    broken = []
    for number, target in relative_links(page) + [(n, page.name + t) for n, t in same_page_links(page)]:
        path, _, anchor = target.partition("#")
        resolved = page.parent / path
        if not resolved.exists() or (anchor and resolved.is_file() and anchor not in anchors(resolved)):
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target}")
    return broken


def same_page_links(page: Path) -> list[tuple[int, str]]:
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), page.read_text(), flags=re.S)
    return [(number, target) for number, line in enumerate(text.splitlines(), 1)
            for target in LINK.findall(re.sub(r"`[^`]*`", "", line)) if target.startswith("#")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    broken = broken_links(page)
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_a_broken_link_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    page = tmp_path / "p.md"
    page.write_text("# A (b) `c`\n[ok](p.md#a-b-c) [gone](missing.md) [no anchor](p.md#nope) [here](#a-b-c)"
                    " [there](#gone) `[code](nope.md)` [web](https://example.org)\n")
    assert anchors(page) == {"a-b-c"}
    assert broken_links(page) == ["p.md:2: missing.md", "p.md:2: p.md#nope", "p.md:2: p.md#gone"]
