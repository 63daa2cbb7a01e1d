"""The built wheel ships the embedded default datasets and the console script."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from lightning_fedkg.data import BUNDLED_DATASETS

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_contains_bundled_datasets(tmp_path):
    pytest.importorskip("setuptools")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = tmp_path.glob("lightning_fedkg-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for dataset in BUNDLED_DATASETS:
        for split in ("train", "valid", "test"):
            assert f"lightning_fedkg/data/bundled/{dataset}/{split}.txt" in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "fedkg = lightning_fedkg.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
