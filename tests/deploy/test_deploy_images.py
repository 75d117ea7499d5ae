"""Static checks of docker/: the Dockerfile's stages, the build context, pinned versions, and the two scripts the
images run (the health check and the control-token writer), tested as plain Python."""

from __future__ import annotations

import fnmatch
import importlib.util
import os
import re
import socket
import stat
import time
import tomllib
from pathlib import Path
from types import ModuleType

import pytest
import zmq
from deploy_helpers import DOCKER, DOCKERFILE, ROOT


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def dockerfile_stages() -> dict[str, list[str]]:
    """Instructions (continuation lines joined, comments dropped) per stage name; "" before the first FROM."""
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


def load_module(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem.replace("-", "_"), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def constraints() -> dict[str, str]:
    pins = {}
    for line in (DOCKER / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"constraints.txt: {line!r} is not pinned with =="
            pins[norm(name)] = version
    return pins


# ---- Dockerfile ------------------------------------------------------------------------------------------------

def test_the_last_stage_runs_as_non_root_with_a_healthcheck() -> None:
    stages = dockerfile_stages()
    name, stage = list(stages.items())[-1]
    assert name == "runtime", "a plain `docker build` gives the runtime image"
    users = [line.split()[1] for line in stage if line.upper().startswith("USER ")]
    assert users and users[-1].split(":")[0] not in ("root", "0"), "runs as root"
    assert any(line.upper().startswith("HEALTHCHECK ") and "flywheel-healthcheck" in line for line in stage)
    assert 'ENTRYPOINT ["flywheel"]' in stage
    assert any(line.startswith("COPY --from=venv /opt/venv") for line in stage), "multi-stage: only the venv"
    assert not any("build-essential" in line for line in stage), "no compiler in the runtime image"


def test_base_image_flavor_and_indexes_are_build_args() -> None:
    stages = dockerfile_stages()
    assert "ARG BASE_IMAGE=python:3.11-slim" in stages[""]
    froms = [line for stage in stages.values() for line in stage if line.upper().startswith("FROM ")]
    externals = [line.split()[1] for line in froms if line.split()[1] not in stages]
    assert externals and set(externals) == {"${BASE_IMAGE}"}, f"every external base is BASE_IMAGE: {externals}"
    assert "ARG FLAVOR=services" in stages["venv"] and "ARG FLAVOR=services" in stages["runtime"]
    assert not any("FLAVOR" in line for line in stages["builder"]), "both flavors share the dependency layer"
    builder = " ".join(stages["builder"])
    assert "ARG PIP_INDEX_URL=" in builder and "ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu" in builder
    assert "COPY docker/wheelhouse/ docker/wheelhouse/" in stages["builder"]


def test_the_dockerfile_works_with_the_classic_builder() -> None:
    """Compose v5 falls back to the classic builder where buildx is missing (as on this project's machines)."""
    lines = [line for stage in dockerfile_stages().values() for line in stage]
    for feature in ("RUN --mount", "COPY --chmod", "COPY --link", "ADD --checksum", "<<"):
        assert not any(feature in line for line in lines), f"{feature} needs BuildKit"
    assert not DOCKERFILE.read_text().startswith("# syntax="), "a syntax directive needs BuildKit"
    assert not (DOCKER / "Dockerfile.dockerignore").exists(), "the classic builder reads only .dockerignore"


def dockerignore_allows(path: str) -> bool:
    allowed = False
    for pattern in (ROOT / ".dockerignore").read_text().splitlines():
        pattern = pattern.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or path.startswith(pattern + "/") or fnmatch.fnmatch(path, pattern + "/*"):
            allowed = negate
    return allowed


def test_every_copied_file_exists_and_passes_the_dockerignore() -> None:
    copies = [line.split()[1:-1] for stage in dockerfile_stages().values() for line in stage
              if line.startswith("COPY ") and "--from=" not in line]
    sources = [s for parts in copies for s in parts if not s.startswith("--")]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), f"COPY of missing {source}"
        probe = source.rstrip("/") + ("/x.py" if source.endswith("/") else "")
        assert dockerignore_allows(probe), f"{source} is excluded from the build context by .dockerignore"
    assert not dockerignore_allows("tests/deploy/test_deploy_images.py")
    assert not dockerignore_allows(".git/config") and not dockerignore_allows("flywheel/__pycache__/x.pyc")
    assert (DOCKER / "wheelhouse" / "README.md").exists(), "COPY docker/wheelhouse/ needs the folder"


def test_scripts_the_images_run_are_executable() -> None:
    for name in ("healthcheck.py", "control-token.py", "make-wheelhouse.sh"):
        mode = (DOCKER / name).stat().st_mode
        assert mode & stat.S_IXUSR, f"docker/{name} must be executable (COPY keeps the mode)"


# ---- versions --------------------------------------------------------------------------------------------------

def test_constraints_pin_every_runtime_dependency() -> None:
    pins = constraints()
    for requirement in load_module(DOCKER / "requirements.py").requirement_lines(ROOT):
        name = norm(re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0])
        assert name in pins, f"docker/constraints.txt does not pin {name} (a dependency in pyproject.toml)"
    assert "setuptools" in pins, "the build backend is installed from the wheelhouse too"
    assert "+" not in pins["torch"], "pin torch without a local label so CPU and CUDA builds both match"


