"""The package as a user installs it: the wheel and wheels of its declared dependencies only, built
and installed by the same scripts and steps as the container image, into a fresh virtualenv without
an index; then `broker-filter serve` from that virtualenv filters a message and answers /healthz.

Takes about 30 s with pip's cache (python-qpid-proton compiles from source once, ~25 s more)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from clients import filtered_round_trip
from launcher import ROOT, Daemon, free_port, http_get, user_env
from opskit import instructions

BUILD_SCRIPT = "scripts/build-wheels.sh"
INSTALL_SCRIPT = "install-wheels.sh"
OPTIONAL_ONLY = ("pyarrow", "pyspark", "tqdm")  # brought by the extras, never by the core install


def stages() -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    steps = instructions()
    starts = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    assert len(starts) == 2, "the Dockerfile should have a build stage and a runtime stage"
    return steps[starts[0]:starts[1]], steps[starts[1]:]


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{shlex.join(cmd)} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
    return result


def dist_name(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("_", "-")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """The image's steps, outside a container: its build stage's COPY sources into a source folder,
    its build step there, a fresh virtualenv, its install step into that."""
    build, runtime = stages()
    work = tmp_path_factory.mktemp("install")
    src, wheels, venv = work / "src", work / "wheels", work / "venv"
    for keyword, rest in build:
        if keyword == "COPY" and "--from=" not in rest:
            *sources, dest = shlex.split(rest)
            for source in sources:  # as COPY does: a folder's contents into dest, a file into dest/
                target = src / dest
                if (ROOT / source).is_dir():
                    shutil.copytree(ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__"))
                    continue
                if dest.endswith("/"):
                    target = target / Path(source).name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, target)
    # the build stage builds the wheels and installs them into the virtualenv the runtime stage copies
    build_runs = [rest for keyword, rest in build if keyword == "RUN" and BUILD_SCRIPT in rest]
    assert len(build_runs) == 1, "the image builds with another command"
    steps = [step.strip() for step in build_runs[0].split("&&")]
    assert steps[0] == f'sh {BUILD_SCRIPT} /src /wheels "${{EXTRAS}}"', "the image builds with another command"
    assert [s for s in steps if INSTALL_SCRIPT in s] == [
        f'PYTHON=/opt/broker-filter/bin/python sh scripts/{INSTALL_SCRIPT} /wheels "${{EXTRAS}}"'
    ], "the image installs with another command"
    assert not [rest for keyword, rest in runtime if "/wheels" in rest], "the runtime stage sees no wheel"
    env = user_env(PYTHON=sys.executable)
    run(["sh", BUILD_SCRIPT, str(src), str(wheels), ""], cwd=src, env=env)
    run([sys.executable, "-m", "venv", str(venv)], env=env)
    run(["sh", str(src / "scripts" / INSTALL_SCRIPT), str(wheels), ""], cwd=work,
        env=user_env(PYTHON=str(venv / "bin" / "python")))
    return {"work": work, "wheels": wheels, "venv": venv}


def test_wheels_are_the_package_and_its_declared_dependencies_only(installed):
    names = {dist_name(w) for w in installed["wheels"].glob("*.whl")}
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for requirement in declared:
        name = requirement.split(">")[0].split("<")[0].split("=")[0].strip().lower()
        assert name in names, f"no wheel of the declared dependency {name}: {sorted(names)}"
    assert "broker-filter" in names
    assert not names & set(OPTIONAL_ONLY), f"the core install pulled an extra's package: {sorted(names)}"
    listed = run([str(installed["venv"] / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                 env=user_env()).stdout.lower()
    assert "broker-filter==" in listed and not any(f"{name}==" in listed for name in OPTIONAL_ONLY)


def test_installed_daemon_filters_a_message_and_answers_healthz(installed):
    venv, work = installed["venv"], installed["work"]
    where = run([str(venv / "bin" / "python"), "-c", "import broker_filter; print(broker_filter.__file__)"],
                cwd=work, env=user_env()).stdout.strip()
    assert where.startswith(str(venv)), f"the test would run this checkout, not the installed wheel: {where}"
    port = free_port()
    daemon = Daemon("--metrics", "127.0.0.1:0", program=[str(venv / "bin" / "broker-filter"), "serve"],
                    listen=f"127.0.0.1:{port}", as_user=True, cwd=work, log_dir=work)
    try:
        metrics_url = daemon.wait_for(r"endpoints on (http://127\.0\.0\.1:\d+)", timeout=30)
        daemon.wait_for(rf"listening on 127\.0\.0\.1:{port}\b", timeout=30)
        assert filtered_round_trip(f"amqp://127.0.0.1:{port}") == ["red"]
        assert http_get(metrics_url + "/healthz") == (200, "ok\n")
    finally:
        status = daemon.stop()
    assert status == 0, daemon.log()
    assert "Traceback" not in daemon.log()


def test_journal_without_its_extra_is_a_config_error_before_listening(installed):
    venv, work = installed["venv"], installed["work"]
    port = free_port()
    result = subprocess.run(
        [str(venv / "bin" / "broker-filter"), "serve", "--listen", f"127.0.0.1:{port}",
         "--set", "journal.enabled=true", "--set", f"journal.directory={work / 'journal'}"],
        cwd=work, env=user_env(), capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == (
        "broker-filter: config error: journal.enabled: needs the [journal] extra "
        "(pip install 'broker-filter[journal]'): pyarrow is not installed\n"
    )
    assert "listening" not in result.stdout + result.stderr
    assert not (work / "journal").exists()


def test_pipeline_commands_without_their_extra_name_it(installed):
    venv, work = installed["venv"], installed["work"]
    (work / "one.jsonl").write_text('{"properties": {"subject": "a"}}\n')
    for command in (["archive", "import", "one.jsonl", "-o", "archive"],
                    ["backtest", "--archive", "archive", "--selector", "a = 1"]):
        result = subprocess.run([str(venv / "bin" / "broker-filter"), *command], cwd=work, env=user_env(),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.startswith(f"broker-filter {command[0]}: needs the [spark] extra "
                                        "(pip install 'broker-filter[spark]'): "), result.stderr
        assert "Traceback" not in result.stderr
