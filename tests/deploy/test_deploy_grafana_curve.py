"""Grafana in k8s/ (generated ConfigMaps in step with deploy/grafana) and the CURVE keys switch in compose and k8s."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from types import ModuleType
from urllib.parse import urlparse

import pytest
import yaml
from deploy_helpers import (
    COMPOSE_CURVE,
    FLYWHEEL_SERVICES,
    GRAFANA,
    K8S,
    SETTINGS,
    check_settings,
    compose_default,
    environment,
    k8s_objects,
    load_yaml,
)

from flywheel import security

FIX = ("run: python deploy/grafana/build_k8s_configmap.py (after python deploy/grafana/build_dashboards.py when "
       "the panels changed)")
CURVE_DIR = "/run/secrets/flywheel-curve"
# what `kubectl create secret generic flywheel-curve --from-file=...` in docs/DEPLOY.md puts in the Secret
SECRET_FILES = {"server.key": "server.key", "server.key_secret": "server.key_secret",
                "client.key_secret": "client.key_secret", "authorized-client.key": "authorized/client.key"}


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_k8s_configmap", GRAFANA / "build_k8s_configmap.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- Grafana ---------------------------------------------------------------------------------------------------

def test_k8s_grafana_configmaps_match_deploy_grafana() -> None:
    module = builder()
    committed = (K8S / "grafana-config.yaml").read_text()
    assert committed == module.configmap_text(), f"k8s/grafana-config.yaml is out of step with deploy/grafana; {FIX}"
    maps = k8s_objects("ConfigMap")
    assert maps["grafana-dashboards"]["data"] == {p.name: p.read_text()
                                                  for p in sorted((GRAFANA / "dashboards").glob("*.json"))}, FIX
    assert set(maps["grafana-provisioning"]["data"]) == {
        f"{p.parent.name}-{p.name}" for p in (GRAFANA / "provisioning").glob("*/*.y*ml")}, FIX


def test_k8s_grafana_reads_the_prometheus_service_and_mounts_what_the_provisioning_names() -> None:
    provisioning = k8s_objects("ConfigMap")["grafana-provisioning"]["data"]
    datasources = [d for key, text in provisioning.items() if key.startswith("datasources-")
                   for d in yaml.safe_load(text)["datasources"]]
    url = urlparse(next(d["url"] for d in datasources if d["type"] == "prometheus"))
    prometheus = k8s_objects("Service")["prometheus"]
    assert url.hostname == f"{prometheus['metadata']['name']}.{prometheus['metadata']['namespace']}.svc"
    assert url.port in {p["port"] for p in prometheus["spec"]["ports"]}
    pod = k8s_objects("Deployment")["grafana"]["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    items = {i["key"]: i["path"] for i in volumes["provisioning"]["configMap"]["items"]}
    assert volumes["provisioning"]["configMap"]["name"] == "grafana-provisioning"
    assert items == {key: key.replace("-", "/", 1) for key in provisioning}, "every provisioning file, in its folder"
    assert mounts["provisioning"] == "/etc/grafana/provisioning"
    providers = [p for key, text in provisioning.items() if key.startswith("dashboards-")
                 for p in yaml.safe_load(text)["providers"]]
    assert volumes["dashboards"]["configMap"]["name"] == "grafana-dashboards"
    assert providers and all(p["options"]["path"] == mounts["dashboards"] for p in providers)
    service = k8s_objects("Service")["grafana"]
    assert service["spec"]["selector"].items() <= k8s_objects("Deployment")["grafana"]["spec"]["template"][
        "metadata"]["labels"].items()


def test_the_configmap_builder_refuses_a_file_it_cannot_write_as_a_block(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    module = builder()
    (tmp_path / "bad.json").write_text('{"a": 1}  \n')
    monkeypatch.setattr(module, "DASHBOARDS", tmp_path)
    with pytest.raises(SystemExit, match="trailing spaces"):
        module.configmap_text()


# ---- CURVE -----------------------------------------------------------------------------------------------------

def test_compose_curve_override_mounts_the_keys_where_every_service_looks() -> None:
    doc = load_yaml(COMPOSE_CURVE)
    assert compose_default(doc["secrets"]["flywheel-curve"]["file"]) == "./keys"
    assert set(doc["services"]) == set(FLYWHEEL_SERVICES)
    for name, service in doc["services"].items():
        (secret,) = service["secrets"]
        assert secret["source"] == "flywheel-curve"
        assert environment(service) == {f"FLYWHEEL_{name.upper()}_CURVE_KEYS_DIR": secret["target"]}


def commented_curve_lines() -> dict[str, str]:
    text = (K8S / "configmap.yaml").read_text()
    return dict(re.findall(r'^  # (FLYWHEEL_[A-Z]+_CURVE_KEYS_DIR): "([^"]+)"$', text, re.M))


def test_k8s_curve_switch_is_off_and_uncommenting_it_names_the_mounted_secret() -> None:
    data = k8s_objects("ConfigMap")["flywheel-config"]["data"]
    assert not [k for k in data if "CURVE" in k], "CURVE is off as shipped"
    switch = commented_curve_lines()
    assert set(switch) == {f"FLYWHEEL_{s.upper()}_CURVE_KEYS_DIR" for s in FLYWHEEL_SERVICES}
    check_settings({**data, **switch}, "k8s ConfigMap with the CURVE lines uncommented")
    for name in FLYWHEEL_SERVICES:
        workload = k8s_objects("Deployment").get(name) or k8s_objects("StatefulSet")[name]
        pod = workload["spec"]["template"]["spec"]
        mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
        assert mounts["curve-keys"]["mountPath"] == switch[f"FLYWHEEL_{name.upper()}_CURVE_KEYS_DIR"] == CURVE_DIR
        assert mounts["curve-keys"].get("readOnly") is True
        secret = {v["name"]: v for v in pod["volumes"]}["curve-keys"]["secret"]
        assert secret["secretName"] == "flywheel-curve" and secret["optional"] is True, name
        assert secret["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 10001, (
            f"{name}: keys readable by the pod's group only")


@pytest.mark.parametrize("service", FLYWHEEL_SERVICES)
def test_each_pod_gets_exactly_the_curve_files_its_service_needs(service: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    security.generate(keys)
    workload = k8s_objects("Deployment").get(service) or k8s_objects("StatefulSet")[service]
    volume = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}["curve-keys"]
    mounted = tmp_path / "mounted"
    for item in volume["secret"]["items"]:  # as the kubelet lays the Secret's keys out
        assert item["key"] in SECRET_FILES, f"{service}: the documented Secret has no key {item['key']}"
        target = mounted / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(keys / SECRET_FILES[item["key"]], target)
    settings = SETTINGS[service](curve_keys_dir=str(mounted))
    loaded = security.keys_from_settings(settings, service)  # refuses a folder missing what the service needs
    assert loaded is not None
    paths = {item["path"] for item in volume["secret"]["items"]}
    assert ("server.key_secret" in paths) == (service in security.BINDS), "server secrets only where they bind"
    assert ("client.key_secret" in paths) == (service in security.CONNECTS)
