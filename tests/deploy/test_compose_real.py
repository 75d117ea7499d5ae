"""`docker compose up --scale actor=8` for real: a Docker engine builds the images and runs CartPole (after checking
that the containers read the presets: the compose default, Mario 1-1 at 42x42, with the mario preset).

The engine is the machine's own when one answers, otherwise a private dockerd that this test starts as root and
stops by PID (`--iptables=false --ip-masq=false`: containers get no route out). With no registry the base image is
Debian bookworm made with debootstrap, and Python packages come from a wheelhouse built on the host
(flywheel/testing/dockerhost.py). The gateway is reached through its port published on 127.0.0.1.

It checks what the issue promises: 8 live actors in the gateway's /status holding 8 leases with the 8 distinct
Ape-X exploration rates, learner updates that keep climbing, weights that reach every actor, the control token
made by the compose file, CURVE on as shipped (keys from the one-shot curve-keys service: every replay, learner and
actor reports "curve": "on", the gateway logs it, and a plaintext client is refused by the replay), and a
`docker compose down -v` that leaves no container behind.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from flywheel.testing.dockerhost import (
    REGISTRY_BASE,
    Engine,
    EngineUnavailable,
    base_image,
    docker_engine,
    log,
    run,
    stage_build_context,
    wheelhouse,
)
from flywheel.testing.polling import wait_until
from flywheel.testing.ports import free_port

pytestmark = pytest.mark.slow

ACTORS = 8
# everything but Grafana (no registry here for its image; its provisioning is checked statically)
SERVICES = ("control-token", "curve-keys", "gateway", "replay", "learner", "actor", "prometheus")
PROJECT = "flywheel-compose-test"
IMAGES = {"FLYWHEEL_IMAGE": "flywheel-test:cpu", "FLYWHEEL_IMAGE_ACTOR": "flywheel-test-actor:cpu"}
# Light settings: a 2-core machine runs 11 containers. Everything else is the compose file's default.
LIGHT = {
    "FLYWHEEL_ENV_ID": "CartPole-v1",
    "FLYWHEEL_ACTOR_NUM_ENVS": "2",
    "FLYWHEEL_REPLAY_CAPACITY": "20000",
    "FLYWHEEL_REPLAY_MIN_SIZE_TO_SAMPLE": "256",
    "FLYWHEEL_LEARNER_BATCH_SIZE": "32",
    "FLYWHEEL_LEARNER_PUBLISH_INTERVAL_UPDATES": "5",
    "FLYWHEEL_LEARNER_TORCH_THREADS": "1",
}


def get_json(url: str, timeout: float = 5.0) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def post(url: str, token: str | None, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 2.0,
             detail: Callable[[], str] | None = None) -> Any:
    return wait_until(check, timeout, what, interval=interval, detail=detail)


def apex_epsilons(n: int, envs: int = int(LIGHT["FLYWHEEL_ACTOR_NUM_ENVS"]), base: float = 0.4,
                  alpha: float = 7.0) -> list[float]:
    """Each actor's highest rate: the Ape-X schedule runs over all n x envs env slots, actor i's first is i * envs."""
    slots = n * envs
    return [base ** (1 + alpha * i * envs / (slots - 1)) for i in range(n)]


def live_actors(status: dict[str, Any]) -> list[dict[str, Any]]:
    actors = status.get("services", {}).get("actor", {}).get("instances", [])
    return [a for a in actors if a.get("up")]


def learner_updates(status: dict[str, Any]) -> float:
    return float(status.get("services", {}).get("learner", {}).get("totals", {}).get("updates_total", 0.0))


@pytest.mark.timeout(2400)  # a cold build on a busy 2-core machine, plus waiting for another run
def test_compose_up_scale_actor_8_trains_cartpole(tmp_path: Path) -> None:
    started = time.monotonic()
    try:
        with docker_engine() as engine:
            run_compose_scenario(engine, tmp_path)
    except EngineUnavailable as exc:
        # CI (CI=true, root) must run it: a missing engine is a failure there, never a skip.
        if os.environ.get("CI") or os.geteuid() == 0:
            pytest.fail(f"no Docker engine for the compose test: {exc}")
        pytest.skip(f"no Docker engine and not root: {exc}")
    log(f"compose test done in {time.monotonic() - started:.0f} s")


def run_compose_scenario(engine: Engine, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=1) as pool:  # debootstrap and pip wheel both wait on the network
        wheels_job = pool.submit(wheelhouse)
        base = base_image(engine)
        wheels = wheels_job.result()
    log(f"base image {base}; wheelhouse {wheels or 'none (package index)'} ({time.monotonic() - t0:.0f} s)")
    stage = stage_build_context(tmp_path / "context", wheels)
    compose_file = stage / "docker-compose.yml"
    port, prometheus_port = free_port(), free_port()
    engine.env.update(LIGHT, **IMAGES, COMPOSE_PROJECT_NAME=PROJECT, COMPOSE_PROFILES="monitoring",
                      FLYWHEEL_BASE_IMAGE=base, FLYWHEEL_HTTP_PORT=str(port),
                      FLYWHEEL_PROMETHEUS_PORT=str(prometheus_port))
    engine.compose(compose_file, "down", "-v", "--remove-orphans", "-t", "5", timeout=120, check=False)
    try:
        t1 = time.monotonic()
        build_images(engine, compose_file)
        log(f"images built in {time.monotonic() - t1:.0f} s")
        sizes = {image: int(engine.docker_cmd("image", "inspect", "--format", "{{.Size}}", image).stdout)
                 for image in [*IMAGES.values(), base]}
        log("image sizes: " + ", ".join(f"{image} {size / 1e6:.0f} MB" for image, size in sizes.items()))
        if base != REGISTRY_BASE:  # no registry for prom/prometheus: Debian's prometheus on the same base
            engine.env["FLYWHEEL_PROMETHEUS_IMAGE"] = local_prometheus_image(engine, base, tmp_path / "prometheus")
        t2 = time.monotonic()
        engine.compose(compose_file, "up", "-d", "--no-build", "--scale", f"actor={ACTORS}", *SERVICES, timeout=600)
        log(f"{len(SERVICES) + ACTORS - 1} containers up in {time.monotonic() - t2:.0f} s")
        check_the_images_read_the_presets(engine, compose_file)  # the learner's probe joins the replay's IPC
        check_the_learner_compiles(engine, compose_file)
        token = check_the_running_system(engine, compose_file, port)
        check_curve_is_on(engine, compose_file, port)
        check_prometheus_scrapes_the_gateway(prometheus_port)
        check_a_crashed_learner_resumes(engine, compose_file, port, token)
    except BaseException:
        logs = engine.compose(compose_file, "logs", "--no-color", "--tail", "40", timeout=120, check=False)
        log("compose logs:\n" + (logs.stdout or "")[-12000:])
        raise
    finally:
        engine.compose(compose_file, "down", "-v", "--remove-orphans", "-t", "30", timeout=300, check=False)
        left = engine.docker_cmd("ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}").stdout
        assert not left.strip(), f"containers left after docker compose down: {left.split()}"
        if engine.private:
            assert not engine.docker_cmd("ps", "-aq").stdout.strip(), "the private engine still has containers"
        volumes = engine.docker_cmd("volume", "ls", "-q", "--filter", f"label=com.docker.compose.project={PROJECT}")
        assert not volumes.stdout.strip(), f"volumes left after down -v: {volumes.stdout.split()}"
        # Flywheel images that this build replaced (now untagged) go; the tagged ones and their layers stay as
        # the build cache. Usually quick: a code change replaces only small layers.
        try:
            engine.docker_cmd("image", "prune", "--force", "--filter", "label=io.flywheel.flavor", timeout=300,
                              check=False)
        except subprocess.TimeoutExpired:
            log("docker image prune took over 5 minutes; the rest is left for the next run")


def build_images(engine: Engine, compose_file: Path) -> None:
    """The images ``docker compose build`` makes, from the compose file's own resolved build sections (context,
    Dockerfile, args, tag), each built by ``docker build``: Compose's fallback to the classic builder (where the
    buildx plugin is missing, as here) streams the 380 MB context about 2x slower (38 s against 17 s for both
    images, cached, on a quiet 2-core machine). One at a time: the second reuses the first's dependency layers."""
    config = json.loads(engine.compose(compose_file, "config", "--format", "json", timeout=120).stdout)
    builds = {service["image"]: service["build"] for service in config["services"].values() if "build" in service}
    assert set(builds) == set(IMAGES.values()), builds
    for image, build in sorted(builds.items()):
        args = [f"--build-arg={key}={value}" for key, value in sorted(build.get("args", {}).items())]
        run([engine.docker, "build", "--tag", image, "--file", str(Path(build["context"]) / build["dockerfile"]),
             *args, build["context"]], env=engine.env, timeout=1200, capture=False)  # a cold build's steps shown


