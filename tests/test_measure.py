"""lightning_fedkg.measure, the scripts' shared helpers: the checkout a script belongs to,
git's id of a file, and a results file."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from lightning_fedkg import measure

REPO = Path(__file__).resolve().parents[1]


def test_repo_root_is_the_checkout_at_any_depth_of_scripts():
    assert measure.repo_root() == REPO
    assert measure.repo_root(REPO / "scripts" / "reproduce.py") == REPO
    assert measure.repo_root(REPO / "scripts" / "benchmarks" / "bench_fede.py") == REPO


def test_repo_root_of_an_archived_tree_is_that_tree(tmp_path):
    """``git archive <commit> lightning_fedkg scripts configs`` unpacked inside a checkout
    (scripts/gpu/gpu_ab.sh's versions): the tree, not the checkout around it."""
    tree = tmp_path / "v_old"
    (tree / "lightning_fedkg").mkdir(parents=True)
    (tree / "lightning_fedkg" / "__init__.py").write_text("")
    (tree / "scripts" / "benchmarks").mkdir(parents=True)
    assert measure.repo_root(tree / "scripts" / "benchmarks" / "bench_fedlu.py") == tree
    with pytest.raises(FileNotFoundError):
        measure.repo_root(tmp_path / "elsewhere.py")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_blob_id_is_gits(tmp_path):
    path = tmp_path / "f.py"
    path.write_bytes(b"print('x')\n")
    expected = subprocess.run(["git", "hash-object", str(path)], capture_output=True, text=True).stdout.strip()
    assert measure.git_blob_id(path) == expected


def test_write_json_makes_the_folder_and_ends_in_a_newline(tmp_path):
    path = measure.write_json(tmp_path / "a" / "b.json", {"x": 1.5}, indent=2)
    assert path.read_text() == '{\n  "x": 1.5\n}\n' and json.loads(path.read_text()) == {"x": 1.5}


def test_code_version_outside_a_clone_has_no_commit(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("needs git")
    assert measure.code_version(tmp_path) == {"commit": None, "dirty": False}
