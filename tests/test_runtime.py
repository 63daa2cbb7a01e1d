"""Thread budget and determinism: set once per process, reproducible single-KG runs."""

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lightning_fedkg.config import DataConfig, ExperimentConfig, ModelConfig, TrainerConfig
from lightning_fedkg.runtime import (
    BUNDLED_ENTITIES,
    SMALL_TABLE_ELEMENTS,
    auto_threads,
    config_table_elements,
    effective_threads,
)

REPO = Path(__file__).resolve().parents[1]
KGE_CONFIG = str(REPO / "configs" / "kge" / "umls_transe.yaml")


def python(code: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter: these settings are global to a process. The
    interpreter gets no ``OMP_NUM_THREADS`` (it would decide the thread count) unless
    ``env`` sets it."""
    env = {**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}, **(env or {}),
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=300)


def test_effective_threads():
    assert effective_threads(TrainerConfig()) is None
    assert effective_threads(TrainerConfig(threads=3)) == 3
    assert effective_threads(TrainerConfig(deterministic=True)) == 1
    assert effective_threads(TrainerConfig(deterministic=True, threads=2)) == 2


UMLS_DIM64 = 135 * 64  # the UMLS quick starts' entity table
FB15K237_DIM256 = 14_541 * 256  # FB15k-237-Fed3's union table at FedE's dim


@pytest.mark.parametrize(
    "cpus, load, elements, expected",
    [
        # Small tables: one thread, however idle the machine.
        (2, 0.0, UMLS_DIM64, 1),
        (2, 0.0, 135 * 256, 1),
        (16, 0.0, UMLS_DIM64, 1),
        (2, 0.0, 49_999, 1),
        # Large or unknown tables: the free cores, floor(cpus - load + 0.5).
        (2, 0.0, 50_000, 2),
        (2, 0.0, 135 * 512, 2),
        (2, 1.0, 135 * 512, 1),
        (2, 0.0, FB15K237_DIM256, 2),
        (2, 0.0, None, 2),
        (2, 0.49, None, 2),
        (2, 0.5, None, 2),
        (2, 0.51, None, 1),
        (2, 1.0, FB15K237_DIM256, 1),
        (2, 1.8, None, 1),
        (2, 9.0, None, 1),  # never fewer than one
        (8, 2.2, None, 6),
        (8, 2.6, FB15K237_DIM256, 5),
        (8, -0.3, None, 8),  # never more than the cores
        (16, None, None, 16),  # no load average (Windows): an idle machine
        (1, 0.0, None, 1),
        (1, 0.0, FB15K237_DIM256, 1),
    ],
)
def test_auto_threads(cpus, load, elements, expected):
    assert SMALL_TABLE_ELEMENTS == 50_000  # the cases above are written for this threshold
    assert auto_threads(cpus, load, elements) == expected


def test_config_table_elements():
    def cfg(name, model="transe", dim=64):
        return ExperimentConfig(data=DataConfig(name=name), model=ModelConfig(name=model, dim=dim))

    assert config_table_elements(cfg("umls")) == UMLS_DIM64
    assert config_table_elements(cfg("UMLS", dim=512)) == 135 * 512
    assert config_table_elements(cfg("nations", model="complex", dim=100)) == 14 * 200  # [re || im]
    assert config_table_elements(cfg("kinship", model="rotate", dim=8)) == 104 * 16
    # A folder's size is known only once it is loaded.
    assert config_table_elements(cfg("../shared/data/FB15k-237-Fed3")) is None


def test_bundled_entity_counts_match_the_data():
    from lightning_fedkg.data import BUNDLED_DATASETS, load_kg

    assert set(BUNDLED_ENTITIES) == set(BUNDLED_DATASETS)
    for name, entities in BUNDLED_ENTITIES.items():
        assert load_kg(name).num_entities == entities


def test_runtime_imports_neither_torch_nor_lightning():
    proc = python(
        """
        import sys
        import lightning_fedkg.runtime
        print(sorted(m for m in ("torch", "lightning", "pytorch_lightning") if m in sys.modules))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


# A fresh process with a 2-core machine whose load average the test decides (argv[1]).
PATCHED = """
import logging, sys, torch
import lightning_fedkg.runtime as runtime
from lightning_fedkg.config import TrainerConfig
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
runtime.machine_cpus = lambda: 2
runtime.machine_load = lambda: float(sys.argv[1])
"""


def patched(code: str, load: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``code`` after :data:`PATCHED` in a fresh interpreter: 2 cores, load average ``load``."""
    return python(PATCHED + textwrap.dedent(code), load, env=env)


@pytest.mark.slow
def test_unset_threads_follow_the_policy_and_log_why():
    proc = patched(
        """
        print(runtime.configure_torch(TrainerConfig(), table_elements=8640), torch.get_num_interop_threads())
        # Decided once per process: a later call, whatever it is told, keeps the choice and logs nothing.
        print(runtime.configure_torch(TrainerConfig(), table_elements=10**9))
        print(runtime.configure_torch(TrainerConfig()))
        """,
        "1.8",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "1", "1", "1"]
    assert proc.stderr.strip().splitlines() == [
        "INFO lightning_fedkg.runtime: threads: 1 (2 cores, load 1.80; small tables, 8,640 elements)"]

    proc = patched("print(runtime.configure_torch(TrainerConfig(), table_elements=10**7))", "0.2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2"]
    assert proc.stderr.strip().splitlines() == [
        "INFO lightning_fedkg.runtime: threads: 2 (2 cores, load 0.20; 10,000,000 table elements; 2 free cores)"]

    proc = patched("print(runtime.configure_torch(TrainerConfig()))", "1.2")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1"]
    assert proc.stderr.strip().splitlines() == [
        "INFO lightning_fedkg.runtime: threads: 1 (2 cores, load 1.20; table size unknown; 1 free core)"]


@pytest.mark.slow
def test_explicit_threads_win():
    proc = patched(
        """
        # Small tables on an idle machine would get 1; trainer.threads says 2.
        print(runtime.configure_torch(TrainerConfig(threads=2), table_elements=8640))
        """,
        "0.0",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2"]
    assert proc.stderr.strip().splitlines() == ["INFO lightning_fedkg.runtime: threads: 2 (trainer.threads)"]

    proc = patched(
        """
        print(runtime.configure_torch(TrainerConfig(), table_elements=8640))
        # After the automatic choice, an explicit count still applies.
        print(runtime.configure_torch(TrainerConfig(threads=2)))
        print(runtime.configure_torch(TrainerConfig(deterministic=True)))
        print(runtime.configure_torch(TrainerConfig(deterministic=True, threads=2)))
        print(runtime.configure_torch(TrainerConfig()))  # keeps the last count set
        """,
        "0.0",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "2", "1", "2", "2"]
    assert [line.split(": ", 1)[1] for line in proc.stderr.strip().splitlines()] == [
        "threads: 1 (2 cores, load 0.00; small tables, 8,640 elements)",
        "threads: 2 (trainer.threads)",
        "threads: 1 (trainer.deterministic)",
        "threads: 2 (trainer.threads)",
    ]


@pytest.mark.slow
def test_omp_num_threads_keeps_torchs_count():
    # Large tables on an idle 2-core machine would get 2 threads; the environment says 1.
    proc = patched("print(runtime.configure_torch(TrainerConfig(), table_elements=10**9))", "0.0",
                   env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1"]
    assert proc.stderr.strip().splitlines() == ["INFO lightning_fedkg.runtime: threads: 1 (OMP_NUM_THREADS=1)"]


@pytest.mark.slow
def test_configure_torch_sets_pools_once_and_tolerates_a_second_call():
    proc = python(
        """
        import torch
        import lightning_fedkg.runtime as runtime
        from lightning_fedkg.config import TrainerConfig
        from lightning_fedkg.runtime import configure_torch
        runtime.machine_cpus, runtime.machine_load = (lambda: 2), (lambda: 0.0)
        assert configure_torch(TrainerConfig()) == 2  # table size unknown, both cores free
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
               "train.eval_every=1", "train.num_negatives=16", *sys.argv[3:]])