SETTINGS_PROBE = ("import json, sys; from flywheel.launch.registry import settings_class; "
                  "s = settings_class(sys.argv[1])(); print(json.dumps(s.model_dump(mode='json')))")


def check_the_images_read_the_presets(engine: Engine, compose_file: Path) -> None:
    """Each service's settings as its container builds them: the compose file's default env (the default job) comes
    with the mario preset, FLYWHEEL_ENV_ID=CartPole-v1 with the vector one, and variables still win (the learner's lr;
    the learner's and the replay's seeds, which `flywheel bench mario --opt deploy=compose --opt train_seed=K` sets)."""
    from flywheel import presets
    from flywheel.launch.runplan import DEFAULT_ENV

    saved = dict(engine.env)
    try:
        for name in LIGHT:
            engine.env.pop(name, None)
        for env_id, preset in ((None, "mario"), ("CartPole-v1", "vector")):
            if env_id:
                engine.env["FLYWHEEL_ENV_ID"] = env_id
            for service in ("replay", "learner", "actor"):
                out = engine.compose(compose_file, "run", "--rm", "--no-deps", "-T", "--entrypoint", "python",
                                     service, "-c", SETTINGS_PROBE, service, timeout=300).stdout
                settings = json.loads(out.strip().splitlines()[-1])
                assert settings["env_id"] == (env_id or DEFAULT_ENV), (service, settings["env_id"])
                assert service == "actor" or settings["seed"] is None, f"{service}: an empty seed variable seeds"
                common = presets.load(preset).sections.get("common", {})
                for key, value in presets.load(preset).section(service).items():
                    if key in common and key not in settings:  # a common value (the network) this service lacks
                        continue
                    assert settings[key] == value, f"{service}: {key}={settings[key]}, the {preset} preset's {value}"
        engine.env.update(FLYWHEEL_LEARNER_LR="0.0123", FLYWHEEL_LEARNER_SEED="7", FLYWHEEL_REPLAY_SEED="7")
        for service, wanted in (("learner", {"lr": 0.0123, "seed": 7}), ("replay", {"seed": 7})):
            out = engine.compose(compose_file, "run", "--rm", "--no-deps", "-T", "--entrypoint", "python", service,
                                 "-c", SETTINGS_PROBE, service, timeout=300).stdout
            settings = json.loads(out.strip().splitlines()[-1])
            assert {k: settings[k] for k in wanted} == wanted, f"{service}: variables override the preset"
    finally:
        engine.env.clear()
        engine.env.update(saved)
    log("the images read the presets: the default job with mario's values, CartPole-v1 with vector's")


