"""Shared test helpers: where the benchmark data lives, a one-thread fixture, the small
UMLS federation most tests configure, and trained runs that several test files share."""

import importlib.util
import json
import os
from contextlib import contextmanager
from pathlib import Path

import lightning  # noqa: F401  (see below)
import pytest
import torch

from lightning_fedkg.config import ExperimentConfig, load_config

# Lightning gives its loggers a handler bound to sys.stderr at its first import. Imported here,
# that is the session's stream; imported first inside a test that captures output (capsys),
# it would be that test's stream, closed when the test ends, and every later Lightning log
# line would fail with "I/O operation on closed file".

#: The project's benchmark data (the ``shared/`` folder beside the repository checkout).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="shared/data not present")

#: The small federation: the bundled UMLS KG split into 3 clients, TransE, seed 0, on the CPU
#: without a progress bar. Tests add what they are about (dim, rounds, sampling, ...).
SMALL_FEDERATION = {
    "seed": 0,
    "data.name": "umls",
    "data.num_clients": 3,
    "model.name": "transe",
    "trainer.accelerator": "cpu",
    "trainer.progress_bar": False,
}


@pytest.fixture(scope="session")
def load_script():
    """Import a script under ``scripts/`` as a module: ``load_script("benchmarks/bench_scale.py")``."""

    def load(relative: str):
        path = Path(__file__).resolve().parents[1] / "scripts" / relative
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


def make_small_config(strategy: str = "fede", *dotlist: str, **overrides) -> ExperimentConfig:
    """A validated config of the small federation under ``strategy``, through
    :func:`load_config` and dotlist overrides as a command line gives them.

    ``dotlist`` items (``"model.dim=8"``) come last and win; ``overrides`` are keys with
    ``.`` or ``__`` (``federated__rounds=2``), booleans written as YAML's ``true``/``false``.
    """
    settings = {**SMALL_FEDERATION, "federated.strategy": strategy}
    settings.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(None, [f"{k}={_yaml(v)}" for k, v in settings.items()] + list(dotlist))


def _yaml(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@pytest.fixture(scope="session")
def small_config():
    """The factory :func:`make_small_config` (session-scoped: module fixtures may use it)."""
    return make_small_config


@contextmanager
def single_thread():
    """One intra-op thread inside the block, the previous count restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture
def one_thread():
    """Real-data loads are many mid-sized tensor ops; on an oversubscribed CPU (tests
    running beside other jobs) intra-op threads mostly wait on each other."""
    with single_thread():
        yield


#: The tiny setting on top of the small federation: TransE dim 8, 8 shared negatives, two
#: rounds of one local epoch, evaluated every round. Seconds per run.
TINY = {
    "model.dim": 8,
    "train.num_negatives": 8,
    "train.negative_mode": "shared",
    "train.lr": 0.05,
    "federated.local_epochs": 1,
    "federated.rounds": 2,
    "federated.eval_every": 1,
}


def make_tiny_config(strategy: str = "fede", *dotlist: str, **overrides) -> ExperimentConfig:
    """:func:`make_small_config` with :data:`TINY` under ``dotlist`` and ``overrides``."""
    return make_small_config(strategy, *dotlist, **{**TINY, **overrides})


def shared_run(tmp_path_factory, name: str, cfg: ExperimentConfig) -> tuple[dict, Path]:
    """``(metrics, run_dir)`` of ``cfg`` trained on one thread once per test session.

    Under pytest-xdist the workers share one folder (the session's temporary root) and a
    file lock: the first worker that needs the run trains it, the others wait and read it,
    which costs no more than training it themselves. The metrics are read back from the
    run's ``metrics.json`` (what ``fit`` returned, written as JSON) by every caller alike.
    """
    from filelock import FileLock

    from lightning_fedkg.run import fit

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # this session's folder, above the workers' own
    run_dir = root / "shared_runs" / name
    run_dir.parent.mkdir(exist_ok=True)
    with FileLock(f"{run_dir}.lock"):
        if not (run_dir / "metrics.json").is_file():
            with single_thread():
                fit(cfg, run_dir)
    return json.loads((run_dir / "metrics.json").read_text()), run_dir


@pytest.fixture(scope="session")
def tiny_fede_run(tmp_path_factory):
    """``(metrics, run_dir)`` of the tiny FedE run, for the files that compare a variant of
    FedE against it. Read it, never write to it: copy the folder first to resume or change it."""
    return shared_run(tmp_path_factory, "tiny_fede", make_tiny_config("fede"))


#: FedLU learning on UMLS: dim 32, six rounds, distillation every round. test_fedlu checks
#: that it learns; test_unlearning unlearns from it.
FEDLU_UMLS = ["data.name=umls", "model.dim=32", "train.lr=0.02", "train.batch_size=128", "train.num_negatives=32",
              "train.negative_mode=shared", "train.loss=uniform", "trainer.accelerator=cpu",
              "trainer.progress_bar=false", "federated.local_epochs=1", "federated.eval_every=1",
              "federated.rounds=6", "federated.strategy=fedlu", "federated.fedlu.schedule=always"]


@pytest.fixture(scope="session")
def fedlu_umls_run(tmp_path_factory):
    """``(metrics, run_dir)`` of :data:`FEDLU_UMLS`. Read it, never write to it: copy the
    folder first to resume or change it."""
    return shared_run(tmp_path_factory, "fedlu_umls", load_config(None, FEDLU_UMLS))
