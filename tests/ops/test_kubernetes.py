"""The Kubernetes manifests (docker/kubernetes/), validated offline: `kubectl kustomize` builds them,
kubernetes-validate checks every built-in object against the API schemas (strict: unknown fields
fail), and the rest is checked here: the Prometheus Operator objects (no schema ships for CRDs: the
PrometheusRule's rules go through promtool and must equal docker/prometheus/alerts.yml; the
PodMonitor must point at the pods' metrics port), the ConfigMap is the shipped configuration, the
daemon loads the configuration the Deployment gives it, probes and ports agree with it, and the
termination grace period covers the preStop pause and the daemon's drain.  No Secret is shipped: the
operator creates them with the `kubectl create secret` commands the kustomizations' comments (and the
READMEs) give, which the tests run (--dry-run=client) to resolve the pods' Secret references."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import tomllib

import pytest
import yaml

from broker_filter.app import listener_users
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
# The proxy's RabbitMQ password, as the operator gives it to the documented command ($RABBITMQ_PASSWORD)
UPSTREAM_PASSWORD = secrets.token_hex(12)


def documented_secret_commands(folder) -> list[str]:
    """The `kubectl create secret generic` commands of a kustomization's opening comment (continued
    lines joined)."""
    commands, current = [], ""
    for line in (folder / "kustomization.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        current = f"{current} {line[1:].strip()}" if current else line[1:].strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if current.startswith("kubectl create secret generic "):
            commands.append(current)
        current = ""
    return commands


class OperatorSecrets:
    """The Secrets the operator creates as a kustomization's comment says: each command run in bash
    ($RABBITMQ_PASSWORD set, `openssl rand` as written) with --dry-run=client (no cluster), or, without
    kubectl, read from the arguments it was given.  `objects`: as kubectl makes them; `values`: name ->
    key -> value."""

    def __init__(self, folder):
        self.commands = documented_secret_commands(folder)
        assert self.commands, f"{folder.name}/kustomization.yaml documents no `kubectl create secret generic`"
        self.objects: list[dict] = []
        self.values: dict[str, dict[str, str]] = {}
        env = {**os.environ, "RABBITMQ_PASSWORD": UPSTREAM_PASSWORD, "KUBECONFIG": os.devnull}
        for command in self.commands:
            script = (f"{command} --dry-run=client -o yaml" if KUBECTL is not None
                      else f'kubectl() {{ printf "%s\\0" "$@"; }}; {command}')
            result = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, f"{command}: {result.stderr}"
            if KUBECTL is not None:
                secret = yaml.safe_load(result.stdout)
                self.objects.append(secret)
                values = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
                name = secret["metadata"]["name"]
            else:
                args = result.stdout.split("\0")[:-1]
                assert args[:3] == ["create", "secret", "generic"], args
                name = args[3]
                values = dict(a.removeprefix("--from-literal=").split("=", 1) for a in args[4:])
            assert all(values.values()), f"{command}: an empty value"
            self.values[name] = values

    def resolve(self, ref: dict) -> str:
        assert ref["name"] in self.values, f"the pods need Secret {ref['name']}, which no documented command creates"
        assert ref["key"] in self.values[ref["name"]], f"Secret {ref['name']} is documented without {ref['key']}"
        return self.values[ref["name"]][ref["key"]]


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


@pytest.fixture(scope="module")
def operator_secrets() -> OperatorSecrets:
    return OperatorSecrets(KUBE)


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


def test_objects_validate_against_the_kubernetes_schemas(objects, operator_secrets):
    checked = validate(objects + operator_secrets.objects)
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


def _daemon_config(objects: list[dict], operator_secrets: OperatorSecrets):
    """The configuration the daemon in the pod loads: the ConfigMap's file and the container's
    environment (Secret values resolved: the Secrets the operator creates as documented)."""
    _, container = _pod(objects)
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            env[var["name"]] = operator_secrets.resolve(var["valueFrom"]["secretKeyRef"])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
    assert env["BROKER_FILTER_CONFIG"] == mount["mountPath"] + "/broker-filter.toml"
    env["BROKER_FILTER_CONFIG"] = str(KUBE / "broker-filter.toml")
    return load(None, env)


def test_daemon_configuration_probes_ports_and_service(objects, operator_secrets):
    config = _daemon_config(objects, operator_secrets)
    assert config.upstream.urls == ("amqp://rabbitmq:5672",)
    assert config.upstream.credentials == "pass-through"
    assert (config.upstream.user, config.upstream.password) == ("proxy", UPSTREAM_PASSWORD)
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


def test_the_network_policy_lets_only_prometheus_reach_the_metrics_listener(objects, operator_secrets):
    check_network_policy(objects)
    config = _daemon_config(objects, operator_secrets)
    assert config.metrics.host == "0.0.0.0" and config.metrics.token  # /links would be refused without it
    assert len(config.metrics.token) == 48  # openssl rand -hex 24, as documented


def test_termination_grace_covers_the_prestop_pause_and_the_drain(objects, operator_secrets):
    config = _daemon_config(objects, operator_secrets)
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


@pytest.fixture(scope="module")
def replica_secrets() -> OperatorSecrets:
    return OperatorSecrets(REPLICAS)


def test_the_replicas_overlay_validates(replica_objects, replica_secrets):
    assert validate(replica_objects + replica_secrets.objects) == {
        "ConfigMap", "Secret", "Service", "Deployment", "PodDisruptionBudget", "NetworkPolicy"}


def test_the_replicas_overlay_keeps_the_network_policy(replica_objects):
    check_network_policy(replica_objects)  # the replicas reach each other on the AMQP port


def _replica_pod_env(replica_objects: list[dict], replica_secrets: OperatorSecrets) -> dict[str, str]:
    """The environment of the daemon in a pod of the overlay (pod IP 10.1.2.3), its Secrets resolved."""
    (container,) = one(replica_objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env, names = {}, [v["name"] for v in container["env"]]
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"].replace("$(POD_IP)", "10.1.2.3")
        elif "secretKeyRef" in var["valueFrom"]:
            env[var["name"]] = replica_secrets.resolve(var["valueFrom"]["secretKeyRef"])
    assert names.index("POD_IP") < names.index("BROKER_FILTER_REPLICAS_SELF")  # $(POD_IP) is expanded
    env["BROKER_FILTER_CONFIG"] = str(REPLICAS / "broker-filter.toml")
    env.pop("POD_IP", None)
    return env


def test_the_replicas_overlay_gives_each_pod_an_owner_configuration(replica_objects, replica_secrets):
    """The daemon in a pod of the overlay loads [replicas] with the headless Service's name, its own
    IP as `self`, the proxy's own account upstream, and a replica login its listener accepts: the
    password of the Secret the operator makes, hashed at start (no hash in the configuration)."""
    from broker_filter.security import parse_password_hash

    template = one(replica_objects, "Deployment")["spec"]["template"]
    config = load(None, _replica_pod_env(replica_objects, replica_secrets))
    assert config.upstream.credentials == "configured"
    headless = [s for s in replica_objects if s["kind"] == "Service" and s["spec"].get("clusterIP") == "None"]
    (service,) = headless
    assert config.replicas.dns == f"{service['metadata']['name']}:{config.listener.port}"
    assert config.replicas.self == f"10.1.2.3:{config.listener.port}"
    assert config.replicas.splice  # (docs/proxy.md, "Splicing": the replicas' CPU per message)
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    assert (config.upstream.user, config.upstream.password) == ("proxy", UPSTREAM_PASSWORD)
    assert config.replicas.user and config.replicas.user not in config.listener.users  # no hash shipped
    assert len(config.replicas.password) == 48  # openssl rand -hex 24, as documented
    users = listener_users(config)  # what the listener checks
    assert parse_password_hash(users[config.replicas.user]).verify(config.replicas.password)
    assert not parse_password_hash(users[config.replicas.user]).verify(config.replicas.password + "x")


def test_a_replica_login_in_listener_users_wins_and_must_be_the_secrets_password(replica_objects, replica_secrets,
                                                                               tmp_path):
    """An operator who also puts the replicas' user in the overlay's [listener.users]: that hash is
    the one the listener checks (it wins over the one made at start), and a hash of another password
    than the Secret's is refused when the configuration is loaded, naming replicas.password."""
    from broker_filter.config import ConfigError
    from broker_filter.security import hash_password

    env = _replica_pod_env(replica_objects, replica_secrets)
    text = (REPLICAS / "broker-filter.toml").read_text()
    assert "\n[listener.users]\n" in text
    for password, accepted in ((env["BROKER_FILTER_REPLICAS_PASSWORD"], True), ("another", False)):
        stored = hash_password(password, algorithm="pbkdf2-sha256")
        path = tmp_path / "broker-filter.toml"
        path.write_text(text.replace("\n[listener.users]\n", f'\n[listener.users]\nreplica = "{stored}"\n'))
        env["BROKER_FILTER_CONFIG"] = str(path)
        if accepted:
            config = load(None, env)
            assert listener_users(config)[config.replicas.user] == stored
        else:
            with pytest.raises(ConfigError) as info:
                load(None, env)
            assert info.value.key == "replicas.password" and "listener.users.replica" in info.value.reason