COMPILE_PROBE = ("import torch; f = torch.compile(lambda x: torch.relu(x) * 2.0 + 1.0); "
                 "print(float(f(torch.arange(-2.0, 2.0)).sum()))")


def check_the_learner_compiles(engine: Engine, compose_file: Path) -> None:
    """The pixel preset compiles the learner's update: the services image has the C++ compiler and headers that
    torch.compile's CPU backend builds its kernels with (docker/ensure-compiler.sh), so it does not fall back."""
    out = engine.compose(compose_file, "run", "--rm", "--no-deps", "-T", "--entrypoint", "python", "learner",
                         "-c", COMPILE_PROBE, timeout=600).stdout
    assert out.strip().splitlines()[-1] == "6.0", f"torch.compile in the learner's container printed {out!r}"
    log("the learner's image compiles with torch.compile (inductor, g++)")


def check_the_running_system(engine: Engine, compose_file: Path, port: int) -> str:
    url = f"http://127.0.0.1:{port}"
    published = engine.compose(compose_file, "port", "gateway", "8080", timeout=60).stdout.strip()
    assert published == f"127.0.0.1:{port}", f"the gateway must be published on 127.0.0.1 only, got {published!r}"

    def eight_actors_with_their_slots() -> dict[str, Any] | None:
        status = get_json(f"{url}/status")
        if not status:
            return None
        actors = live_actors(status)
        epsilons = sorted(float(a.get("gauges", {}).get("epsilon", -1)) for a in actors)
        versions = [a.get("gauges", {}).get("weight_version", 0) for a in actors]
        # each actor learns the new N at its next lease renewal, so wait until all 8 have: then the rates are
        # exactly Ape-X's for N = 8
        settled = len(actors) == ACTORS and epsilons == pytest.approx(sorted(apex_epsilons(ACTORS)), rel=1e-6)
        ready = settled and status.get("leases", {}).get("count") == ACTORS and min(versions, default=0) > 0
        last.update(actors=len(actors), epsilons=[round(e, 5) for e in epsilons], weight_versions=versions,
                    leases=status.get("leases", {}).get("count"), learner_updates=learner_updates(status))
        return status if ready and learner_updates(status) > 0 else None

    last: dict[str, Any] = {}
    try:
        status = wait_for(f"{ACTORS} live actors with the {ACTORS} Ape-X epsilons, weights and learner updates",
                          eight_actors_with_their_slots, timeout=420)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last /status: {last}") from None
    actors = live_actors(status)
    assert len({a["instance"] for a in actors}) == ACTORS, "replicas must have distinct instance names"
    epsilons = sorted(float(a["gauges"]["epsilon"]) for a in actors)
    assert epsilons == pytest.approx(sorted(apex_epsilons(ACTORS)), rel=1e-6), (
        f"Ape-X over the 8 x 2 env slots: actor i's first slot 2i has 0.4^(1 + 7 * 2i / 15), got {epsilons}")
    assert status["leases"]["count"] == ACTORS
    assert all(a["gauges"]["weight_version"] > 0 for a in actors), "weights reached every actor"

    learner = status["services"]["learner"]["instances"][0]["counters"]
    shm, tcp = learner.get("shm_batches_total", 0), learner.get("tcp_batches_total", 0)
    assert shm > 0 and tcp <= shm / 10, (
        f"the learner must sample over the replay's Unix socket and shared memory: {learner}")
    first = learner_updates(status)
    later = wait_for("learner updates to climb", lambda: (s := get_json(f"{url}/status")) and
                     learner_updates(s) > first and s, timeout=120)
    assert learner_updates(later) > first > 0
    newest = max(a["gauges"]["weight_version"] for a in live_actors(later))
    assert newest >= max(a["gauges"]["weight_version"] for a in actors)
    log(f"learner updates {first:.0f} -> {learner_updates(later):.0f}; actor weight versions up to {newest}; "
        f"epsilons {[round(e, 4) for e in epsilons]}")

    # The control token comes from the compose file's one-shot service and is enforced.
    token = engine.compose(compose_file, "exec", "-T", "gateway", "cat", "/run/flywheel/control-token",
                           timeout=60).stdout.strip()
    assert len(token) >= 16
    assert post(f"{url}/control/set_lr", None, {"lr": 0.0005}) == 401
    assert post(f"{url}/control/set_lr", "x" * len(token), {"lr": 0.0005}) == 401
    assert post(f"{url}/control/set_lr", token, {"lr": 0.0005}) == 202
    log("control: 401 without the token or with a wrong one, 202 with the token the compose file made")
    return token


