"""scripts/test_counts.py reads pytest's collection summary, in both of its forms."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "test_counts.py"
spec = importlib.util.spec_from_file_location("test_counts", SCRIPT)
test_counts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(test_counts)


def test_the_summary_line_is_read():
    assert test_counts.parse("a.py::t\n\n2059/2072 tests collected (13 deselected) in 30.61s\n") == {
        "collected": 2059, "deselected": 13, "total": 2072}
    assert test_counts.parse("a.py::t\n\n1 test collected in 0.01s\n") == {"collected": 1, "deselected": 0, "total": 1}


def test_output_without_a_summary_is_an_error():
    with pytest.raises(ValueError, match="tests collected"):
        test_counts.parse("ERROR collecting tests/test_x.py\n")
