import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # embedkit: shared helpers (import mode is importlib)

from embedkit import Daemon  # noqa: E402


@pytest.fixture(scope="module")
def daemon():
    """One `broker-filter serve` with the embedded broker (no upstream), for a test module."""
    d = Daemon()
    yield d
    d.stop()
    assert "Traceback" not in d.log(), d.log()
