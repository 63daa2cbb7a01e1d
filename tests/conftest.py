"""Shared test helpers: where the benchmark data lives, and a one-thread fixture."""

from pathlib import Path

import pytest
import torch

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
