"""The filter core stands alone: importing it loads neither proton nor pyspark."""

from __future__ import annotations

import subprocess
import sys


def test_filter_core_imports_neither_proton_nor_pyspark() -> None:
    probe = (
        "import sys\n"
        "import broker_filter.filters, broker_filter.filters.reference, broker_filter.amqp.message, broker_filter.amqp.types\n"
        "broker_filter.filters.compile_selector(\"a = 1\").evaluate(broker_filter.amqp.message.Message())\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('proton', '_proton', 'cproton', 'pyspark', 'py4j'))\n"
        "print(','.join(loaded))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "", f"filter core loaded: {out.stdout.strip()}"


def test_the_probe_would_see_proton() -> None:
    probe = "import sys, proton\nprint(any(m.split('.')[0] == 'proton' for m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "True"
