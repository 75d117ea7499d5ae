"""Grafana in k8s/ (generated ConfigMaps in step with deploy/grafana) and CURVE, on as shipped in compose and k8s."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from types import ModuleType
from urllib.parse import urlparse

import pytest
import yaml
import zmq
import zmq.auth
from deploy_helpers import (
    COMPOSE,
    CURVE_DIR,
    FLYWHEEL_SERVICES,
    GRAFANA,
    K8S,
    ROOT,
    SETTINGS,
    compose,
    k8s_objects,
)

from flywheel import presets, security
from flywheel.cli import main as flywheel
from flywheel.services.actor.settings import ActorSettings
from flywheel.services.replay.settings import ReplaySettings
from flywheel.settings import setting_default
from flywheel.zap import ZapHandler

FIX = ("run: python deploy/grafana/build_k8s_configmap.py (after python deploy/grafana/build_dashboards.py when "
       "the panels changed)")
# the one documented command that makes the Kubernetes Secret (docs/DEPLOY.md, k8s/configmap.yaml)
K8S_KEYS = "flywheel keys generate keys/ && kubectl -n flywheel create secret generic flywheel-curve --from-file=keys/"
# a key for an actor on another host, under compose (docs/DEPLOY.md, docker-compose.yml)
COMPOSE_CLIENT = "docker compose run --rm curve-keys --client NAME"
ROLES_DIR = "/run/flywheel-roles"  # where compose's one-shot lays out each role's volume (docker/Dockerfile makes it)
ROLE_KEYS = {f"{role}.{kind}" for role in security.ROLES for kind in ("key", "key_secret")}
# the services whose client keys each server admits: who connects to whom (k8s/networkpolicy.yaml's edges)
CLIENTS_OF = {"gateway": {"learner", "replay", "actor"}, "replay": {"learner", "actor"}, "learner": {"actor"},
              "actor": set()}


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

def secret_from_folder(folder: Path) -> dict[str, bytes]:
    """What `kubectl create secret generic NAME --from-file=folder/` stores: each regular file at the top of the
    folder under its name; subfolders (authorized/, clients/) and anything but regular files are skipped."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file() and not p.is_symlink()}


def workload_pod(service: str) -> dict:
    workload = k8s_objects("Deployment").get(service) or k8s_objects("StatefulSet")[service]
    return workload["spec"]["template"]["spec"]


def test_the_documented_key_commands_are_the_ones_checked_here() -> None:
    def flat(text: str) -> str:
        return " ".join(text.replace("#", " ").split())

    deploy = flat((ROOT / "docs" / "DEPLOY.md").read_text())
    assert K8S_KEYS in deploy and K8S_KEYS in flat((K8S / "configmap.yaml").read_text())
    assert COMPOSE_CLIENT in deploy and COMPOSE_CLIENT in flat(COMPOSE.read_text())
    assert "docker-compose.curve" not in deploy + flat(COMPOSE.read_text()), "the override file is gone"


def test_k8s_ships_with_curve_on_and_pods_wait_for_the_secret() -> None:
    data = k8s_objects("ConfigMap")["flywheel-config"]["data"]
    curve = {k: v for k, v in data.items() if "_CURVE_" in k or "PLAINTEXT" in k}
    assert curve == {f"FLYWHEEL_{s.upper()}_CURVE_KEYS_DIR": CURVE_DIR for s in FLYWHEEL_SERVICES}
    assert "flywheel-curve" not in k8s_objects("Secret"), "no keys in git: the Secret comes from one command"
    for name in FLYWHEEL_SERVICES:
        pod = workload_pod(name)
        container = pod["containers"][0]
        env = [e["name"] for e in container.get("env", [])]
        assert not [n for n in env if "_CURVE_" in n or "PLAINTEXT" in n], f"{name}: the ConfigMap says it"
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):  # flywheel-healthcheck connects to nothing
            assert "tcpSocket" not in container.get(probe, {}), f"{name}: a bare TCP probe is a refused handshake"
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["curve-keys"]["mountPath"] == CURVE_DIR and mounts["curve-keys"].get("readOnly") is True
        secret = {v["name"]: v for v in pod["volumes"]}["curve-keys"]["secret"]
        assert secret["secretName"] == "flywheel-curve", name
        assert secret.get("optional", False) is False, f"{name}: must wait for the keys, never start in plaintext"
        assert secret["defaultMode"] == 0o440 and pod["securityContext"]["fsGroup"] == 10001, (
            f"{name}: keys readable by the pod's group only")


