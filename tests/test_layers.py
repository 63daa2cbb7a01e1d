"""The package's structure: imports point down the layers, no import cycle, a core that names no method.

The import graph is built from the source with ``ast`` (every import, also those inside
functions: a lazy import is still a dependency), so these tests need no import of the
package and fail on the first edge that breaks the rule.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "lightning_fedkg"

#: Lowest first. A module may import modules of its own layer or of lower ones; a name is a
#: top-level module or package.
LAYERS = [
    ("base", ("atomic", "keys", "seeding", "registry", "config", "rundir", "runtime", "commands", "private_files",
              "measure", "preflight")),
    ("data, evaluation, models", ("data", "evaluation", "models")),
    ("builders", ("builders",)),
    ("federated core", ("federated",)),
    ("privacy", ("privacy",)),
    ("methods", ("methods",)),
    ("reports", ("reports",)),
    ("backends", ("backends",)),
    ("runs", ("training", "run")),
    ("command line", ("cli", "__init__")),
]

#: The core: what every method builds on, and which must not know any of them.
CORE = ("federated", "data", "evaluation", "models")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports (``from pkg import sub`` counts as ``pkg.sub``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = [f"{module}.{a.name}" if f"{module}.{a.name}" in known else module for a in node.names]
        else:
            continue
        for target in targets:
            # The nearest enclosing module of the package (``a.b.c`` → ``a.b`` if c is a name).
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("lightning_fedkg") and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def layer_of(name: str) -> int:
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for i, (_, names) in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{name} belongs to no layer: add its top-level name to LAYERS")


def strongly_connected(g: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm: the components with more than one module (the cycles)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_import_graph_has_no_cycle():
    assert strongly_connected(graph()) == []


def test_the_oracle_finds_a_cycle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_point_down_the_layers():
    upward = [f"{a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
              for a, targets in sorted(graph().items()) for b in sorted(targets) if layer_of(b) > layer_of(a)]
    assert upward == []


def method_names() -> set[str]:
    """The built-in methods' names: their packages under methods/ (each a strategy name too)."""
    return {p.name for p in (PACKAGE / "methods").iterdir() if (p / "__init__.py").is_file()}


def code_tokens(path: Path):
    """``(line, token)`` of every name and string literal that is code: comments and
    docstrings (a string that is a whole statement) may cite a method, and so may prose in
    a message; a name or a whole string may not."""
    docstrings = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            docstrings.add(node.lineno)
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type == tokenize.NAME:
            yield tok.start[0], tok.string
        elif tok.type == tokenize.STRING and tok.start[0] not in docstrings:
            yield tok.start[0], tok.string.strip("'\"").lower()


def test_the_core_names_no_method():
    names = method_names()
    assert {"fede", "fedlu", "fkge", "single", "entire"} <= names
    found = []
    for top in CORE:
        for path in sorted((PACKAGE / top).rglob("*.py")):
            for line, token in code_tokens(path):
                if token.lower() in names:
                    found.append(f"{path.relative_to(PACKAGE)}:{line}: {token}")
    assert found == []


def test_every_method_package_is_an_entry_point_and_back():
    import tomllib

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    strategies = project["entry-points"]["lightning_fedkg.strategies"]
    # Each package registers the strategy named after it; a package may add variants of it
    # (fedcqa's baselines) named with its name as prefix, and every target lives in one.
    assert method_names() <= set(strategies)
    for name, target in strategies.items():
        package = next((p for p in method_names() if name == p or name.startswith(f"{p}_")), None)
        assert package, f"strategy {name!r} is not named after a method package"
        assert target.startswith(f"lightning_fedkg.methods.{package}:"), target
    from lightning_fedkg.methods import BUILTIN_PACKAGES

    assert set(BUILTIN_PACKAGES) == method_names()


def method_mentions(path: Path, name: str) -> list[str]:
    """Where the module ``name`` at ``path`` imports a method module, or names one in code
    (a method package's name, or ``lightning_fedkg.methods`` in a string: an import by path)."""
    known = {**modules(), name: path}
    found = [f"imports {target}" for target in sorted(imports_of(name, path, known))
             if target.startswith("lightning_fedkg.methods")]
    names = method_names()
    found += [f"{path.name}:{line}: {token}" for line, token in code_tokens(path)
              if token.lower() in names or "lightning_fedkg.methods" in token]
    return found


def test_the_command_line_names_no_method():
    """``fedkg`` reaches the methods through the registries only: their commands
    (``COMMANDS``), their tables (``format_report``), their tasks' data (``data_stats``)."""
    assert method_mentions(PACKAGE / "cli.py", "lightning_fedkg.cli") == []


def test_method_mentions_finds_a_lazy_import_and_an_import_by_path(tmp_path):
    source = tmp_path / "cli.py"
    source.write_text('"""fedlu in a docstring is prose."""\n\n\ndef run():\n'
                      '    from lightning_fedkg.methods.fedlu.phase import run_unlearn\n\n'
                      '    return run_unlearn, "lightning_fedkg.methods.fedcqa:Query"\n')
    assert method_mentions(source, "lightning_fedkg.cli") == [
        "imports lightning_fedkg.methods.fedlu.phase", "cli.py:5: fedlu", "cli.py:7: lightning_fedkg.methods.fedcqa:query"]
