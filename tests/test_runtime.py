"""Thread budget and determinism: set once per process, reproducible single-KG runs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from lightning_fedkg.config import TrainerConfig
from lightning_fedkg.runtime import effective_threads

REPO = Path(__file__).resolve().parents[1]
KGE_CONFIG = str(REPO / "configs" / "kge" / "umls_transe.yaml")


def python(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: these settings are global to a process."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_effective_threads():
    assert effective_threads(TrainerConfig()) is None
    assert effective_threads(TrainerConfig(threads=3)) == 3
    assert effective_threads(TrainerConfig(deterministic=True)) == 1
    assert effective_threads(TrainerConfig(deterministic=True, threads=2)) == 2


def test_configure_torch_sets_pools_once_and_tolerates_a_second_call():
    proc = python(
        """
        import torch
        from lightning_fedkg.config import TrainerConfig
        from lightning_fedkg.runtime import configure_torch
        default = torch.get_num_threads()
        assert configure_torch(TrainerConfig()) == default
        assert configure_torch(TrainerConfig(threads=3)) == 3
        torch.ones(1000, 1000).sum()  # the pools are running now
        # A second run in this process: the inter-op pool cannot change again, no error.
        assert configure_torch(TrainerConfig(threads=1, deterministic=True)) == 1
        print(torch.get_num_interop_threads(), torch.are_deterministic_algorithms_enabled())
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "True"]


FIT = """
import sys, torch
from lightning_fedkg.cli import main
status = main(["fit", "-c", sys.argv[1], "--out", sys.argv[2], "model.dim=16", "train.max_epochs=2",
               "train.eval_every=1", "train.num_negatives=16", "trainer.deterministic=true"])
print("THREADS", torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
sys.exit(status)
"""


def test_deterministic_single_kg_runs_are_bit_identical(tmp_path):
    outputs = []
    for name in ("a", "b"):
        proc = python(FIT, KGE_CONFIG, str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "THREADS 1 True" in proc.stdout
        outputs.append((tmp_path / name / "metrics.json").read_bytes())
    assert outputs[0] == outputs[1]
    assert b'"mrr"' in outputs[0]
