"""The package's floors and the one-way arrows between them, checked two ways.

A static scan reads every `import` statement of the package (those inside functions too) and lists
each one that points where its floor may not look, ours or a third-party library.  A probe imports a
floor's modules in a fresh interpreter and lists what that loaded: nothing of ours from a floor it may
not reach, none of the optional or I/O libraries it may not use, and no logging configured.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "broker_filter"

# floor -> the floors of ours it may import (besides itself and the package root's __version__).
# `commands → app → proxy → {filters, broker, engine, amqp, config, security, …}`,
# `spark → {filters, archive, amqp}`, `filters → amqp`, `amqp → nothing`.
OURS: dict[str, set[str]] = {
    "amqp": set(),
    "filters": {"amqp"},
    "broker": {"filters", "amqp"},
    "archive": {"filters", "amqp"},
    "security": {"amqp"},
    "authorization": set(),  # the permission model: pure, stdlib only
    "config": {"security", "authorization", "filters", "amqp"},
    "logs": {"security"},
    "metrics": set(),
    "engine": {"security", "amqp"},
    "proxy": {"engine", "broker", "filters", "config", "security", "authorization", "logs", "metrics", "amqp"},
    "spark": {"archive", "filters", "amqp"},
    "workers": set(),  # the supervisor of `listener.workers`: processes and signals only
    "app": {"workers", "proxy", "engine", "archive", "broker", "filters", "config", "security", "authorization",
            "logs", "metrics", "amqp"},
    "commands": {"app", "workers", "spark", "archive", "filters", "config", "security", "authorization", "logs",
                 "amqp"},
    "cli": set(),  # finds its commands by name (importlib), imports none
    "__main__": {"cli"},
}

# third-party library -> the floors that may import it (every other import must be the stdlib's).
THIRD_PARTY: dict[str, set[str]] = {
    "lark": {"filters"},
    "sortedcontainers": {"broker"},
    "prometheus_client": {"metrics"},
    "proton": {"spark"},  # the daemon's path (engine, proxy, app) uses none of proton's wrappers or events
    "cproton": {"engine"},  # (python-qpid-proton's C binding module: the engine's frame tracer hook)
    "cproton_ffi": {"engine"},
    "pyarrow": {"archive"},
    "pyspark": {"spark"},
    "tqdm": {"commands"},
}
PROBED = ("proton", "_proton", "cproton", "cproton_ffi", "pyarrow", "pyspark", "py4j", "tqdm", "prometheus_client",
          "lark", "sortedcontainers")


def reach(floor: str) -> set[str]:
    """The floors `floor` may load, directly or through the floors it imports."""
    seen, todo = {floor}, [floor]
    while todo:
        for other in OURS[todo.pop()]:
            if other not in seen:
                seen.add(other)
                todo.append(other)
    return seen


def floor_of(module: str) -> str:
    """`broker_filter.proxy.server` -> "proxy"; the package root -> ""."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def module_of(path: Path) -> tuple[str, bool]:
    parts = ("broker_filter",) + path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def forbidden_imports(module: str, is_package: bool, source: str) -> list[str]:
    """Each import of `module` (given as source text) that its floor may not make, as
    "module:line imports target (floor -> floor)"."""
    floor = floor_of(module)
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            resolved = ".".join(base + ([node.module] if node.module else []))
            # `from .. import amqp` names a floor; `from ..amqp import types` is in the floor it names
            targets = [f"{resolved}.{a.name}" for a in node.names] if resolved == "broker_filter" else [resolved]
        elif isinstance(node, ast.ImportFrom):
            targets = [node.module or ""]
            if node.module == "broker_filter":
                targets = [f"broker_filter.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            top = target.split(".")[0]
            if top == "broker_filter":
                other = floor_of(target)
                if other in ("", "__version__", floor) or other in OURS[floor]:
                    continue
                why = f"{floor} -> {other}"
            elif top in sys.stdlib_module_names or top == "__future__":
                continue
            elif floor in THIRD_PARTY.get(top, ()):
                continue
            else:
                why = f"{floor} may not use {top}"
            found.append(f"{module}:{node.lineno} imports {target} ({why})")
    return found


def test_every_import_points_down_a_floor() -> None:
    found = []
    floors = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        module, is_package = module_of(path)
        floors.add(floor_of(module))
        found += forbidden_imports(module, is_package, path.read_text(encoding="utf-8"))
    assert found == []
    assert floors - {""} == set(OURS), "a floor of the package is missing from OURS (or OURS names one that is gone)"


@pytest.mark.parametrize(
    "module, is_package, source, expected",
    [
        ("broker_filter.engine.loop", False, "from ..proxy.listener import Identity\n",
         ["broker_filter.engine.loop:1 imports broker_filter.proxy.listener (engine -> proxy)"]),
        ("broker_filter.amqp.types", False, "def f():\n    from .. import filters\n",
         ["broker_filter.amqp.types:2 imports broker_filter.filters (amqp -> filters)"]),
        ("broker_filter.filters", True, "import proton\nfrom .base import Filter\n",
         ["broker_filter.filters:1 imports proton (filters may not use proton)"]),
        ("broker_filter.app", False, "import broker_filter.spark.session\nimport pyarrow.parquet\n",
         ["broker_filter.app:1 imports broker_filter.spark.session (app -> spark)",
          "broker_filter.app:2 imports pyarrow.parquet (app may not use pyarrow)"]),
        ("broker_filter.proxy.server", False, "from ..amqp import types\nfrom broker_filter import __version__\n", []),
    ],
)
def test_the_scan_names_each_edge_it_forbids(module, is_package, source, expected) -> None:
    assert forbidden_imports(module, is_package, source) == expected


PROBE = """
import importlib, json, logging, pkgutil, sys
import broker_filter
for name in {names!r}:
    module = importlib.import_module(name)
    for sub in pkgutil.walk_packages(getattr(module, "__path__", []), name + "."):
        importlib.import_module(sub.name)
{then}
print(json.dumps({{
    "ours": sorted({{m.split(".")[1] for m in sys.modules if m.startswith("broker_filter.")}}),
    "libraries": sorted({{m.split(".")[0] for m in sys.modules}} & set({probed!r})),
    "logging": bool(logging.getLogger().handlers),
}}))
"""

PROTON = {"proton", "_proton", "cproton", "cproton_ffi"}
MESSAGE = "broker_filter.amqp.message.Message(application_properties={'a': 1})"
EVALUATE = f"assert broker_filter.filters.compile_selector('a = 1').evaluate({MESSAGE})"
# floor -> (the libraries it may load, what runs after its modules are imported)
FLOORS = {
    "amqp": (set(), f"broker_filter.amqp.decode_message(broker_filter.amqp.encode_message({MESSAGE}))"),
    "filters": ({"lark"}, EVALUATE),
    "broker": ({"lark", "sortedcontainers"}, ""),
    "archive": ({"lark", "pyarrow"}, ""),
    "security": (set(), ""),
    "authorization": (set(), "assert broker_filter.authorization.Permissions.open().is_open"),
    "config": ({"lark"}, "broker_filter.config.load(None, {})"),
    "engine": (PROTON - {"proton", "_proton"}, ""),
    "proxy": ((PROTON - {"proton", "_proton"}) | {"lark", "sortedcontainers"}, ""),
    # pyspark loads pyarrow and py4j itself
    "spark": (PROTON | {"lark", "pyarrow", "pyspark", "py4j"}, ""),
}


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_importing_a_floor_loads_nothing_above_it(floor: str) -> None:
    libraries, then = FLOORS[floor]
    if floor == "spark" and importlib.util.find_spec("pyspark") is None:
        pytest.skip("the spark extra is not installed")
    probe = PROBE.format(names=[f"broker_filter.{floor}"], then=then, probed=PROBED)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert set(loaded["ours"]) <= reach(floor), f"{floor} loaded {sorted(set(loaded['ours']) - reach(floor))}"
    assert set(loaded["libraries"]) <= libraries, f"{floor} loaded {sorted(set(loaded['libraries']) - libraries)}"
    assert not loaded["logging"], f"importing {floor} configured logging"


def test_the_probe_would_see_proton_and_a_floor_above() -> None:
    probe = PROBE.format(names=["broker_filter.proxy"], then="", probed=PROBED)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    loaded = json.loads(done.stdout.splitlines()[-1])
    assert "proxy" in loaded["ours"] and "security" in loaded["ours"]
    assert "cproton_ffi" in loaded["libraries"]
    probe = PROBE.format(names=["broker_filter.security"], then="import proton", probed=PROBED)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert "proton" in json.loads(done.stdout.splitlines()[-1])["libraries"]
