"""Static checks of the container, compose, Kubernetes, Prometheus and Grafana files (offline, PyYAML only)."""

from __future__ import annotations

import importlib.util
import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

from flywheel.services.actor.settings import ActorSettings
from flywheel.services.gateway.settings import GatewaySettings
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.replay.settings import ReplaySettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GPU = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "docker" / "Dockerfile"
K8S = ROOT / "k8s"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"

SETTINGS: dict[str, type[BaseSettings]] = {
    "actor": ActorSettings, "replay": ReplaySettings, "learner": LearnerSettings, "gateway": GatewaySettings,
}
FLYWHEEL_SERVICES = ("gateway", "replay", "learner", "actor")
NAMESPACE = "flywheel"
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}
DEFAULT_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


# ---- loading ---------------------------------------------------------------------------------------------------

def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE)


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(K8S.glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path.name, doc))
    return docs


def k8s_objects(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in k8s_docs() if doc["kind"] == kind}


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, doc in k8s_docs():
        if doc["kind"] in WORKLOAD_KINDS:
            yield doc["metadata"]["name"], doc["spec"]["template"]["spec"]


def compose_default(value: Any) -> str:
    """What compose substitutes when no variable is set: ``${X:-d}`` -> ``d``, ``${X}`` -> ``""``."""
    return DEFAULT_RE.sub(lambda m: m.group(2) or "", str(value))


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the ["KEY=value", ...] form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def split_var(name: str) -> tuple[str, str]:
    """``FLYWHEEL_REPLAY_MIN_SIZE_TO_SAMPLE`` -> (``replay``, ``min_size_to_sample``); service "" if none."""
    for service in SETTINGS:
        prefix = f"FLYWHEEL_{service.upper()}_"
        if name.startswith(prefix):
            return service, name.removeprefix(prefix).lower()
    return "", name


def check_settings(variables: dict[str, str], where: str) -> None:
    """Every FLYWHEEL_* variable names a field of its service, and the values build valid settings."""
    by_service: dict[str, dict[str, str]] = {}
    for name, value in variables.items():
        if not name.startswith("FLYWHEEL_"):
            continue
        service, field = split_var(name)
        assert service, f"{where}: {name} does not start with FLYWHEEL_<SERVICE>_ ({', '.join(SETTINGS)})"
        assert field in SETTINGS[service].model_fields, (
            f"{where}: {name} is not a setting of {service} (fields: {', '.join(SETTINGS[service].model_fields)})")
        by_service.setdefault(service, {})[field] = value
    for service, values in by_service.items():
        SETTINGS[service](**values)  # raises on a bad value ("tru", "1e5" for an int, ...)


# ---- compose ---------------------------------------------------------------------------------------------------

def test_compose_parses_with_the_services() -> None:
    services = compose()["services"]
    for name in (*FLYWHEEL_SERVICES, "prometheus", "grafana"):
        assert name in services, f"docker-compose.yml has no service {name}"
    for name in FLYWHEEL_SERVICES:
        assert services[name]["command"][0] == name, f"{name} must run `flywheel {name}`"
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile"
        assert services[name]["build"]["target"] == "cpu", "CPU by default; the GPU is docker-compose.gpu.yml"


def test_actor_is_scalable() -> None:
    actor = compose()["services"]["actor"]
    assert "container_name" not in actor, "container_name breaks `docker compose up --scale actor=N`"
    assert "ports" not in actor, "host ports break `--scale actor=N`; actors only connect out"
    assert "hostname" not in actor, "replicas would share one instance name"


def test_no_service_has_a_container_name_or_public_port() -> None:
    for name, service in compose()["services"].items():
        assert "container_name" not in service, name
        for port in service.get("ports", []):
            published = compose_default(port if isinstance(port, str) else port.get("host_ip", ""))
            assert published.startswith("127.0.0.1:") or published == "127.0.0.1", (
                f"{name} publishes {port!r} on every interface; bind it to 127.0.0.1")


def test_gateway_http_is_published_on_loopback() -> None:
    ports = [compose_default(p) for p in compose()["services"]["gateway"]["ports"]]
    assert "127.0.0.1:8080:8080" in ports


def test_compose_dependencies_wait_for_health() -> None:
    services = compose()["services"]
    for name in FLYWHEEL_SERVICES:
        assert services[name].get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name, wanted in {"replay": {"gateway"}, "learner": {"gateway", "replay"},
                         "actor": {"gateway", "replay", "learner"}}.items():
        deps = services[name]["depends_on"]
        assert set(deps) == wanted, name
        for dep in deps:
            assert deps[dep]["condition"] == "service_healthy", f"{name} -> {dep}"


