"""Loaders and checks shared by the static deploy tests: compose files, k8s manifests, settings variables."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic_settings import BaseSettings

from flywheel.services.actor.settings import ActorSettings
from flywheel.services.gateway.settings import GatewaySettings
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.replay.settings import ReplaySettings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GPU = ROOT / "docker-compose.gpu.yml"
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "Dockerfile"
K8S = ROOT / "k8s"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana"

SETTINGS: dict[str, type[BaseSettings]] = {
    "actor": ActorSettings, "replay": ReplaySettings, "learner": LearnerSettings, "gateway": GatewaySettings,
}
FLYWHEEL_SERVICES = ("gateway", "replay", "learner", "actor")
CURVE_DIR = "/run/secrets/flywheel-curve"  # where compose and k8s mount the CURVE keys in every Flywheel container
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
        if value != "":  # as the services read variables: an empty one is ignored (env_ignore_empty)
            by_service.setdefault(service, {})[field] = value
    for service, values in by_service.items():
        SETTINGS[service](**values)  # raises on a bad value ("tru", "1e5" for an int, ...)


def k8s_labels(name: str, component: str | None) -> dict[str, str]:
    """The recommended app.kubernetes.io labels every object in k8s/ carries (component: not on the Namespace)."""
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "flywheel"}
    if component:
        labels["app.kubernetes.io/component"] = component
    return {**labels, "app.kubernetes.io/part-of": "flywheel", "app.kubernetes.io/managed-by": "kubectl"}


# ---- the Kubernetes copy of deploy/prometheus ------------------------------------------------------------------

PROMETHEUS_K8S = K8S / "prometheus.yaml"
COMPOSE_GATEWAY_TARGET = '"gateway:8080"'
K8S_GATEWAY_TARGET = '"gateway.flywheel.svc:8080"'


def prometheus_config_files() -> dict[str, str]:
    """deploy/prometheus's prometheus.yml and the rule files it names, as the k8s ConfigMap must hold them."""
    folder = PROMETHEUS.parent
    config = PROMETHEUS.read_text()
    files = {PROMETHEUS.name: config.replace(COMPOSE_GATEWAY_TARGET, K8S_GATEWAY_TARGET)}
    for name in yaml.safe_load(config).get("rule_files") or []:
        files[name] = (folder / name).read_text()
    return files


def prometheus_configmap_text() -> str:
    """The ConfigMap document of k8s/prometheus.yaml, generated from deploy/prometheus."""
    lines = ["apiVersion: v1", "kind: ConfigMap", "metadata:", "  name: prometheus-config", "  namespace: flywheel",
             "  labels:", *(f"    {key}: {value}" for key, value in k8s_labels("prometheus", "monitoring").items()),
             "data:"]
    for name, text in prometheus_config_files().items():
        lines.append(f"  {name}: |")
        lines += [f"    {line}".rstrip() for line in text.rstrip("\n").splitlines()]
    return "\n".join(lines) + "\n"


def write_k8s_prometheus_configmap() -> None:
    """Replace the ConfigMap document (the first one) of k8s/prometheus.yaml, keeping the header and the rest."""
    text = PROMETHEUS_K8S.read_text()
    start = text.index("apiVersion: v1\nkind: ConfigMap")
    end = text.index("\n---\n", start)
    PROMETHEUS_K8S.write_text(text[:start] + prometheus_configmap_text() + text[end + 1:])


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--write-k8s-prometheus"]:
        raise SystemExit("usage: python tests/deploy/deploy_helpers.py --write-k8s-prometheus")
    write_k8s_prometheus_configmap()
    print(f"wrote the prometheus-config ConfigMap in {PROMETHEUS_K8S} from {PROMETHEUS.parent}")
