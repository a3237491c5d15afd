"""Fixtures of the operations tests (the test PKI is in tests/conftest.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # opskit: shared helpers (import mode is importlib)
