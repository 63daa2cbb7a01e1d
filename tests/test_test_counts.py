"""scripts/tools/test_counts.py reads pytest's collection summary, in both of its forms."""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "tools" / "test_counts.py"
spec = importlib.util.spec_from_file_location("test_counts", SCRIPT)
test_counts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(test_counts)


def test_the_summary_line_is_read():
    docs = "docs checks (tests/test_docs_*.py)"
    output = "tests/test_docs_pages.py::t[a]\ntests/test_docs_pages.py::t[b]\ntests/test_x.py::t\n\n" \
             "3/16 tests collected (13 deselected) in 30.61s\n"
    assert test_counts.parse(output) == {"collected": 3, "deselected": 13, "total": 16, "groups": {docs: 2}}
    assert test_counts.parse("tests/test_x.py::t\n\n1 test collected in 0.01s\n") == {
        "collected": 1, "deselected": 0, "total": 1, "groups": {docs: 0}}


def test_output_without_a_summary_is_an_error():
    with pytest.raises(ValueError, match="tests collected"):
        test_counts.parse("ERROR collecting tests/test_x.py\n")


def test_the_results_page_quotes_the_counts_of_the_json():
    """docs/results/tests.md quotes docs/results/tests/counts.json: a new JSON needs the page's
    numbers updated with it."""
    if not test_counts.OUT.is_file():
        pytest.skip(f"{test_counts.OUT.name} not written yet: python scripts/tools/test_counts.py")
    page = (SCRIPT.parents[2] / "docs" / "results" / "tests.md").read_text()
    counts = json.loads(test_counts.OUT.read_text())
    assert counts["commit"] in page
    for command in counts["commands"].values():
        assert f"{command['collected']:,}" in page, command["readme_command"]