@pytest.mark.parametrize("service", FLYWHEEL_SERVICES)
def test_each_pod_gets_exactly_the_curve_files_its_service_needs(service: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    assert flywheel(["keys", "generate", str(keys), "--client", "remote-1"]) == 0
    secret = secret_from_folder(keys)
    assert set(secret) == {"server.key", "server.key_secret", *ROLE_KEYS}
    volume = {v["name"]: v for v in workload_pod(service)["volumes"]}["curve-keys"]
    mounted = tmp_path / "mounted"
    for item in volume["secret"]["items"]:  # as the kubelet lays the Secret's keys out
        assert item["key"] in secret, f"{service}: the documented Secret has no key {item['key']}"
        target = mounted / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(secret[item["key"]])
    settings = SETTINGS[service](curve_keys_dir=str(mounted))
    loaded = security.keys_from_settings(settings, service)  # refuses a folder missing what the service needs
    assert loaded is not None
    paths = {item["path"] for item in volume["secret"]["items"]}
    assert ("server.key_secret" in paths) == (service in security.BINDS), "server secrets only where they bind"
    own = {p for p in paths if p.endswith(".key_secret")} - {"server.key_secret"}
    assert own == ({f"{service}.key_secret"} if service in security.CONNECTS else set()), "its own client key only"
    assert {p for p in paths if p.startswith("authorized/")} == {f"authorized/{c}.key" for c in CLIENTS_OF[service]}
    if service in security.CONNECTS:  # the gateway hears it as its own role, and only as that
        names = dict(security.load_keys(keys).names)  # type: ignore[union-attr]
        assert security.key_role(names[loaded.client_public]) == service  # type: ignore[index]


def handshake(server: security.CurveKeys, client_public: bytes, client_secret: bytes, timeout_ms: int) -> bool:
    """One REQ/REP round trip over TCP with CURVE, the server admitting ``server.authorized`` through ZAP."""
    ctx = zmq.Context()
    try:
        handler = ZapHandler(ctx, server.authorized)
        rep = ctx.socket(zmq.REP)
        rep.setsockopt(zmq.ZAP_DOMAIN, security.ZAP_DOMAIN)
        rep.setsockopt(zmq.CURVE_SECRETKEY, server.server_secret)
        rep.setsockopt(zmq.CURVE_SERVER, 1)
        rep.bind("tcp://127.0.0.1:0")
        req = ctx.socket(zmq.REQ)
        req.setsockopt(zmq.CURVE_SERVERKEY, server.server_public)
        req.setsockopt(zmq.CURVE_PUBLICKEY, client_public)
        req.setsockopt(zmq.CURVE_SECRETKEY, client_secret)
        req.setsockopt(zmq.SNDTIMEO, timeout_ms)  # a REQ whose only peer was refused has no pipe: send would block
        req.connect(rep.getsockopt(zmq.LAST_ENDPOINT).decode())
        try:
            req.send(b"ping")
        except zmq.Again:  # refused before the send: the pipe was already gone
            assert handler.refused["unauthorized_key"] >= 1, "refused by ZAP, not lost"
            return False
        if not rep.poll(timeout_ms):
            assert handler.refused["unauthorized_key"] >= 1, "refused by ZAP, not lost"
            return False
        rep.send(rep.recv() + b"-pong")
        return req.poll(timeout_ms) != 0 and req.recv() == b"ping-pong"
    finally:
        ctx.destroy(linger=0)


def test_compose_curve_keys_one_shot_is_idempotent_and_adds_clients_that_get_in(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The one-shot's own command line: keys made once and kept, `--client NAME` added later, and the added client
    admitted by servers that load the folder (what `docker compose restart gateway replay learner` does)."""
    entrypoint = compose()["services"]["curve-keys"]["entrypoint"]
    assert entrypoint[:3] == ["flywheel", "keys", "generate"] and "--if-missing" in entrypoint
    assert CURVE_DIR in entrypoint and ROLES_DIR in entrypoint, "it writes where the services' volumes are"
    keys, roles = tmp_path / "keys", tmp_path / "roles"
    argv = [{CURVE_DIR: str(keys), ROLES_DIR: str(roles)}.get(arg, arg) for arg in entrypoint[1:]]
    assert flywheel(argv) == 0
    made = {p: p.read_bytes() for p in keys.rglob("*") if p.is_file()}
    assert {p.relative_to(keys).as_posix() for p in made} == {
        "server.key", "server.key_secret", *ROLE_KEYS, *(f"authorized/{role}.key" for role in security.ROLES)}
    assert flywheel(argv) == 0 and "kept the keys" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in keys.rglob("*") if p.is_file()} == made, "a second `up` changes nothing"
    assert flywheel(["keys", "generate", str(keys)]) == 2 and "--if-missing" in capsys.readouterr().err

    assert flywheel([*argv, "--client", "remote-1"]) == 0  # docker compose run --rm curve-keys --client remote-1
    out = capsys.readouterr().out
    remote = keys / "clients" / "remote-1"
    client = security.keys_from_settings(SETTINGS["actor"](curve_keys_dir=str(remote)), "actor")
    assert client is not None and client.client_public is not None and client.client_secret is not None
    assert f"public key {client.client_public.decode()}" in out, "printed for ..._CURVE_AUTHORIZED_KEYS elsewhere"
    assert all(path.read_bytes() == data for path, data in made.items()), "the existing keys stay"
    assert (remote / "server.key").read_bytes() == made[keys / "server.key"]

    server = security.keys_from_settings(SETTINGS["replay"](curve_keys_dir=str(roles / "replay")), "replay")
    assert server is not None and client.client_public in server.authorized, "the role volumes are laid out again"
    assert handshake(server, client.client_public, client.client_secret, 5000), "the added client gets in"
    stranger_public, stranger_secret = zmq.curve_keypair()
    assert not handshake(server, stranger_public, stranger_secret, 1000), "an unknown key is refused"


@pytest.mark.parametrize("preset", presets.names())
def test_transitions_flow_over_curve_with_the_deployments_high_water_marks(preset: str) -> None:
    """The actor -> replay PUSH/PULL as compose and k8s set it up (CURVE through the real ZAP handler, the replay's
    transitions_hwm and the actors' send_hwm as each preset gives them: the ConfigMap and compose set neither):
    every message arrives. With RCVHWM=1 (the vector preset), libzmq 4.3.5 stalls the pipe when the ZAP reply
    carries a user id, so the replay would receive nothing."""
    data = k8s_objects("ConfigMap")["flywheel-config"]["data"]
    replay = compose()["services"]["replay"]["environment"]
    assert "FLYWHEEL_REPLAY_TRANSITIONS_HWM" not in data and "FLYWHEEL_ACTOR_SEND_HWM" not in data
    assert replay["FLYWHEEL_REPLAY_TRANSITIONS_HWM"] == "${FLYWHEEL_REPLAY_TRANSITIONS_HWM:-}"
    values = presets.load(preset)
    rcvhwm = int(values.section("replay").get("transitions_hwm", setting_default(ReplaySettings, "transitions_hwm")))
    sndhwm = int(values.section("actor").get("send_hwm", setting_default(ActorSettings, "send_hwm")))
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    ctx = zmq.Context()
    try:
        ZapHandler(ctx, frozenset({client_public}))
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, rcvhwm)
        pull.setsockopt(zmq.ZAP_DOMAIN, security.ZAP_DOMAIN)
        pull.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
        pull.setsockopt(zmq.CURVE_SERVER, 1)
        pull.bind("tcp://127.0.0.1:0")
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, sndhwm)
        push.setsockopt(zmq.CURVE_SERVERKEY, server_public)
        push.setsockopt(zmq.CURVE_PUBLICKEY, client_public)
        push.setsockopt(zmq.CURVE_SECRETKEY, client_secret)
        push.connect(pull.getsockopt(zmq.LAST_ENDPOINT).decode())
        received, sent = 0, 0
        deadline = time.monotonic() + 10
        while received < 20 and time.monotonic() < deadline:
            if sent < 20 and push.poll(10, zmq.POLLOUT):
                push.send(b"transition", zmq.NOBLOCK)
                sent += 1
            if pull.poll(10):
                try:
                    pull.recv(zmq.NOBLOCK)
                    received += 1
                except zmq.Again:
                    pass
        assert received == 20, (f"{received} of 20 messages ({sent} sent) reached a CURVE PULL with RCVHWM="
                                f"{rcvhwm}: the ZAP handler's user id stalls the pipe (flywheel/zap.py "
                                "ZapHandler.curve_user_id: an empty user id there)")
    finally:
        ctx.destroy(linger=0)


def test_keys_if_missing_refuses_an_incomplete_set_and_changes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = tmp_path / "keys"
    assert flywheel(["keys", "generate", str(keys)]) == 0
    (keys / "actor.key_secret").unlink()  # half a key set: a copy that went wrong
    before = {p: p.read_bytes() for p in keys.rglob("*") if p.is_file()}
    assert flywheel(["keys", "generate", str(keys), "--if-missing"]) == 2
    err = capsys.readouterr().err
    assert "incomplete" in err and "actor.key_secret" in err and len(err.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in keys.rglob("*") if p.is_file()} == before


def test_compose_mounts_for_each_service_only_its_roles_keys(tmp_path: Path) -> None:
    """Each Flywheel container mounts its role's volume, which the one-shot fills with that role's files alone: no
    actor holds a server's secret or another role's key. A folder made before per-role keys (one shared client
    key) gets them added by the same one-shot, and keeps working meanwhile."""
    doc = compose()
    one_shot = {v.split(":")[1]: v.split(":")[0] for v in doc["services"]["curve-keys"]["volumes"]}
    keys, roles = tmp_path / "keys", tmp_path / "roles"
    assert flywheel(["keys", "generate", str(keys), "--client", "far", "--roles-dir", str(roles)]) == 0
    for service in FLYWHEEL_SERVICES:
        mounts = {v.split(":")[1]: v for v in doc["services"][service]["volumes"]}
        source, _, mode = mounts[CURVE_DIR].split(":")
        assert source == f"curve-keys-{service}" and mode.startswith("ro"), service
        assert one_shot[f"{ROLES_DIR}/{service}"] == source, f"the one-shot fills {source}"
        assert source in doc["volumes"]
        files = {p.relative_to(roles / service).as_posix() for p in (roles / service).rglob("*") if p.is_file()}
        secrets = {f for f in files if f.endswith("_secret")}
        want = ({"server.key_secret"} if service in security.BINDS else set()) | (
            {f"{service}.key_secret"} if service in security.CONNECTS else set())
        assert secrets == want, service
        assert security.keys_from_settings(SETTINGS[service](curve_keys_dir=str(roles / service)), service)
    assert not any(CURVE_DIR in v and not v.startswith("curve-keys-") for name, svc in doc["services"].items()
                   if name != "curve-keys" for v in svc.get("volumes", [])), "only the one-shot mounts every key"

    old = tmp_path / "old"  # the layout before per-role keys: client.key_secret, authorized/client.key
    assert flywheel(["keys", "generate", str(old)]) == 0
    for role in security.ROLES:
        for name in (f"{role}.key", f"{role}.key_secret", f"authorized/{role}.key"):
            (old / name).unlink()
    zmq.auth.create_certificates(old, "client")
    (old / "authorized" / "client.key").write_bytes((old / "client.key").read_bytes())
    legacy = security.keys_from_settings(ActorSettings(curve_keys_dir=str(old)), "actor")
    assert legacy is not None and security.key_role(dict(security.load_keys(old).names)[legacy.client_public]) == "*"
    assert flywheel(["keys", "generate", str(old), "--if-missing", "--roles-dir", str(tmp_path / "old-roles")]) == 0
    assert {p.name for p in (tmp_path / "old-roles" / "actor").iterdir()} == {"server.key", "actor.key_secret"}
