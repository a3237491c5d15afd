"""The Kubernetes manifests (docker/kubernetes/), validated offline: `kubectl kustomize` builds them,
kubernetes-validate checks every built-in object against the API schemas (strict: unknown fields
fail), and the rest is checked here: the Prometheus Operator objects (no schema ships for CRDs: the
PrometheusRule's rules go through promtool and must equal docker/prometheus/alerts.yml; the
PodMonitor must point at the pods' metrics port), the ConfigMap is the shipped configuration, the
daemon loads the configuration the Deployment gives it, probes and ports agree with it, and the
termination grace period covers the preStop pause and the daemon's drain."""

from __future__ import annotations

import shutil
import subprocess
import tomllib

import pytest
import yaml

from broker_filter.config import load
from launcher import ROOT

KUBE = ROOT / "docker" / "kubernetes"
ALERTS = ROOT / "docker" / "prometheus" / "alerts.yml"
KUBECTL = shutil.which("kubectl")
PROMTOOL = shutil.which("promtool")
# Oldest and newest Kubernetes versions the objects are validated against (kubernetes-validate's
# schemas; the preStop exec and every field used exist in both).
VERSIONS = ["1.27.0", "latest"]
OPERATOR_KINDS = {"PodMonitor", "PrometheusRule"}  # monitoring.coreos.com/v1: checked by hand below


def _kustomization() -> dict:
    return yaml.safe_load((KUBE / "kustomization.yaml").read_text())