print("THREADS", torch.get_num_threads(), torch.are_deterministic_algorithms_enabled())
sys.exit(status)
"""


@pytest.mark.slow
def test_deterministic_single_kg_runs_are_bit_identical(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    outputs = []
    with ThreadPoolExecutor(2) as pool:  # two processes side by side: one thread each
        procs = list(pool.map(lambda name: python(FIT, KGE_CONFIG, str(tmp_path / name), "trainer.deterministic=true"),
                              ("a", "b")))
    for name, proc in zip(("a", "b"), procs):
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "THREADS 1 True" in proc.stdout
        assert "INFO lightning_fedkg.runtime: threads: 1 (trainer.deterministic)\n" in proc.stderr
        outputs.append((tmp_path / name / "metrics.json").read_bytes())
    assert outputs[0] == outputs[1]
    assert b'"mrr"' in outputs[0]


@pytest.mark.slow
def test_fit_on_a_bundled_kg_picks_one_thread(tmp_path):
    """``fedkg fit`` passes the config's size estimate: UMLS at dim 16 is 2,160 elements."""
    proc = python(FIT, KGE_CONFIG, str(tmp_path / "run"), "train.max_epochs=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "THREADS 1 False" in proc.stdout
    assert re.search(r"^INFO lightning_fedkg\.runtime: threads: 1 \(\d+ cores?, load (\d+\.\d\d|unknown); "
                     r"small tables, 2,160 elements\)$", proc.stderr, re.MULTILINE), proc.stderr[-3000:]
