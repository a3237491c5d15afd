"""The daemon imports no optional dependency unless its feature is on (checked in fresh interpreters,
in this environment, where every extra is installed)."""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = ("pyarrow", "pyspark", "tqdm")

PROBE = """
import json, sys
{setup}
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}} & set({optional!r}))))
"""


def loaded_after(setup: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup, optional=OPTIONAL)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_importing_the_daemon_loads_neither_pyarrow_nor_pyspark():
    assert loaded_after("import broker_filter.app, broker_filter.commands.serve") == []


def test_building_the_daemon_without_the_journal_loads_no_optional_dependency():
    setup = ("from broker_filter.app import App\nfrom broker_filter.config import load\n"
             "App(load(None, {'BROKER_FILTER_LISTENER_PORT': '0'}))")
    assert loaded_after(setup) == []


def test_the_journal_loads_pyarrow_when_it_is_on(tmp_path):
    """The probe above sees an optional import when one happens."""
    setup = ("from broker_filter.app import App\nfrom broker_filter.config import load\n"
             f"app = App(load(None, {{'BROKER_FILTER_JOURNAL_ENABLED': 'true', "
             f"'BROKER_FILTER_JOURNAL_DIRECTORY': {str(tmp_path)!r}}}))\napp.journal.close(timeout=5)")
    assert "pyarrow" in loaded_after(setup)
