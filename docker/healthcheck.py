#!/usr/bin/env -S python3 -I -S
"""Container health check for every Flywheel service (installed as /usr/local/bin/flywheel-healthcheck).

The image runs one service as PID 1 (``flywheel <service> ...``; under an init, the first such process);
this script reads which one from /proc/<pid>/cmdline and checks it:

- gateway: GET http://127.0.0.1:<http_port>/healthz must answer 200;
- replay, learner: the process is alive and listens on its bound port (sample / weights), read from the kernel's
  table of this network namespace (/proc/net/tcp, tcp6) rather than by connecting: a bare TCP connection would be a
  failed CURVE handshake, counted (curve_handshakes_refused_total) and logged by the service at every check;
- actor (and anything else): the process is alive (not a zombie).

Exit 0 when healthy, 1 otherwise (Docker HEALTHCHECK and Kubernetes exec probes both read it).
Standard library only: it runs under the image's Python without importing flywheel, with -I -S (no site,
no environment) and urllib imported only for the gateway, so it starts fast on a busy machine.
"""

from __future__ import annotations

import os
import sys

SERVICES = ("replay", "learner", "gateway", "actor", "run")
# service -> (settings field holding a bind endpoint, default port); the port is parsed from the endpoint
BOUND_PORT = {"replay": ("sample_bind", 5556), "learner": ("weights_bind", 5557)}


def read_cmdline(pid: int = 1) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]


def service_of(argv: list[str]) -> str | None:
    """The first argument that names a service (``flywheel gateway ...``, ``python -m flywheel learner``)."""
    for arg in argv[1:]:
        if arg in SERVICES:
            return arg
    return None


def setting(argv: list[str], service: str, field: str, default: str) -> str:
    """A setting as the service sees it: ``--field-name VALUE`` / ``--field-name=VALUE`` beats the env variable."""
    flag = "--" + field.replace("_", "-")
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return os.environ.get(f"FLYWHEEL_{service.upper()}_{field.upper()}", default)


def port_of(endpoint: str, default: int) -> int:
    """Port of the first ``tcp://*:5556`` style endpoint of a comma-separated list; the default for anything else
    (ipc:// alone, malformed)."""
    tcp = [part.strip() for part in endpoint.split(",") if part.strip().startswith("tcp://")]
    if not tcp:
        return default
    tail = tcp[0].rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else default


def process_alive(pid: int = 1) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


LISTEN = "0A"  # the TCP state column of /proc/net/tcp


def listening(port: int, tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> bool:
    """Whether a socket of this network namespace listens on ``port``, on any address (no connection made)."""
    for table in tables:
        try:
            with open(table) as f:
                next(f, None)  # the header
                for line in f:
                    fields = line.split()
                    if len(fields) > 3 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except (OSError, ValueError, IndexError):
            continue
    return False


def http_ok(port: int, timeout: float = 3.0) -> bool:
    import urllib.request  # here, not at the top: it costs the other services' checks a third of their start

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=timeout) as response:
            return response.status == 200
    except OSError:  # URLError, HTTPError (503 while unhealthy), timeouts
        return False


def check(argv: list[str], pid: int = 1) -> tuple[bool, str]:
    service = service_of(argv)
    if not process_alive(pid):
        return False, f"PID {pid} is not running"
    if service == "gateway":
        port = int(setting(argv, "gateway", "http_port", "8080"))
        return http_ok(port), f"gateway /healthz on port {port}"
    if service in BOUND_PORT:
        field, default = BOUND_PORT[service]
        port = port_of(setting(argv, service, field, f"tcp://*:{default}"), default)
        return listening(port), f"{service} listening on port {port}"
    return True, f"{service or 'process'} alive"


def find_service_pid() -> int:
    """PID 1 normally; the first flywheel process when PID 1 is an init (tini, docker --init, k8s pause)."""
    if service_of(read_cmdline(1)):
        return 1
    for entry in sorted(int(e) for e in os.listdir("/proc") if e.isdigit()):
        try:
            if service_of(read_cmdline(entry)):
                return entry
        except OSError:
            continue
    return 1


def main() -> int:
    try:
        pid = find_service_pid()
        ok, what = check(read_cmdline(pid), pid)
    except (OSError, ValueError) as exc:
        ok, what = False, f"health check failed: {exc}"
    print(("healthy: " if ok else "unhealthy: ") + what)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
