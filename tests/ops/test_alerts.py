"""The shipped Prometheus alert rules and Grafana dashboard (docker/), checked with the real tools:
promtool checks the rules and the Prometheus configuration and runs the rules' unit tests (each alert
firing and not firing); every metric name the rules and the dashboard use is exported by a running
daemon; and a real Prometheus server scrapes two daemons and evaluates the rules."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from launcher import ROOT, Daemon, free_port, http_get

DOCKER = ROOT / "docker"
ALERTS = DOCKER / "prometheus" / "alerts.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "broker-filter.json"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (Debian package `prometheus`, "
                                    "installed by scripts/setup.sh)")

# Names PromQL uses that are not the daemon's: `up` is Prometheus's own, per scrape target.
PROMETHEUS_OWN = {"up"}

_KEYWORDS = {"and", "or", "unless", "by", "on", "without", "ignoring", "bool", "offset", "group_left",
             "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (label matchers, ranges, grouping clauses, function
    names and keywords removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # range and subquery durations
    text = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def rule_exprs() -> dict[str, str]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule["expr"] for group in doc["groups"] for rule in group["rules"]}


def dashboard_exprs() -> dict[str, str]:
    dash = json.loads(DASHBOARD.read_text())
    out = {}
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out[f"{panel['title']} / {target['refId']}"] = target["expr"]
    for variable in dash["templating"]["list"]:
        query = variable["query"]["query"]
        match = re.fullmatch(r"label_values\((.*), *\w+\)", query)
        assert match, f"dashboard variable {variable['name']}: unexpected query {query!r}"
        out[f"variable {variable['name']}"] = match.group(1)
    return out


def exported_names(text: str) -> set[str]:
    """Every sample name a scrape can show: the samples present and, for families with no samples yet
    (labelled instruments not touched), the names their type implies."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update({
            "counter": [family.name + "_total"],
            "histogram": [family.name + s for s in ("_bucket", "_sum", "_count")],
            "summary": [family.name + s for s in ("_sum", "_count")],
            "info": [family.name + "_info"],
        }.get(family.type, [family.name]))
    return names


def test_metric_names_parser():
    assert metric_names('sum by (address, kind) (rate(broker_filter_x_total{job="a", address=~"$address"}'
                        '[$__rate_interval])) / on (job) process_max_fds > 1e6 and bool up') == {
        "broker_filter_x_total", "process_max_fds", "up"}
    assert metric_names("histogram_quantile(0.9, rate(x_bucket[5m]))") == {"x_bucket"}


@pytest.fixture(scope="module")
def daemon_metrics() -> str:
    """The /metrics text of a running daemon (embedded broker) that has handled nothing yet."""
    daemon = Daemon("--metrics", "127.0.0.1:0")
    try:
        status, text = http_get(daemon.metrics_url() + "/metrics")
        assert status == 200
        return text
    finally:
        daemon.stop()


@pytest.mark.parametrize("source", ["alert rules", "dashboard"])
def test_every_metric_used_is_exported(daemon_metrics, source):
    exprs = rule_exprs() if source == "alert rules" else dashboard_exprs()
    assert exprs
    exported = exported_names(daemon_metrics)
    missing = {}
    for where, expr in exprs.items():
        names = metric_names(expr)
        assert names, f"{source}: {where}: no metric name found in {expr!r}"
        for name in names - PROMETHEUS_OWN - exported:
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            if base != name and {base + "_bucket", base + "_count"} & exported:
                continue
            missing.setdefault(name, []).append(where)
    assert not missing, f"{source} use metrics the daemon does not export: {missing}"


def test_dashboard_is_provisioned_with_its_datasource():
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "broker-filter"
    datasources = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uids = {d["uid"] for d in datasources["datasources"]}
    used = {t["datasource"]["uid"] for p in dash["panels"] for t in p.get("targets", [])}
    used |= {p["datasource"]["uid"] for p in dash["panels"] if "datasource" in p}
    assert used == uids == {"prometheus"}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    providers = yaml.safe_load((DOCKER / "grafana" / "provisioning" / "dashboards" / "broker-filter.yml").read_text())
    path = providers["providers"][0]["options"]["path"]
    grafana = yaml.safe_load((DOCKER / "compose.yaml").read_text())["services"]["grafana"]
    mounts = {v.split(":")[1]: v.split(":")[0] for v in grafana["volumes"]}
    assert (DOCKER / mounts[path] / DASHBOARD.name).resolve() == DASHBOARD.resolve()
    assert (DOCKER / mounts["/etc/grafana/provisioning"]).resolve() == (DOCKER / "grafana" / "provisioning").resolve()
    # Every alert's metric shows on the dashboard too (up is Prometheus's own).
    on_dashboard = set().union(*map(metric_names, dashboard_exprs().values()))
    for alert, expr in rule_exprs().items():
        assert metric_names(expr) - PROMETHEUS_OWN <= on_dashboard, alert