PLAINTEXT_PUSH = """
import time, zmq
sock = zmq.Context().socket(zmq.PUSH)
sock.setsockopt(zmq.LINGER, 0)
sock.connect("tcp://replay:5555")  # no CURVE keys: a NULL-mechanism handshake
time.sleep(5)
"""


def refused_by_replay(status: dict[str, Any]) -> float:
    """Handshakes the replay refused (a client without CURVE): libzmq reports a mechanism mismatch as a protocol
    error or, when the peer's socket closes first, as an 'other' failure (EPIPE); both count."""
    replays = status.get("services", {}).get("replay", {}).get("instances", [])
    return sum(value for r in replays for key, value in r.get("counters", {}).items()
               if key.startswith("curve_handshakes_refused_total{") and 'reason="unauthorized_key"' not in key)


def check_curve_is_on(engine: Engine, compose_file: Path, port: int) -> None:
    """CURVE as shipped: the keys the curve-keys one-shot made are in use by every service, and a client without
    them gets nowhere (the replay's handshake monitor counts it)."""
    url = f"http://127.0.0.1:{port}"
    status = get_json(f"{url}/status") or {}
    for service in ("replay", "learner", "actor"):
        instances = [i for i in status.get("services", {}).get(service, {}).get("instances", []) if i.get("up")]
        assert instances, f"no live {service} in /status"
        curve = {i["instance"]: i.get("info", {}).get("curve") for i in instances}
        assert set(curve.values()) == {"on"}, f"{service}: telemetry info curve {curve}"
        keys = {i["instance"]: i.get("info", {}).get("curve_key") for i in instances}  # the gateway's, per report
        assert set(keys.values()) == {service}, f"{service}: each reports with its own role's key: {keys}"
    logs = engine.compose(compose_file, "logs", "--no-color", "curve-keys", "gateway", timeout=120).stdout
    assert "wrote 11 key files to /run/secrets/flywheel-curve" in logs or "kept the keys" in logs, logs[-2000:]
    assert "CURVE on: TCP connections encrypted" in logs, "the gateway binds with CURVE"
    assert "PLAINTEXT" not in logs
    before = refused_by_replay(status)
    engine.compose(compose_file, "run", "--rm", "--no-deps", "-T", "--entrypoint", "python", "actor", "-c",
                   PLAINTEXT_PUSH, timeout=180)
    wait_for("the replay to refuse a plaintext client", lambda: refused_by_replay(get_json(f"{url}/status") or {})
             > before, timeout=60)
    log("CURVE on: replay, learner and actors report curve=on; the replay refused a plaintext client")


