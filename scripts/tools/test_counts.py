#!/usr/bin/env python
"""Count the tests the README's commands collect, and write them to docs/results/tests/counts.json.

    python scripts/tools/test_counts.py            # collect (about 30 s, no test runs) and write the JSON
    python scripts/tools/test_counts.py --print    # collect and print, write nothing

Each command is ``pytest --collect-only -q`` with the markers of one README command
(:data:`COMMANDS`): pyproject.toml's own ``-m 'not deployment and not drift'`` for the whole
suite, and ``not slow`` added for the fast loop. The JSON holds the commit, the date, the
Python and torch versions, and per command what pytest's summary line said: the tests
collected (those the markers select) and the deselected ones. Collection runs no test, so
passed, skipped and failed counts, and times, come from a full run (docs/results/tests.md).
Run it on a clean checkout: the docs tests take one case per page, script and config.
"""

from __future__ import annotations

import argparse
import datetime
import fnmatch
import importlib.util
import json
import platform
import re
import shlex
import subprocess
import sys

from lightning_fedkg import measure

REPO = measure.repo_root(__file__)
OUT = REPO / "docs" / "results" / "tests" / "counts.json"

#: name: (the README's command it stands for, the markers it collects with)
COMMANDS = {
    "whole suite": ("python -m pytest -q -n 2 --dist loadfile", "not deployment and not drift"),
    "fast loop": ('python -m pytest -q -m "not slow" -n 2', "not slow and not deployment and not drift"),
}
OPTIONAL = ("cryptography", "ray", "flwr")
# "2040/2100 tests collected (60 deselected) in 31.2s" or "2040 tests collected in 31.2s"
SUMMARY = re.compile(r"(\d+)(?:/(\d+))? tests? collected(?: \((\d+) deselected\))?")


#: groups of test files whose collected tests the JSON counts apart: name -> file-name pattern
GROUPS = {"docs checks (tests/test_docs_*.py)": "tests/test_docs_*.py"}


def parse(output: str) -> dict:
    """The counts of ``output`` (``pytest -q --collect-only``): its last summary line, and the
    node ids (``tests/<file>.py::name``) of each of :data:`GROUPS`."""
    found = SUMMARY.findall(output)
    if not found:
        raise ValueError("no 'tests collected' line in pytest's output:\n" + output[-2000:])
    selected, total, deselected = found[-1]
    files = re.findall(r"^(tests/[^:\s]+\.py)::", output, flags=re.M)
    groups = {name: sum(fnmatch.fnmatch(f, pattern) for f in files) for name, pattern in GROUPS.items()}
    return {"collected": int(selected), "deselected": int(deselected or 0), "total": int(total or selected),
            "groups": groups}


def collect(markers: str) -> tuple[list[str], dict]:
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", markers]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return argv, parse(done.stdout)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--print", action="store_true", help="print the counts, write no file")
    args = parser.parse_args(argv)
    import torch

    record = {
        "commit": measure.git("rev-parse", "--short", "HEAD", repo=REPO, check=True),
        # the docs tests take one case per page, script and config, so any file can move the counts
        "uncommitted_changes": bool(measure.git("status", "--porcelain", "--", ".", f":!{OUT.relative_to(REPO)}",
                                                repo=REPO, check=True)),
        "date": datetime.date.today().isoformat(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        # a test module that imports one of these with pytest.importorskip is not collected without it
        "importable": {name: importlib.util.find_spec(name) is not None for name in OPTIONAL},
        "note": "collected by `pytest --collect-only` (no test runs): tests that skip at run time "
                "(Ray, Flower, CUDA missing) are counted here",
        "commands": {},
    }
    for name, (readme, markers) in COMMANDS.items():
        command, counts = collect(markers)
        record["commands"][name] = {"readme_command": readme, "markers": markers,
                                    "command": shlex.join(["python", *command[1:]]), **counts}
    text = json.dumps(record, indent=2) + "\n"
    if args.print:
        print(text, end="")
    else:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
