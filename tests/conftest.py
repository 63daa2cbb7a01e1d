"""Shared test helpers: where the benchmark data lives, and a one-thread fixture."""

from pathlib import Path

import lightning  # noqa: F401  (see below)
import pytest
import torch

# Lightning gives its loggers a handler bound to sys.stderr at its first import. Imported here,
# that is the session's stream; imported first inside a test that captures output (capsys),
# it would be that test's stream, closed when the test ends, and every later Lightning log
# line would fail with "I/O operation on closed file".

#: The project's benchmark data (the ``shared/`` folder beside the repository checkout).
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
needs_shared = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="shared/data not present")


@pytest.fixture
def one_thread():
    """Real-data loads are many mid-sized tensor ops; on an oversubscribed CPU (tests
    running beside other jobs) intra-op threads mostly wait on each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