@needs_promtool
def test_promtool_checks_the_rules():
    result = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rule_exprs())} rules found" in result.stdout


@needs_promtool
def test_promtool_checks_the_compose_prometheus_config():
    result = subprocess.run([PROMTOOL, "check", "config", "prometheus.yml"], cwd=DOCKER, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 1 rule files found" in result.stdout


@needs_promtool
def test_promtool_unit_tests_every_alert_firing_and_not_firing():
    tests = yaml.safe_load((ALERTS.parent / "alerts_test.yml").read_text())
    fired, quiet = set(), set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    assert fired == quiet == set(rule_exprs()), "each alert needs a firing and a not-firing check"
    result = subprocess.run([PROMTOOL, "test", "rules", "alerts_test.yml"], cwd=ALERTS.parent, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _api(base: str, path: str, **params) -> dict:
    url = f"{base}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    status, body = http_get(url)
    assert status == 200, f"{url}: {status} {body}"
    doc = json.loads(body)
    assert doc["status"] == "success", doc
    return doc["data"]


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian package `prometheus`, installed "
                    "by scripts/setup.sh)")
def test_prometheus_scrapes_daemons_and_evaluates_the_rules(tmp_path):
    """Two daemons, one with its upstream down: Prometheus (scraping every second) shows both targets
    up, evaluates every rule without error, and holds BrokerFilterUpstreamDown pending for the one
    whose upstream is down only."""
    healthy = Daemon("--metrics", "127.0.0.1:0")
    try:
        down = Daemon("--metrics", "127.0.0.1:0", "--upstream", f"amqp://127.0.0.1:{free_port()}")
    except BaseException:
        healthy.stop()
        raise
    prometheus = None
    try:
        targets = {d: d.metrics_url().removeprefix("http://") for d in (healthy, down)}
        rules = tmp_path / "alerts.yml"
        shutil.copy(ALERTS, rules)
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "broker-filter", "static_configs": [{"targets": list(targets.values())}]}],
        }))
        port = free_port()
        log = (tmp_path / "prometheus.log").open("w")
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 90
        alerts: list = []
        while time.monotonic() < deadline:
            assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()
            try:
                status, _ = http_get(base + "/-/ready")
            except OSError:
                status = 0
            if status == 200:
                active = _api(base, "targets")["activeTargets"]
                alerts = _api(base, "alerts")["alerts"]
                if (len(active) == 2 and all(t["health"] == "up" for t in active)
                        and any(a["labels"]["alertname"] == "BrokerFilterUpstreamDown" for a in alerts)):
                    break
            time.sleep(0.5)
        else:
            pytest.fail(f"Prometheus did not show both targets up and the upstream alert within 90 s: "
                        f"{alerts}\n{(tmp_path / 'prometheus.log').read_text()[-3000:]}")
        upstream_down = [a for a in alerts if a["labels"]["alertname"] == "BrokerFilterUpstreamDown"]
        assert [a["labels"]["instance"] for a in upstream_down] == [targets[down]]
        assert upstream_down[0]["state"] == "pending"  # `for: 2m`
        assert {a["labels"]["alertname"] for a in alerts} == {"BrokerFilterUpstreamDown"}
        groups = _api(base, "rules")["groups"]
        evaluated = {r["name"]: r for g in groups for r in g["rules"]}
        assert set(evaluated) == set(rule_exprs())
        for name, rule in evaluated.items():
            assert rule["health"] != "err", f"{name}: {rule.get('lastError')}"
        connected = _api(base, "query", query="broker_filter_upstream_connected")["result"]
        assert {r["metric"]["instance"]: r["value"][1] for r in connected} == {targets[healthy]: "1",
                                                                               targets[down]: "0"}
        fds = _api(base, "query", query="process_open_fds / process_max_fds")["result"]
        assert len(fds) == 2 and all(0 < float(r["value"][1]) < 0.8 for r in fds)
    finally:
        if prometheus is not None:
            prometheus.terminate()
            try:
                prometheus.wait(30)
            except subprocess.TimeoutExpired:
                prometheus.kill()
                prometheus.wait(10)
        healthy.stop()
        down.stop()