def learner_instance(status: dict[str, Any]) -> dict[str, Any] | None:
    learners = [i for i in status.get("services", {}).get("learner", {}).get("instances", []) if i.get("up")]
    return learners[0] if learners else None


def check_a_crashed_learner_resumes(engine: Engine, compose_file: Path, port: int, token: str) -> None:
    """SIGKILL of the learner's process (as an OOM kill does): compose restarts the container, the learner resumes
    from its checkpoint (resume=auto), its updates and weight versions go on above their last values, and the
    actors take the new weights."""
    url = f"http://127.0.0.1:{port}"

    def checkpointed() -> dict[str, Any] | None:
        learner = learner_instance(get_json(f"{url}/status") or {})
        return learner if learner and learner["counters"].get("checkpoints_total", 0) >= 1 else None

    assert post(f"{url}/control/checkpoint", token, {"tag": "before-crash"}) == 202
    saved = wait_for("the learner's checkpoint", checkpointed, timeout=120)
    container = engine.compose(compose_file, "ps", "-q", "learner", timeout=60).stdout.strip()
    inspect = ["inspect", "--format", "{{.State.Pid}} {{.RestartCount}}", container]
    pid, restarts = (int(v) for v in engine.docker_cmd(*inspect).stdout.split())
    time.sleep(3)  # a few more updates and versions after the checkpoint: the restart must go above them too
    before = learner_instance(get_json(f"{url}/status") or {}) or saved
    last_updates, last_version = before["counters"]["updates_total"], before["gauges"]["weight_version"]
    os.kill(pid, signal.SIGKILL)  # the container's main process, from the host: not a `docker stop`
    log(f"killed the learner (pid {pid}) at update {last_updates:.0f}, weight version {last_version:.0f}")

    def resumed() -> dict[str, Any] | None:
        status = get_json(f"{url}/status") or {}
        learner = learner_instance(status)
        if not learner or (learner["restarts"] < 1 and learner["instance"] == before["instance"]):
            return None  # not yet the restarted process (same name and a fresh sequence, or a new name)
        actors = live_actors(status)
        going_on = (learner["counters"].get("updates_total", 0) > last_updates
                    and learner["gauges"].get("weight_version", 0) > last_version)
        taken = bool(actors) and min(a["gauges"].get("weight_version", 0) for a in actors) > last_version
        return status if going_on and taken else None

    def where_it_stands() -> str:
        """What the gateway last saw of the learner and the actors, and the newest log lines of the learner and
        the replay: enough to tell a learner that does not train from actors that do not take its weights."""
        status = get_json(f"{url}/status") or {}
        learner = learner_instance(status) or {}
        seen = {k: learner.get(k) for k in ("instance", "restarts")} | {
            "counters": {k: v for k, v in learner.get("counters", {}).items() if "total" in k},
            "gauges": learner.get("gauges", {})}
        actors = live_actors(status)
        versions = [a["gauges"].get("weight_version") for a in actors]
        behind = [{"instance": a.get("instance"), "gauges": a.get("gauges", {}),
                   "counters": {k: v for k, v in a.get("counters", {}).items() if "total" in k}}
                  for a in actors if a["gauges"].get("weight_version", 0) <= last_version]
        logs = engine.compose(compose_file, "logs", "--no-color", "--tail", "40", "learner", "replay",
                              timeout=120).stdout
        return (f"\nkilled at update {last_updates:.0f}, version {last_version:.0f}; learner now: {json.dumps(seen)}"
                f"\nactor weight versions: {versions}\nactors still at or below it: {json.dumps(behind)}"
                f"\nlogs:\n{logs[-6000:]}")

    wait_for("the restarted learner to train on and the actors to take its weights", resumed, timeout=300,
             detail=where_it_stands)
    assert int(engine.docker_cmd(*inspect).stdout.split()[1]) == restarts + 1, "compose restarted the container"
    logs = engine.compose(compose_file, "logs", "--no-color", "learner", timeout=120).stdout
    assert "resume=auto" in logs and "resumed from" in logs, logs[-3000:]
    log("the killed learner came back from its checkpoint; updates, weight versions and the actors went on")