def _assembled() -> list[dict]:
    """The objects as kustomize builds them, assembled here (used when kubectl is absent): the
    resources, the generated ConfigMap (without its hash suffix) and the common labels."""
    k = _kustomization()
    objects = [doc for name in k["resources"] for doc in yaml.safe_load_all((KUBE / name).read_text()) if doc]
    for gen in k["configMapGenerator"]:
        objects.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]},
                        "data": {f: (KUBE / f).read_text() for f in gen["files"]}})
    labels = {key: value for entry in k["labels"] for key, value in entry["pairs"].items()}
    for obj in objects:
        obj["metadata"].setdefault("labels", {}).update(labels)
        if obj["kind"] == "Deployment":
            obj["spec"].setdefault("selector", {}).setdefault("matchLabels", {}).update(labels)
            obj["spec"]["template"].setdefault("metadata", {}).setdefault("labels", {}).update(labels)
        if obj["kind"] == "Service":
            obj["spec"].setdefault("selector", {}).update(labels)
    return objects


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    if KUBECTL is None:
        return _assembled()
    result = subprocess.run([KUBECTL, "kustomize", str(KUBE)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def one(objects: list[dict], kind: str) -> dict:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{kind}: {len(found)} objects"
    return found[0]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl not installed (not in Debian 12's archive): the objects are "
                    "assembled from kustomization.yaml by the test instead and validated the same way")
def test_kubectl_kustomize_builds_every_object(objects):
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(o["kind"] for o in _assembled())
    config_map = one(objects, "ConfigMap")
    assert config_map["metadata"]["name"].startswith("broker-filter-config-")  # hashed: a change restarts pods
    volumes = one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "config", "configMap": {"name": config_map["metadata"]["name"]}} in volumes


def validate(objects: list[dict]) -> set[str]:
    """Every built-in object validated (strict) against each of VERSIONS; the kinds checked."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate (test extra)")
    checked = set()
    for obj in objects:
        if obj["kind"] in OPERATOR_KINDS:
            continue
        for version in VERSIONS:
            version = kubernetes_validate.latest_version() if version == "latest" else version
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} (Kubernetes {version}): {e.message} at "
                            f"{'.'.join(map(str, e.path))}")
        checked.add(obj["kind"])
    return checked


def test_objects_validate_against_the_kubernetes_schemas(objects):
    checked = validate(objects)
    assert checked == {"ConfigMap", "Secret", "Service", "Deployment", "PodDisruptionBudget", "NetworkPolicy"}
    assert {o["kind"] for o in objects} - checked == OPERATOR_KINDS


def test_configmap_is_the_shipped_configuration():
    assert (KUBE / "broker-filter.toml").read_text() == (ROOT / "config" / "broker-filter.toml").read_text(), (
        "copy config/broker-filter.toml to docker/kubernetes/broker-filter.toml")


def test_prometheusrule_carries_the_alert_rules(objects, tmp_path):
    rule = one(objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"], (
        "docker/kubernetes/prometheusrule.yaml differs from docker/prometheus/alerts.yml: copy the groups over")
    if PROMTOOL is not None:  # the rules as the Operator hands them to Prometheus
        rules = tmp_path / "rules.yml"
        rules.write_text(yaml.safe_dump(rule["spec"]))
        result = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def _pod(objects: list[dict]) -> tuple[dict, dict]:
    template = one(objects, "Deployment")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return template, container


def test_podmonitor_scrapes_the_metrics_port_as_job_broker_filter(objects):
    monitor = one(objects, "PodMonitor")
    template, container = _pod(objects)
    pod_labels = template["metadata"]["labels"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert pod_labels[monitor["spec"]["jobLabel"]] == "broker-filter"  # the rules select job="broker-filter"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports and endpoint["path"] == "/metrics"


def _daemon_config(objects: list[dict]):
    """The configuration the daemon in the pod loads: the ConfigMap's file and the container's
    environment (Secret values resolved)."""
    _, container = _pod(objects)
    secret = one(objects, "Secret")
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret["metadata"]["name"]
            env[var["name"]] = secret["stringData"][ref["key"]]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert env["BROKER_FILTER_CONFIG"] == mount["mountPath"] + "/broker-filter.toml"
    env["BROKER_FILTER_CONFIG"] = str(KUBE / "broker-filter.toml")
    return load(None, env)


def test_daemon_configuration_probes_ports_and_service(objects):
    config = _daemon_config(objects)
    assert config.upstream.urls == ("amqp://rabbitmq:5672",)
    assert config.upstream.credentials == "pass-through" and config.upstream.password == "change-me"
    assert config.listener.host == "0.0.0.0" and config.metrics.host == "0.0.0.0"
    template, container = _pod(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"amqp": config.listener.port, "metrics": config.metrics.port}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    service = one(objects, "Service")
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} == set(ports)
    budget = one(objects, "PodDisruptionBudget")
    assert budget["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["spec"]["securityContext"]["runAsUser"] == 10001  # the image's user
    assert container["resources"]["requests"]["memory"] and container["resources"]["requests"]["cpu"]


def _ingress_ports(policy: dict, from_anywhere: bool) -> set:
    return {p["port"] for rule in policy["spec"]["ingress"] if ("from" not in rule) == from_anywhere
            for p in rule.get("ports", [])}


def check_network_policy(objects: list[dict]) -> None:
    """The pods' AMQP port is open (clients, and the replicas to each other); their metrics listener
    (0.0.0.0 in the pod, the daemon's default being loopback) only to Prometheus's pods, and /links
    there asks for a token."""
    policy = one(objects, "NetworkPolicy")
    template, container = _pod(objects)
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    ports = {p["name"] for p in container["ports"]}
    assert _ingress_ports(policy, from_anywhere=True) == {"amqp"}
    assert _ingress_ports(policy, from_anywhere=False) == {"metrics"} and ports == {"amqp", "metrics"}
    (scrapers,) = [rule for rule in policy["spec"]["ingress"] if "from" in rule]
    (peer,) = scrapers["from"]
    # Prometheus's pods in any namespace, by an expression the kustomization's common labels leave alone.
    assert peer["namespaceSelector"] == {} and "matchLabels" not in peer["podSelector"]
    assert peer["podSelector"]["matchExpressions"] == [
        {"key": "app.kubernetes.io/name", "operator": "In", "values": ["prometheus"]}]


def test_the_network_policy_lets_only_prometheus_reach_the_metrics_listener(objects):
    check_network_policy(objects)
    config = _daemon_config(objects)
    assert config.metrics.host == "0.0.0.0" and config.metrics.token  # /links would be refused without it


def test_termination_grace_covers_the_prestop_pause_and_the_drain(objects):
    config = _daemon_config(objects)
    template, container = _pod(objects)
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pause = float(command[1])
    grace = template["spec"]["terminationGracePeriodSeconds"]
    # SIGTERM comes after preStop; the daemon then waits up to shutdown.grace_period for settlements
    # and needs a few seconds more to detach links and close connections.
    assert grace >= pause + config.shutdown.grace_period + 10
    assert pause > 0  # time for the pod's removal from the Service's endpoints to reach every node
    assert tomllib.loads((KUBE / "broker-filter.toml").read_text())["shutdown"]["grace_period"] == \
        config.shutdown.grace_period


REPLICAS = ROOT / "docker" / "kubernetes-replicas"


@pytest.fixture(scope="module")
def replica_objects() -> list[dict]:
    if KUBECTL is None:
        pytest.skip("kubectl not installed (not in Debian 12's archive): the replicas overlay's patch needs "
                    "kustomize to apply it")
    result = subprocess.run([KUBECTL, "kustomize", str(REPLICAS)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def test_the_replicas_overlay_validates(replica_objects):
    assert validate(replica_objects) == {"ConfigMap", "Secret", "Service", "Deployment", "PodDisruptionBudget",
                                         "NetworkPolicy"}


def test_the_replicas_overlay_keeps_the_network_policy(replica_objects):
    check_network_policy(replica_objects)  # the replicas reach each other on the AMQP port


def test_the_replicas_overlay_gives_each_pod_an_owner_configuration(replica_objects):
    """The daemon in a pod of the overlay loads [replicas] with the headless Service's name, its own
    IP as `self`, the proxy's own account upstream, and a replica login its listener accepts."""
    from broker_filter.security import parse_password_hash

    template = one(replica_objects, "Deployment")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    secrets = {s["metadata"]["name"]: s["stringData"] for s in replica_objects if s["kind"] == "Secret"}
    env, names = {}, [v["name"] for v in container["env"]]
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"].replace("$(POD_IP)", "10.1.2.3")
        elif "secretKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]][ref["key"]]
    assert names.index("POD_IP") < names.index("BROKER_FILTER_REPLICAS_SELF")  # $(POD_IP) is expanded
    env["BROKER_FILTER_CONFIG"] = str(REPLICAS / "broker-filter.toml")
    env.pop("POD_IP", None)
    config = load(None, env)
    assert config.upstream.credentials == "configured"
    headless = [s for s in replica_objects if s["kind"] == "Service" and s["spec"].get("clusterIP") == "None"]
    (service,) = headless
    assert config.replicas.dns == f"{service['metadata']['name']}:{config.listener.port}"
    assert config.replicas.self == f"10.1.2.3:{config.listener.port}"
    assert config.replicas.splice  # (docs/proxy.md, "Splicing": the replicas' CPU per message)
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert parse_password_hash(config.listener.users[config.replicas.user]).verify(config.replicas.password)


def test_the_replicas_overlay_config_is_the_shipped_one_with_the_replica_login():
    shipped = (ROOT / "config" / "broker-filter.toml").read_text()
    overlay = (REPLICAS / "broker-filter.toml").read_text()
    added = [line for line in overlay.splitlines() if line not in shipped.splitlines()]
    assert all(line.startswith("#") or line.startswith("replica = ") for line in added), added
    assert set(shipped.splitlines()) <= set(overlay.splitlines())
