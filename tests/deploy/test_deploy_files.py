"""Static checks of the compose files, Kubernetes manifests and monitoring wiring (offline, PyYAML only).

The external validators (docker compose config, the compose-spec schema, hadolint, kubernetes-validate, promtool)
are in test_deploy_tools.py; the images in test_deploy_images.py; the real thing in test_compose_real.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_helpers import (
    CLUSTER_SCOPED,
    COMPOSE,
    COMPOSE_GPU,
    DEFAULT_RE,
    FLYWHEEL_SERVICES,
    GRAFANA,
    K8S,
    NAMESPACE,
    PROMETHEUS,
    ROOT,
    SETTINGS,
    WORKLOAD_KINDS,
    check_settings,
    compose,
    compose_default,
    environment,
    k8s_docs,
    k8s_labels,
    k8s_objects,
    load_yaml,
    pod_specs,
    prometheus_config_files,
    split_var,
)

# ---- compose ---------------------------------------------------------------------------------------------------

def test_compose_parses_with_the_services() -> None:
    services = compose()["services"]
    for name in (*FLYWHEEL_SERVICES, "control-token", "curve-keys", "prometheus", "grafana"):
        assert name in services, f"docker-compose.yml has no service {name}"
    for name in FLYWHEEL_SERVICES:
        assert services[name]["command"][0] == name, f"{name} must run `flywheel {name}`"
    images = {name: services[name]["image"] for name in (*FLYWHEEL_SERVICES, "control-token")}
    builders = {name: s["build"] for name, s in services.items() if "build" in s}
    # one build per image: Compose would otherwise build the same image once per service, in parallel
    assert set(builders) == {"control-token", "actor"}, f"services with a build section: {sorted(builders)}"
    for build in builders.values():
        assert build["dockerfile"] == "docker/Dockerfile" and build["context"] == "."
        assert "target" not in build, "docker/Dockerfile builds one image per FLAVOR, its last stage"
    assert builders["control-token"]["args"]["FLAVOR"] == "services"
    assert builders["actor"]["args"]["FLAVOR"] == "actor"
    for name in ("gateway", "replay", "learner", "curve-keys"):
        assert services[name]["image"] == images["control-token"], f"{name} runs the services image"
    assert images["actor"] != images["gateway"], "actors run the smaller actor image"
    assert compose_default(builders["actor"]["args"]["BASE_IMAGE"]) == "python:3.11-slim"


def test_control_token_reaches_the_gateway_as_a_file() -> None:
    services = compose()["services"]
    token, gateway = services["control-token"], services["gateway"]
    assert token["entrypoint"] == ["flywheel-control-token"] and token["restart"] == "no"
    assert gateway["depends_on"]["control-token"]["condition"] == "service_completed_successfully"
    env = environment(gateway)
    path = env["FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE"]
    assert "FLYWHEEL_GATEWAY_CONTROL_TOKEN" not in env, "the token travels as a file, not in the container config"
    mounts = {v.split(":")[1]: v for v in gateway["volumes"]}
    folder = str(Path(path).parent)
    assert mounts[folder].endswith(":ro"), "the gateway reads the token read-only"
    assert any(v.split(":")[1] == folder for v in token["volumes"]), "control-token writes where the gateway reads"


def test_flywheel_containers_are_hardened() -> None:
    services = compose()["services"]
    for name in (*FLYWHEEL_SERVICES, "control-token", "curve-keys"):
        s = services[name]
        assert s.get("read_only") is True, f"{name}: read-only root file system (as in k8s/)"
        wanted = ["/tmp:exec"] if name == "learner" else ["/tmp"]  # torch.compile loads its kernels from /tmp
        assert s.get("tmpfs") == wanted, f"{name}: a private /tmp mounted as {wanted}, got {s.get('tmpfs')}"
        assert s.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in s.get("security_opt", []), name
        assert "user" not in s or str(s["user"]).split(":")[0] not in ("0", "root"), name


def test_flywheel_services_have_a_memory_limit() -> None:
    """The backstop for what libzmq queues before a message can be checked (docs/RELIABILITY.md)."""
    services = compose()["services"]
    for name in FLYWHEEL_SERVICES:
        limit = compose_default(services[name].get("mem_limit", ""))
        assert limit[:-1].isdigit() and limit[-1] in "mg", f"{name}: mem_limit with a default, got {limit!r}"


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
    for name, wanted in {"gateway": {"control-token"}, "replay": {"gateway"}, "learner": {"gateway", "replay"},
                         "actor": {"gateway", "replay", "learner"}}.items():
        deps = services[name]["depends_on"]
        assert set(deps) == wanted | {"curve-keys"}, name
        for dep in deps:
            one_shot = dep in ("control-token", "curve-keys")
            expected = "service_completed_successfully" if one_shot else "service_healthy"
            assert deps[dep]["condition"] == expected, f"{name} -> {dep}"


def test_compose_defaults_to_the_default_job_and_cpu() -> None:
    from flywheel.launch.runplan import DEFAULT_ENV

    services = compose()["services"]
    for name in ("replay", "learner", "actor"):
        env = environment(services[name])
        key = f"FLYWHEEL_{name.upper()}_ENV_ID"
        assert env[key] == f"${{FLYWHEEL_ENV_ID:-{DEFAULT_ENV}}}", "replay, learner and actors share one env id"
        assert env[f"FLYWHEEL_{name.upper()}_PRESET"] == "${FLYWHEEL_PRESET:-}", "empty: the env id's preset"
    assert "deploy" not in services["learner"], "GPU reservations belong in docker-compose.gpu.yml (opt-in)"


def test_gpu_override_reserves_an_nvidia_gpu_for_the_learner() -> None:
    learner = load_yaml(COMPOSE_GPU)["services"]["learner"]
    devices = learner["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}]
    args = learner["build"]["args"]
    assert compose_default(args["BASE_IMAGE"]).startswith("nvidia/cuda:"), "the CUDA image's base"
    assert "/whl/cu" in compose_default(args["TORCH_INDEX_URL"]), "torch's CUDA wheels"
    assert args["FLAVOR"] == "services"
    assert environment(learner)["FLYWHEEL_LEARNER_DEVICE"] == "cuda"


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
        if name == "control-token":  # not a Flywheel service: docker/control-token.py reads FLYWHEEL_CONTROL_TOKEN
            assert set(environment(service)) == {"FLYWHEEL_CONTROL_TOKEN"}
            continue
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


def test_compose_and_configmap_leave_the_tuned_values_to_the_presets() -> None:
    """Each tuned value is written once, in flywheel/presets/*.yaml: compose passes a variable through (empty by
    default: the preset's value stays) and the ConfigMap does not set it; both run the default job."""
    from flywheel import presets
    from flywheel.launch.runplan import DEFAULT_ENV

    services = compose()["services"]
    configmap = k8s_objects("ConfigMap")["flywheel-config"]["data"]
    for name in presets.names():
        for service in presets.SERVICES:
            env = {k: compose_default(v) for k, v in environment(services[service]).items()}
            for field in presets.load(name).as_variables(service):
                key = f"FLYWHEEL_{service.upper()}_{field}"
                assert env.get(key, "") == "", f"docker-compose.yml sets {key}={env[key]}: the {name} preset's value"
                assert key not in configmap, f"k8s ConfigMap sets {key}: a value of the {name} preset"
    for service in ("replay", "learner", "actor"):
        assert configmap[f"FLYWHEEL_{service.upper()}_ENV_ID"] == DEFAULT_ENV


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
    assert "nvidia.com/gpu" not in learner["resources"]["limits"], "a GPU is opt-in (k8s/gpu/learner-gpu.yaml)"
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
    assert data["FLYWHEEL_ACTOR_ENV_ID"] == data["FLYWHEEL_LEARNER_ENV_ID"] == data["FLYWHEEL_REPLAY_ENV_ID"]
    for service in FLYWHEEL_SERVICES:
        assert data[f"FLYWHEEL_{service.upper()}_TELEMETRY_ENDPOINT"].endswith(":5558")
        assert data[f"FLYWHEEL_{service.upper()}_CONTROL_ENDPOINT"].endswith(":5559")


COMPONENTS = {"gateway": "gateway", "replay": "replay", "learner": "learner", "actor": "actor",
              "prometheus": "monitoring", "grafana": "monitoring", "flywheel": "config"}


def test_k8s_objects_and_pods_carry_the_recommended_labels() -> None:
    for filename, doc in k8s_docs():
        labels = doc["metadata"].get("labels", {})
        name = labels.get("app.kubernetes.io/name")
        where = f"{filename}: {doc['kind']} {doc['metadata']['name']}"
        assert name in COMPONENTS, f"{where}: app.kubernetes.io/name is {name!r}"
        wanted = k8s_labels(name, None if doc["kind"] == "Namespace" else COMPONENTS[name])
        assert labels == wanted, f"{where}: labels {labels}, want {wanted}"
        templates = [doc["spec"]["template"]] if doc["kind"] in WORKLOAD_KINDS else []
        templates += doc["spec"].get("volumeClaimTemplates", []) if doc["kind"] == "StatefulSet" else []
        for template in templates:
            assert template["metadata"]["labels"] == wanted, f"{where}: its pods/claims need the same labels"


def test_replay_has_a_disruption_budget_that_keeps_its_one_pod() -> None:
    budgets = k8s_objects("PodDisruptionBudget")
    assert set(budgets) == {"replay"}
    spec = budgets["replay"]["spec"]
    replay = k8s_objects("StatefulSet")["replay"]["spec"]
    assert spec["selector"]["matchLabels"] == replay["selector"]["matchLabels"]
    assert spec["minAvailable"] == replay["replicas"] == 1, "drains wait instead of evicting the only replay"
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow", "a replay that is not ready must not block drains"


def test_learner_resumes_automatically_in_compose_and_k8s() -> None:
    env = environment(compose()["services"]["learner"])
    assert compose_default(env["FLYWHEEL_LEARNER_RESUME"]) == "auto"
    assert env["FLYWHEEL_LEARNER_CHECKPOINT_DIR"].startswith("/data/")
    data = k8s_objects("ConfigMap")["flywheel-config"]["data"]
    assert data["FLYWHEEL_LEARNER_RESUME"] == "auto" and data["FLYWHEEL_LEARNER_CHECKPOINT_DIR"].startswith("/data/")
    for path in (COMPOSE_GPU,):  # the override does not turn it back
        assert "FLYWHEEL_LEARNER_RESUME" not in environment(load_yaml(path)["services"].get("learner", {}))


def test_k8s_control_token_secret_reaches_the_gateway_as_a_file() -> None:
    secret = k8s_objects("Secret")["flywheel-gateway"]
    assert set(secret["stringData"]) == {"control-token"}
    assert secret["stringData"]["control-token"] == "", "never ship a token; the init container makes one"
    pod = k8s_objects("Deployment")["gateway"]["spec"]["template"]["spec"]
    init = {c["name"]: c for c in pod["initContainers"]}["control-token"]
    assert init["command"] == ["flywheel-control-token"]
    ref = {e["name"]: e for e in init["env"]}["FLYWHEEL_CONTROL_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "flywheel-gateway", "key": "control-token", "optional": True}
    out = {e["name"]: e["value"] for e in init["env"] if "value" in e}["FLYWHEEL_CONTROL_TOKEN_PATH"]
    gateway = pod["containers"][0]
    read = {e["name"]: e["value"] for e in gateway["env"]}["FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE"]
    assert read == out
    mounts = {m["name"]: m for m in gateway["volumeMounts"]}
    assert mounts["control-token"]["mountPath"] == str(Path(read).parent) and mounts["control-token"]["readOnly"]
    volume = {v["name"]: v for v in pod["volumes"]}["control-token"]
    assert volume["emptyDir"]["medium"] == "Memory", "the token never touches the node's disk"


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


def test_k8s_prometheus_config_is_deploy_prometheus() -> None:
    """The ConfigMap holds deploy/prometheus's config (with the in-cluster gateway) and every rule file it names."""
    data = k8s_objects("ConfigMap")["prometheus-config"]["data"]
    expected = prometheus_config_files()
    fix = "run: python tests/deploy/deploy_helpers.py --write-k8s-prometheus"
    assert set(data) == set(expected), f"k8s prometheus-config has {sorted(data)}, wants {sorted(expected)}; {fix}"
    for name, text in expected.items():
        assert yaml.safe_load(data[name]) == yaml.safe_load(text), f"k8s prometheus-config {name} differs; {fix}"


def test_grafana_provisioning_is_mounted_where_it_points() -> None:
    """Compose mounts the gateway engineer's deploy/grafana folders whole; their paths and URLs must meet."""
    grafana = compose()["services"]["grafana"]
    mounts = dict(m.split(":")[:2] for m in grafana["volumes"])
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dashboards_dir = mounts["./deploy/grafana/dashboards"]
    providers = [p for f in sorted((GRAFANA / "provisioning" / "dashboards").glob("*.y*ml"))
                 for p in load_yaml(f)["providers"]]
    assert providers and all(p["options"]["path"].startswith(dashboards_dir) for p in providers)
    datasources = [d for f in sorted((GRAFANA / "provisioning" / "datasources").glob("*.y*ml"))
                   for d in load_yaml(f)["datasources"]]
    urls = {d["url"] for d in datasources if d["type"] == "prometheus"}
    assert urls == {"http://prometheus:9090"}, f"Grafana must reach the compose service prometheus, got {urls}"
    dashboards = sorted((GRAFANA / "dashboards").rglob("*.json"))
    assert dashboards, "no dashboard to provision"
    for path in dashboards:
        assert isinstance(json.loads(path.read_text()).get("panels"), list), path.name
    prometheus = compose()["services"]["prometheus"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/" + PROMETHEUS.name in prometheus["command"]
