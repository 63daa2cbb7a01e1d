"""Shared test helpers: where the benchmark data lives, a one-thread fixture, the small
UMLS federation most tests configure, and trained runs that several test files share."""

import shutil
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


def make_small_config(strategy: str = "fede", **overrides) -> ExperimentConfig:
    """A validated config of the small federation under ``strategy``, through
    :func:`load_config` and dotlist overrides as a command line gives them.

    ``overrides`` are keys with ``.`` or ``__`` (``federated__rounds=2``); booleans are
    written as YAML's ``true``/``false``. A ``None`` value leaves a key of the base out.
    """
    settings = {**SMALL_FEDERATION, "federated.strategy": strategy}
    settings.update({k.replace("__", "."): v for k, v in overrides.items()})
    return load_config(None, [f"{k}={_yaml(v)}" for k, v in settings.items() if v is not None])


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