def test_the_replicas_overlay_config_is_the_shipped_one_with_comments():
    shipped = (ROOT / "config" / "broker-filter.toml").read_text()
    overlay = (REPLICAS / "broker-filter.toml").read_text()
    added = [line for line in overlay.splitlines() if line not in shipped.splitlines()]
    assert all(line.startswith("#") for line in added), added
    assert set(shipped.splitlines()) <= set(overlay.splitlines())


@pytest.mark.parametrize("folder", [KUBE, REPLICAS], ids=["base", "replicas"])
def test_no_secret_password_or_hash_is_shipped(folder):
    """Neither kustomization ships a Secret, a password or a hash: the operator makes them."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    for name in kustomization["resources"]:
        if not name.startswith(".."):
            kinds = {doc["kind"] for doc in yaml.safe_load_all((folder / name).read_text()) if doc}
            assert "Secret" not in kinds, f"{folder.name}/{name} ships a Secret"
    assert "secretGenerator" not in kustomization
    for path in folder.iterdir():
        text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
        for shipped in ("$scrypt$", "$pbkdf2-sha256$", "change-me", "stringData"):
            assert shipped not in text, f"{folder.name}/{path.name} holds {shipped!r}"


def _words(text: str) -> str:
    return " ".join(text.replace("\\\n", " ").split())


def test_the_readmes_give_the_same_secret_commands():
    """The commands the kustomizations' comments give (and the tests run) are the READMEs' too."""
    for folder in (KUBE, REPLICAS):
        for command in documented_secret_commands(folder):
            for readme in (ROOT / "README.md", ROOT / "docker" / "README.md"):
                assert _words(command) in _words(readme.read_text()), f"{readme.name} lacks: {command}"