def test_compose_defaults_to_cartpole_and_cpu() -> None:
    services = compose()["services"]
    for name in ("learner", "actor"):
        env = environment(services[name])
        key = f"FLYWHEEL_{name.upper()}_ENV_ID"
        assert env[key] == "${FLYWHEEL_ENV_ID:-CartPole-v1}", "learner and actors share one overridable env id"
    assert "deploy" not in services["learner"], "GPU reservations belong in docker-compose.gpu.yml (opt-in)"


def test_gpu_override_reserves_an_nvidia_gpu_for_the_learner() -> None:
    learner = load_yaml(COMPOSE_GPU)["services"]["learner"]
    devices = learner["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    assert learner["build"]["target"] == "cuda"


def test_compose_volumes_are_declared() -> None:
    doc = compose()
    declared = set(doc.get("volumes") or {})
    for name, service in doc["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith((".", "/")):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
    for name in ("replay", "learner"):
        assert any(v.endswith(":/data") for v in doc["services"][name]["volumes"]), f"{name} checkpoints"


@pytest.mark.parametrize("path", [COMPOSE, COMPOSE_GPU], ids=lambda p: p.name)
def test_compose_flywheel_variables_are_settings_fields(path: Path) -> None:
    for name, service in load_yaml(path)["services"].items():
        env = environment(service)
        check_settings({k: compose_default(v) for k, v in env.items()}, f"{path.name} {name}")
        for key in env:
            if key.startswith("FLYWHEEL_"):
                assert split_var(key)[0] == name, f"{path.name}: {name} sets another service's variable {key}"


def test_compose_interpolated_service_variables_are_settings_fields() -> None:
    for path in (COMPOSE, COMPOSE_GPU):
        for var, _ in DEFAULT_RE.findall(path.read_text()):
            service, field = split_var(var)
            if service:
                assert field in SETTINGS[service].model_fields, f"{path.name}: ${{{var}}} is no setting"


def test_compose_and_configmap_defaults_follow_the_vector_preset() -> None:
    from flywheel.run import VECTOR_PRESET

    services = compose()["services"]
    configmap = k8s_objects("ConfigMap")["flywheel-config"]["data"]
    for service, values in VECTOR_PRESET.items():
        env = {k: compose_default(v) for k, v in environment(services[service]).items()}
        for field, value in values.items():
            key = f"FLYWHEEL_{service.upper()}_{field.upper()}"
            if key in env:
                assert env[key] == value, f"docker-compose.yml {key}={env[key]}, `flywheel run` uses {value}"
            if key in configmap:
                assert configmap[key] == value, f"k8s ConfigMap {key}={configmap[key]}, `flywheel run` uses {value}"


# ---- Kubernetes ------------------------------------------------------------------------------------------------

def test_k8s_has_no_kustomization() -> None:
    assert not list(K8S.glob("kustomization.y*ml")), "`kubectl apply -f k8s` would fail on a kustomization file"
    assert (K8S / "00-namespace.yaml").exists()


def test_k8s_documents_are_well_formed() -> None:
    docs = k8s_docs()
    assert docs
    seen = set()
    for filename, doc in docs:
        for key in ("apiVersion", "kind", "metadata"):
            assert key in doc, f"{filename}: a document has no {key}"
        assert doc["metadata"].get("name"), f"{filename}: {doc['kind']} has no metadata.name"
        if doc["kind"] not in CLUSTER_SCOPED:
            assert doc["metadata"].get("namespace") == NAMESPACE, f"{filename}: {doc['kind']} not in {NAMESPACE}"
        ident = (doc["kind"], doc["metadata"]["name"])
        assert ident not in seen, f"{filename}: duplicate {ident}"
        seen.add(ident)


def test_k8s_containers_have_resources_probes_and_run_as_non_root() -> None:
    for name, spec in pod_specs():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"].get("runAsUser", 1) != 0, name
        for container in spec["containers"]:
            where = f"{name}/{container['name']}"
            resources = container.get("resources", {})
            for kind in ("cpu", "memory"):
                assert kind in resources.get("requests", {}), f"{where}: no {kind} request"
                assert kind in resources.get("limits", {}), f"{where}: no {kind} limit"
            assert "livenessProbe" in container, f"{where}: no livenessProbe"
            assert "readinessProbe" in container, f"{where}: no readinessProbe"
            assert container.get("securityContext", {}).get("allowPrivilegeEscalation") is False, where


def test_k8s_workloads() -> None:
    deployments, statefulsets = k8s_objects("Deployment"), k8s_objects("StatefulSet")
    services = k8s_objects("Service")
    assert deployments["actor"]["spec"]["replicas"] == 8
    replay = statefulsets["replay"]["spec"]
    assert replay["volumeClaimTemplates"], "replay keeps checkpoints on a volume"
    assert services[replay["serviceName"]]["spec"]["clusterIP"] == "None", "replay needs a headless Service"
    learner = deployments["learner"]["spec"]["template"]["spec"]["containers"][0]
    assert str(learner["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    gateway = deployments["gateway"]["spec"]["template"]["spec"]["containers"][0]
    for probe in ("livenessProbe", "readinessProbe"):
        assert gateway[probe]["httpGet"]["path"] == "/healthz"
    for name in FLYWHEEL_SERVICES:
        workload = deployments.get(name) or statefulsets[name]
        container = workload["spec"]["template"]["spec"]["containers"][0]
        assert container["args"][0] == name, f"{name} must run `flywheel {name}`"


def test_k8s_references_resolve() -> None:
    configmaps, secrets, services = k8s_objects("ConfigMap"), k8s_objects("Secret"), k8s_objects("Service")
    claims = k8s_objects("PersistentVolumeClaim")
    templates = {}
    for _, doc in k8s_docs():
        if doc["kind"] in WORKLOAD_KINDS:
            selector = doc["spec"]["selector"]["matchLabels"]
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert selector.items() <= labels.items(), f"{doc['metadata']['name']}: selector does not match labels"
            templates[doc["metadata"]["name"]] = doc["spec"]["template"]
    for name, service in services.items():
        selector = service["spec"]["selector"]
        assert any(selector.items() <= t["metadata"]["labels"].items() for t in templates.values()), (
            f"Service {name} selects no pod")
    for name, template in templates.items():
        spec = template["spec"]
        for container in spec["containers"]:
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps, name
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, name
            ports = {p["name"] for p in container.get("ports", [])}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                for handler in ("httpGet", "tcpSocket"):
                    port = container.get(probe, {}).get(handler, {}).get("port")
                    if isinstance(port, str):
                        assert port in ports, f"{name}: {probe} uses unknown port {port}"
        for volume in spec.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["claimName"] in claims, name
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps, name


def test_k8s_configmap_variables_are_settings_fields() -> None:
    for name, configmap in k8s_objects("ConfigMap").items():
        data = configmap.get("data", {})
        for key, value in data.items():
            assert isinstance(value, str), f"ConfigMap {name}: {key} must be a string (quote it)"
        check_settings(data, f"ConfigMap {name}")
    data = k8s_objects("ConfigMap")["flywheel-config"]["data"]
    assert data["FLYWHEEL_ACTOR_ENV_ID"] == data["FLYWHEEL_LEARNER_ENV_ID"]
    for service in FLYWHEEL_SERVICES:
        assert data[f"FLYWHEEL_{service.upper()}_TELEMETRY_ENDPOINT"].endswith(":5558")
        assert data[f"FLYWHEEL_{service.upper()}_CONTROL_ENDPOINT"].endswith(":5559")


def test_k8s_secret_holds_only_gateway_settings() -> None:
    for name, secret in k8s_objects("Secret").items():
        check_settings({**secret.get("stringData", {})}, f"Secret {name}")


# ---- Dockerfile ------------------------------------------------------------------------------------------------

def dockerfile_stages() -> dict[str, list[str]]:
    """Instructions (continuation lines joined, comments dropped) per stage name."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    stages: dict[str, list[str]] = {"": []}
    current = ""
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+\S+(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            current = match.group(1) or f"stage{len(stages)}"
            stages[current] = []
        stages[current].append(line)
    return stages


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_dockerfile_targets_run_as_non_root_with_a_healthcheck(target: str) -> None:
    stage = dockerfile_stages()[target]
    users = [line.split()[1] for line in stage if line.upper().startswith("USER ")]
    assert users, f"{target}: no USER"
    assert users[-1].split(":")[0] not in ("root", "0"), f"{target}: runs as root"
    assert any(line.upper().startswith("HEALTHCHECK ") for line in stage), f"{target}: no HEALTHCHECK"
    assert 'ENTRYPOINT ["flywheel"]' in stage, f"{target}: ENTRYPOINT must be [\"flywheel\"]"


def test_dockerfile_is_parametrised_and_pinned() -> None:
    stages = dockerfile_stages()
    args = " ".join(stages[""])
    assert "ARG BASE_IMAGE=python:3.11-slim" in args
    assert "ARG CUDA_BASE_IMAGE=" in args
    text = DOCKERFILE.read_text()
    assert "docker/build-wheels.sh" in text
    assert list(stages)[-1] == "cpu", "a plain `docker build` gives the cpu image"
    builder = (ROOT / "docker" / "build-wheels.sh").read_text()
    assert "--no-index" in builder and "--find-links" in builder, "offline wheelhouse builds"
    assert "--constraint" in builder


def test_dockerfile_copies_exist_and_pass_the_dockerignore() -> None:
    ignore = (ROOT / "docker" / "Dockerfile.dockerignore").read_text()
    for line in DOCKERFILE.read_text().splitlines():
        parts = line.split()
        if parts[:1] != ["COPY"] or any(p.startswith("--from") for p in parts):
            continue
        for source in [p for p in parts[1:-1] if not p.startswith("--")]:
            if source == ".":
                continue
            assert (ROOT / source).exists(), f"COPY of missing {source}"
            assert f"!{source}" in ignore, f"{source} is excluded from the build context"
    for needed in ("pyproject.toml", "flywheel/", "proto/", "services/", "docker/constraints.txt",
                   "docker/build-wheels.sh", "wheelhouse/"):
        assert f"!{needed}" in ignore, needed


def test_constraints_pin_every_runtime_dependency() -> None:
    def norm(name: str) -> str:
        return re.sub(r"[-_.]+", "-", name).lower()

    pins = {}
    for line in (ROOT / "docker" / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not pinned with =="
            pins[norm(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for requirement in project["dependencies"]:
        name = norm(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0])
        assert name in pins, f"docker/constraints.txt does not pin {name}"
    assert "+" not in pins["torch"], "pin torch without a local label so CPU and CUDA builds both match"


# ---- health check script ---------------------------------------------------------------------------------------

def healthcheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("flywheel_healthcheck", ROOT / "docker" / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_healthcheck_finds_the_service_and_its_port(monkeypatch: pytest.MonkeyPatch) -> None:
    hc = healthcheck()
    argv = ["/opt/venv/bin/python", "/opt/venv/bin/flywheel", "replay", "--sample-bind", "tcp://*:6000"]
    assert hc.service_of(argv) == "replay"
    assert hc.service_of(["/opt/venv/bin/python", "/opt/venv/bin/flywheel", "--help"]) is None
    assert hc.port_of(hc.setting(argv, "replay", "sample_bind", "tcp://*:5556"), 5556) == 6000
    monkeypatch.setenv("FLYWHEEL_GATEWAY_HTTP_PORT", "9001")
    assert hc.setting(["flywheel", "gateway"], "gateway", "http_port", "8080") == "9001"
    assert hc.setting(["flywheel", "gateway", "--http-port=9002"], "gateway", "http_port", "8080") == "9002"
    assert hc.port_of("ipc:///tmp/x", 5557) == 5557
    ok, _ = hc.check(["python", "flywheel", "actor"], pid=1)
    assert ok is hc.process_alive(1)


# ---- Prometheus and Grafana ------------------------------------------------------------------------------------

def gateway_jobs(config: dict[str, Any]) -> list[dict[str, Any]]:
    return [job for job in config["scrape_configs"]
            if any("gateway" in target for sc in job.get("static_configs", []) for target in sc["targets"])]


def test_prometheus_scrapes_the_gateway_with_honor_labels() -> None:
    configs = {"deploy/prometheus/prometheus.yml": load_yaml(PROMETHEUS),
               "k8s prometheus-config": yaml.safe_load(k8s_objects("ConfigMap")["prometheus-config"]["data"]
                                                       ["prometheus.yml"])}
    for where, config in configs.items():
        jobs = gateway_jobs(config)
        assert jobs, f"{where}: no job scrapes the gateway"
        for job in jobs:
            assert job.get("honor_labels") is True, f"{where}: {job['job_name']} needs honor_labels: true"
            assert job.get("metrics_path", "/metrics") == "/metrics"


def test_grafana_provisioning_and_dashboard() -> None:
    datasources = load_yaml(GRAFANA / "provisioning" / "datasources" / "prometheus.yml")["datasources"]
    uids = {ds["uid"] for ds in datasources if ds["type"] == "prometheus"}
    providers = load_yaml(GRAFANA / "provisioning" / "dashboards" / "flywheel.yml")["providers"]
    mounts = compose()["services"]["grafana"]["volumes"]
    assert any(m.startswith("./deploy/grafana/dashboards:" + providers[0]["options"]["path"]) for m in mounts)
    dashboards = list((GRAFANA / "dashboards").glob("*.json"))
    assert dashboards
    exprs = []
    for path in dashboards:
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            assert panel["datasource"]["uid"] in uids, f"{path.name}: {panel['title']} uses an unknown datasource"
            exprs += [target["expr"] for target in panel["targets"]]
    for wanted in ("rate(flywheel_actor_env_steps_total[1m])", "flywheel_replay_size_transitions",
                   "rate(flywheel_learner_updates_total[1m])", "flywheel_learner_loss", "flywheel_actor_epsilon",
                   "flywheel_learner_weight_version"):
        assert wanted in exprs, f"dashboard lacks {wanted}"