def test_requirements_are_pyprojects_dependencies() -> None:
    module = load_module(DOCKER / "requirements.py")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = module.requirement_lines(ROOT)
    extras = [line for extra in module.IMAGE_EXTRAS for line in project["optional-dependencies"][extra]]
    assert lines[:len(project["dependencies"])] == project["dependencies"] and lines[-1] == "setuptools"
    assert set(lines[len(project["dependencies"]):-1]) == set(extras) and len(set(lines)) == len(lines)
    assert any(line.startswith("nes-py") for line in lines) and any(line.startswith("ale-py") for line in lines)


def test_actor_excludes_are_pinned_packages_actors_do_not_import() -> None:
    excluded = [line.strip() for line in (DOCKER / "actor-excludes.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    pins = constraints()
    for name in excluded:
        assert norm(name) in pins, f"actor-excludes.txt: {name} is not a package the image installs"
    for needed in ("torch", "numpy", "pyzmq", "msgpack", "gymnasium", "pydantic", "opencv-python-headless"):
        assert needed not in excluded, f"actors need {needed}"


# ---- the health check ------------------------------------------------------------------------------------------

def test_healthcheck_finds_the_service_and_its_port(monkeypatch: pytest.MonkeyPatch) -> None:
    hc = load_module(DOCKER / "healthcheck.py")
    argv = ["/opt/venv/bin/python", "/opt/venv/bin/flywheel", "replay", "--sample-bind", "tcp://*:6000"]
    assert hc.service_of(argv) == "replay"
    assert hc.service_of(["/opt/venv/bin/python", "/opt/venv/bin/flywheel", "--help"]) is None
    assert hc.port_of(hc.setting(argv, "replay", "sample_bind", "tcp://*:5556"), 5556) == 6000
    assert hc.port_of("ipc:///run/flywheel-ipc/sample,tcp://*:6001", 5556) == 6001
    assert hc.port_of("ipc:///run/flywheel-ipc/sample", 5556) == 5556
    monkeypatch.setenv("FLYWHEEL_GATEWAY_HTTP_PORT", "9001")
    assert hc.setting(["flywheel", "gateway"], "gateway", "http_port", "8080") == "9001"
    assert hc.setting(["flywheel", "gateway", "--http-port=9002"], "gateway", "http_port", "8080") == "9002"
    assert hc.port_of("ipc:///tmp/x", 5557) == 5557


def test_healthcheck_reports_a_closed_port_as_unhealthy() -> None:
    hc = load_module(DOCKER / "healthcheck.py")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        ok, what = hc.check(["python", "flywheel", "learner", "--weights-bind", f"tcp://*:{port}"], pid=os.getpid())
        assert ok, what
        with socket.socket(socket.AF_INET6) as v6:  # an IPv6 listener counts too (/proc/net/tcp6)
            v6.bind(("::1", 0))
            v6.listen()
            assert hc.listening(v6.getsockname()[1])
        with socket.create_connection(("127.0.0.1", port)) as client:  # connected, not listening: not a match
            assert not hc.listening(client.getsockname()[1])
    ok, what = hc.check(["python", "flywheel", "learner", "--weights-bind", f"tcp://*:{port}"], pid=os.getpid())
    assert not ok and str(port) in what


def test_healthcheck_makes_no_connection_that_a_curve_server_would_count(tmp_path: Path) -> None:
    """The check reads the listen table: a CURVE replay sees no failed handshake from its own health check."""
    from flywheel import keyfiles, security
    from flywheel.zap import ZapHandler

    hc = load_module(DOCKER / "healthcheck.py")
    keyfiles.generate(tmp_path / "keys")
    keys = security.load_keys(tmp_path / "keys")
    assert keys is not None
    ctx = zmq.Context()
    try:
        handler = ZapHandler(ctx, keys.authorized)
        router = ctx.socket(zmq.ROUTER)
        handler.watch(router)
        router.setsockopt(zmq.ZAP_DOMAIN, security.ZAP_DOMAIN)
        router.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)
        router.setsockopt(zmq.CURVE_SERVER, 1)
        router.bind("tcp://127.0.0.1:0")
        port = int(router.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
        time.sleep(1.5)  # the handler's thread picks the monitor up within a second
        for _ in range(3):
            ok, what = hc.check(["python", "flywheel", "replay", "--sample-bind", f"tcp://*:{port}"],
                                pid=os.getpid())
            assert ok, what
        with socket.create_connection(("127.0.0.1", port)):  # what a connecting check did: counted
            pass
        deadline = time.monotonic() + 10
        while sum(handler.refused.values()) == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sum(handler.refused.values()) == 1, handler.refused
    finally:
        ctx.destroy(linger=0)


# ---- the control token -----------------------------------------------------------------------------------------

def test_control_token_keeps_replaces_or_makes_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ct = load_module(DOCKER / "control-token.py")
    path = tmp_path / "control-token"
    monkeypatch.setenv("FLYWHEEL_CONTROL_TOKEN_PATH", str(path))
    monkeypatch.delenv("FLYWHEEL_CONTROL_TOKEN", raising=False)
    assert ct.main() == 0
    made = path.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", made) and stat.S_IMODE(path.stat().st_mode) == 0o400
    assert made not in capsys.readouterr().out, "the token itself is never printed"
    assert ct.main() == 0 and path.read_text().strip() == made, "kept across restarts"
    monkeypatch.setenv("FLYWHEEL_CONTROL_TOKEN", "operator-chosen-token-123")
    assert ct.main() == 0 and path.read_text().strip() == "operator-chosen-token-123"
    monkeypatch.setenv("FLYWHEEL_CONTROL_TOKEN", "short")
    assert ct.main() == 1, "a token the gateway would refuse is refused here, with a message"
    assert "at least 16" in capsys.readouterr().err
    assert path.read_text().strip() == "operator-chosen-token-123", "a refused token changes nothing"