def local_prometheus_image(engine: Engine, base: str, folder: Path) -> str:
    """prom/prometheus stand-in where no registry is reachable: the Prometheus server of Debian's prometheus
    package (the promtool tests need it anyway) on the same Debian base, run as nobody like the official image."""
    binary = Path(shutil.which("prometheus") or "/usr/bin/prometheus")
    if not binary.exists():
        pytest.fail("no prometheus binary for the monitoring profile: apt-get install prometheus (make system-deps)")
    folder.mkdir(parents=True)
    shutil.copy2(binary, folder / "prometheus")
    (folder / "Dockerfile").write_text(
        f"FROM {base}\nCOPY prometheus /bin/prometheus\n"
        "RUN mkdir -p /prometheus && chown 65534:65534 /prometheus\n"
        'USER 65534:65534\nWORKDIR /prometheus\nENTRYPOINT ["/bin/prometheus"]\n')
    tag = "flywheel-test-prometheus:debian"
    engine.docker_cmd("build", "--quiet", "-t", tag, str(folder), timeout=300)
    return tag


def check_prometheus_scrapes_the_gateway(port: int) -> None:
    """Prometheus, with the config mounted from deploy/prometheus, scrapes the gateway and keeps each actor's
    own instance label (honor_labels)."""
    def query(expr: str) -> float | None:
        q = urllib.parse.urlencode({"query": expr})
        body = get_json(f"http://127.0.0.1:{port}/api/v1/query?{q}")
        if not body or body.get("status") != "success" or not body["data"]["result"]:
            return None
        return float(body["data"]["result"][0]["value"][1])

    wait_for("Prometheus to scrape the gateway", lambda: query('up{job="flywheel"}') == 1.0, timeout=120)
    actors = wait_for(f"{ACTORS} actor instances in Prometheus",
                      lambda: query('count(count by (instance) ({service="actor"}))') == ACTORS, timeout=120)
    assert actors
    log("Prometheus scrapes the gateway: up == 1, 8 actor instances with their own labels")
