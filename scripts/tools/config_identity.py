#!/usr/bin/env python
"""Check that reorganising ``configs/`` changes no run: dump, compare, and count near-copies.

A shipped config is what ``fedkg`` builds from it, not its text: moving a file, or turning it
into ``base: ...`` plus a delta (lightning_fedkg.config.file_layers), must leave that
unchanged. Three commands, run from the repository root:

``dump OUT``
    Loads every config under ``configs/`` with ``lightning_fedkg.config.load_config`` and
    writes its resolved form (``OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True)``,
    what a run directory's config.yaml holds) to ``OUT/<the config's path>``, e.g.
    ``OUT/configs/fede/umls_fede.yaml``. Bases (``configs/base/``) are building blocks a
    shipped config names, not configs to run: they are left out, and checked through the
    configs built on them.
``compare OLD NEW``
    Compares two dumps, mapping each old path to its new one through ``configs/MOVED.txt``
    (``old<TAB>new`` lines): a config whose resolved form differs (a unified diff), one
    missing from NEW, one only in NEW. Exit status 1 if there is any difference.
``similar``
    Counts the near-identical configs: for every pair of YAML files under ``configs/`` (bases
    included), the fraction of identical lines (``difflib.SequenceMatcher`` ratio over the
    files' lines), read two ways: every line of the text, and the settings only (comment and
    blank lines left out: the architecture review's count, 50 of 74 files before configs
    were composed). Prints the pairs at or above ``--threshold`` (0.9), how many files have
    such a sibling, and the number of files and lines.

Typical use, around a reorganisation::

    python scripts/tools/config_identity.py similar
    python scripts/tools/config_identity.py dump /tmp/configs_before
    # ... move and compose ...
    python scripts/tools/config_identity.py dump /tmp/configs_after
    python scripts/tools/config_identity.py compare /tmp/configs_before /tmp/configs_after
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import sys
from pathlib import Path

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)
CONFIGS = REPO / "configs"
#: configs/<BASES>/: the files shipped configs build on (not dumped: not meant to run alone)
BASES = "base"


def shipped_configs(root: Path = CONFIGS) -> list[Path]:
    """Every config a user may run: the YAML files under ``root``, bases left out."""
    return sorted(p for p in root.rglob("*.y*ml")
                  if p.suffix in (".yaml", ".yml") and BASES not in p.relative_to(root).parts[:1])


def all_yaml(root: Path = CONFIGS) -> list[Path]:
    """Every YAML file under ``root``, bases included (what a reader of the folder reads)."""
    return sorted(p for p in root.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))


def resolved(path: Path) -> str:
    """``path``'s config as ``fedkg`` builds it, as YAML (a run directory's config.yaml)."""
    from omegaconf import OmegaConf

    from lightning_fedkg.config import load_config

    return OmegaConf.to_yaml(OmegaConf.structured(load_config(path)), resolve=True)


def dump(out: Path) -> int:
    for path in shipped_configs():
        key = path.relative_to(REPO).as_posix()
        target = out / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(resolved(path), encoding="utf-8")
    print(f"{len(shipped_configs())} resolved configs written to {out}")
    return 0


def moves(moved: Path) -> dict[str, str]:
    """``{old path: new path}`` from a MOVED.txt (``old<TAB>new`` lines; none if absent)."""
    if not moved.is_file():
        return {}
    out = {}
    for line in moved.read_text(encoding="utf-8").splitlines():
        old, _, new = line.partition("\t")
        if new:
            out[old.strip()] = new.strip()
    return out


def dumped(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(folder.rglob("*.yaml"))}


def compare(old: Path, new: Path, moved: Path) -> int:
    before, after, renames = dumped(old), dumped(new), moves(moved)
    problems, seen = [], set()
    for key, text in before.items():
        target = renames.get(key, key)
        seen.add(target)
        if target not in after:
            problems.append(f"{key}: missing from {new}" + (f" (MOVED.txt says {target})" if target != key else ""))
        elif after[target] != text:
            diff = difflib.unified_diff(text.splitlines(keepends=True), after[target].splitlines(keepends=True),
                                        f"{old.name}/{key}", f"{new.name}/{target}")
            problems.append(f"{key} -> {target}: the resolved config differs\n{''.join(diff).rstrip()}")
    problems += [f"{key}: only in {new}" for key in after if key not in seen]
    for problem in problems:
        print(problem)
    moved_count = sum(1 for k in before if renames.get(k, k) != k)
    print(f"{len(before)} configs before, {len(after)} after ({moved_count} moved): "
          f"{len(problems)} difference{'s' if len(problems) != 1 else ''}")
    return 1 if problems else 0


def settings_lines(text: str) -> list[str]:
    """The lines of a config that set something: comment-only and blank lines left out."""
    return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


#: how ``similar`` reads a file: all its lines, or its settings only (what a run sees)
VIEWS = {"lines": str.splitlines, "settings": settings_lines}


def near_identical(files: list[Path], threshold: float, view: str) -> list[tuple[float, Path, Path]]:
    """``(ratio, a, b)`` of every pair of ``files`` whose ``view`` (:data:`VIEWS`) is at least
    ``threshold`` identical: ``difflib.SequenceMatcher`` over the lines, matched lines / mean length."""
    seqs = {p: VIEWS[view](p.read_text(encoding="utf-8")) for p in files}
    out = []
    for a, b in itertools.combinations(files, 2):
        ratio = difflib.SequenceMatcher(None, seqs[a], seqs[b], autojunk=False).ratio()
        if ratio >= threshold:
            out.append((ratio, a, b))
    return out


def similar(threshold: float, root: Path = CONFIGS, show: bool = True) -> int:
    files = all_yaml(root)
    total = sum(len(p.read_text(encoding="utf-8").splitlines()) for p in files)
    print(f"{len(files)} config files ({len(files) - len(shipped_configs(root))} of them bases), {total} lines")
    for view in VIEWS:
        pairs = near_identical(files, threshold, view)
        if show:
            for ratio, a, b in sorted(pairs, key=lambda t: (-t[0], t[1], t[2])):
                print(f"  {view:8} {ratio:.3f}  {a.relative_to(REPO)}  {b.relative_to(REPO)}")
        with_sibling = {p for _, a, b in pairs for p in (a, b)}
        print(f"{view}: {len(pairs)} pairs at least {threshold:.0%} identical; "
              f"{len(with_sibling)} of {len(files)} files have such a sibling")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("dump", help="write every shipped config's resolved form under OUT")
    p.add_argument("out", type=Path)
    p = sub.add_parser("compare", help="compare two dumps (old paths mapped through MOVED.txt)")
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--moved", type=Path, default=CONFIGS / "MOVED.txt")
    p = sub.add_parser("similar", help="count the pairs of configs at least --threshold identical")
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--quiet", action="store_true", help="print the counts only, not the pairs")
    args = parser.parse_args(argv)
    if args.command == "dump":
        return dump(args.out)
    if args.command == "compare":
        return compare(args.old, args.new, args.moved)
    return similar(args.threshold, show=not args.quiet)


if __name__ == "__main__":
    sys.exit(main())
