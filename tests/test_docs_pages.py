"""The docs are a map that holds: every registered strategy has a method page, the docs
index lists pages that exist, every relative link in README.md and docs/ resolves, anchors
included, and every package path or dotted module the docs, docstrings and config comments
name exists."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md")), ROOT / "scripts" / "README.md"]
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


# Where package paths and dotted names are looked for: the pages, and the docstrings and
# comments of the code, scripts and configs (whose pointers went stale when modules moved).
# CHANGELOG.md is left out: it names the old paths on purpose.
SOURCES = [*PAGES, *sorted((ROOT / "lightning_fedkg").rglob("*.py")), *sorted((ROOT / "scripts").rglob("*.py")),
           *sorted((ROOT / "configs").rglob("*.yaml"))]
# lightning_fedkg/a/b.py or lightning_fedkg/a/ (not a cache folder such as ~/.cache/lightning_fedkg/x;
# a name with a hyphen is a label, such as a hash domain, never a module)
PACKAGE_PATH = re.compile(r"(?<![\w/.~-])lightning_fedkg/[\w./-]*[\w/]")
# lightning_fedkg.a.b, lightning_fedkg.a.b:Name or lightning_fedkg.a.b.Name
DOTTED = re.compile(r"(?<![\w/.-])lightning_fedkg(?:\.\w+)+(?::\w+)?")


def entry_point_groups(root: Path) -> set[str]:
    """``lightning_fedkg.strategies`` and the other groups: dotted, but not modules."""
    return set(tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"])


def top_level_names(source: Path) -> set[str]:
    """What ``module.NAME`` may name in the module at ``source``: its classes, functions,
    assignments, imports and ``__all__`` (which lists what a lazy ``__getattr__`` gives)."""
    names: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
                names.update(n.value for n in ast.walk(node.value) if isinstance(n, ast.Constant))
    return names


def missing_name(dotted: str, root: Path) -> str | None:
    """Why ``dotted`` (``lightning_fedkg.a.b``, ``...:Name``) names nothing under ``root``, or None."""
    module, _, attribute = dotted.partition(":")
    parts = module.split(".")
    depth = 1  # the longest prefix that is a package or a module file
    while depth < len(parts) and (root.joinpath(*parts[: depth + 1]).is_dir()
                                  or root.joinpath(*parts[:depth], parts[depth] + ".py").is_file()):
        depth += 1
    rest = parts[depth:] + ([attribute] if attribute else [])
    if not rest:
        return None
    found = root.joinpath(*parts[:depth])
    source = found / "__init__.py" if found.is_dir() else found.with_suffix(".py")
    if rest[0] in top_level_names(source):
        return None  # an attribute of an attribute (a method, a field) is not checked
    return f"{'.'.join(parts[:depth])} has no module or name {rest[0]!r}"


def stale_names(path: Path, root: Path) -> list[str]:
    """Every package path and dotted module or name in ``path`` that does not exist under ``root``."""
    groups = entry_point_groups(root)
    stale = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        where = f"{path.relative_to(root)}:{number}"
        for found in PACKAGE_PATH.findall(line):
            if "-" not in found and not (root / found).exists():
                stale.append(f"{where}: {found} does not exist")
        for found in DOTTED.findall(line):
            if found not in groups and (why := missing_name(found, root)):
                stale.append(f"{where}: {found}: {why}")
    return stale


def test_the_name_patterns_find_paths_and_modules():
    text = "see `lightning_fedkg/data/kg.py` and :mod:`lightning_fedkg.federated.entry`"
    assert PACKAGE_PATH.findall(text) == ["lightning_fedkg/data/kg.py"]
    assert DOTTED.findall(text) == ["lightning_fedkg.federated.entry"]
    assert PACKAGE_PATH.findall("~/.cache/lightning_fedkg/queries") == []
    assert PACKAGE_PATH.findall("(`lightning_fedkg/methods/`).") == ["lightning_fedkg/methods/"]
    assert sum(len(PACKAGE_PATH.findall(p.read_text())) + len(DOTTED.findall(p.read_text()))
               for p in SOURCES) > 100  # the patterns still find them


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_module_exists(path):
    stale = stale_names(path, ROOT)
    assert not stale, "names of modules that do not exist:\n" + "\n".join(stale)


# scripts/x.py, tests/test_x.py, configs/a/b.yaml: the repository's other files the docs name
REPO_FILE = re.compile(r"(?<![\w/.~-])(?:scripts|tests|configs)/[\w./-]+\.(?:py|yaml|sh)\b")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_script_test_and_config_exists(path):
    missing = sorted({f for f in REPO_FILE.findall(path.read_text()) if not (ROOT / f).is_file()})
    assert not missing, f"{path.relative_to(ROOT)} names files that do not exist: {missing}"


def test_the_file_pattern_finds_scripts_tests_and_configs():
    text = ("`python scripts/tools/compare_runs.py` (tests/test_layers.py; configs/fede/umls_fede.yaml)"
            " ../configs/x.yaml")
    assert REPO_FILE.findall(text) == ["scripts/tools/compare_runs.py", "tests/test_layers.py",
                                       "configs/fede/umls_fede.yaml"]


def test_a_stale_module_name_is_found(tmp_path):
    package = tmp_path / "lightning_fedkg"
    (package / "data").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "data" / "__init__.py").write_text('from .kg import load_kg\n__all__ = ["KGDataModule"]\n')
    (package / "data" / "kg.py").write_text("class KnowledgeGraph:\n    pass\n")
    (tmp_path / "pyproject.toml").write_text('[project.entry-points."lightning_fedkg.strategies"]\n')
    page = tmp_path / "p.md"
    page.write_text("`lightning_fedkg/data/kg.py` `lightning_fedkg/data/queries.py` `lightning_fedkg/data/`\n"
                    "lightning_fedkg.data.kg:KnowledgeGraph lightning_fedkg.data.load_kg lightning_fedkg.data.KGDataModule"
                    " lightning_fedkg.strategies\n"
                    "lightning_fedkg.data.queries lightning_fedkg.data.kg.Gone lightning_fedkg.models ~/.cache/lightning_fedkg/x"
                    " b'lightning_fedkg/a-domain'\n")
    assert stale_names(page, tmp_path) == [
        "p.md:1: lightning_fedkg/data/queries.py does not exist",
        "p.md:3: lightning_fedkg.data.queries: lightning_fedkg.data has no module or name 'queries'",
        "p.md:3: lightning_fedkg.data.kg.Gone: lightning_fedkg.data.kg has no module or name 'Gone'",
        "p.md:3: lightning_fedkg.models: lightning_fedkg has no module or name 'models'",
    ]


def module_map_paths(design: Path) -> list[str]:
    """The package paths of DESIGN.md's module map: a row's first cell lists paths, the later
    ones relative to the first one's folder (`backends/ray/peer.py`, `clients.py`); a row of
    one folder may name that folder's files in its description (`privacy/mechanisms/`: `pate.py`)."""
    text = design.read_text().split("## 1. Module map", 1)[1].split("\n## ", 1)[0]
    paths = []
    for row in re.findall(r"^\| (`.+?) \| (.+) \|$", text, flags=re.M):
        items = re.findall(r"`([^`]+)`", row[0])
        folder = str(Path(items[0].rstrip("/")).parent) + "/" if "/" in items[0].rstrip("/") else ""
        paths += [items[0]] + [item if "/" in item.rstrip("/") else folder + item for item in items[1:]]
        if len(items) == 1 and items[0].endswith("/"):
            paths += [items[0] + name for name in re.findall(r"`(\w+\.py)`", row[1])]
    return [p for p in paths if "<" not in p]


def test_every_module_in_designs_map_exists():
    paths = module_map_paths(DOCS / "DESIGN.md")
    assert {"federated/runner.py", "backends/ray/peer.py", "methods/fedr/", "privacy/mechanisms/pate.py"} <= set(paths)
    missing = [p for p in paths if not (ROOT / "lightning_fedkg" / p).exists()]
    assert not missing, f"docs/DESIGN.md's module map names modules that do not exist: {missing}"


def test_a_stale_module_in_the_map_is_found(tmp_path):
    design = tmp_path / "DESIGN.md"
    design.write_text("## 1. Module map\n\n| module | what |\n| --- | --- |\n"
                      "| `federated/peer.py`, `orchestrator.py` | x |\n| `methods/fkge/` | `ledger.py`, `X` |\n"
                      "| `methods/fede/`, `fedr/` | y |\n\n## 2. Next\n| `not/a/row.py` | z |\n")
    assert module_map_paths(design) == ["federated/peer.py", "federated/orchestrator.py", "methods/fkge/",
                                        "methods/fkge/ledger.py", "methods/fede/", "methods/fedr/"]
