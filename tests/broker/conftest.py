import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # brokerkit: shared helpers (import mode is importlib)

from broker_filter.broker import Broker, BrokerConfig  # noqa: E402


@pytest.fixture
def broker() -> Broker:
    return Broker(BrokerConfig())
