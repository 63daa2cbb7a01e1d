"""The README's Python API example runs as printed (with fewer epochs)."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_python_api_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    (example,) = [b for b in blocks if "KGEModule(" in b]
    assert "max_epochs=20" in example
    code = example.replace("max_epochs=20", "max_epochs=2").replace(
        'precision="32-true")', 'precision="32-true", logger=False, enable_checkpointing=False, enable_progress_bar=False)'
    )
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    metrics = namespace["module"].last_metrics["test"]
    assert set(metrics) >= {"mrr", "hits@10"} and 0.0 < metrics["mrr"] <= 1.0
    assert "mrr" in capsys.readouterr().out


def test_ci_runs_the_readmes_test_command_as_written():
    """A user's first test run is the README's command: CI must run that exact line, so a
    test that needs an extra cannot pass in CI and fail on a fresh clone."""
    command = re.search(r"Run the whole test suite:\n\n```bash\n(.*?)\n```", README.read_text()).group(1)
    ci = (README.parent / ".ci" / "run").read_text().splitlines()
    assert command.startswith("pip install torch==") and "pytest" in command
    assert command in ci, command
