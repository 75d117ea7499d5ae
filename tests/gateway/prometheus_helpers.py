"""A real Prometheus (Debian's package) on loopback for the end-to-end test, and the dashboards' queries."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
PROM_DIR = ROOT / "deploy" / "prometheus"
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
_METRIC_RE = re.compile(r"flywheel_[a-z0-9_]+")


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, PromQL) of every target of every panel of every dashboard."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel.get("targets", []):
                out.append((path.name, panel["title"], target["expr"]))
    return out


def metric_names(expr: str) -> set[str]:
    """The flywheel_* names an expression reads (including inside {__name__=~"..."} regexes)."""
    return set(_METRIC_RE.findall(expr))


class Prometheus:
    """``prometheus`` started with the project's scrape config and rules, pointed at one gateway."""

    def __init__(self, workdir: Path, gateway: str, port: int, scrape_s: float = 1.0) -> None:
        binary = shutil.which("prometheus") or "/usr/bin/prometheus"
        assert Path(binary).exists(), "prometheus missing: install Debian's prometheus package (make system-deps)"
        config = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
        config["global"].update(scrape_interval=f"{scrape_s:g}s", evaluation_interval=f"{scrape_s:g}s")
        config["rule_files"] = [str(PROM_DIR / name) for name in config["rule_files"]]
        for job in config["scrape_configs"]:
            target = gateway if job["job_name"] == "flywheel" else f"127.0.0.1:{port}"
            job["static_configs"] = [{"targets": [target]}]
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [binary, f"--config.file={self.config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as exc:  # a query Prometheus refuses: say which and why
            raise AssertionError(f"prometheus {path} {params}: {exc.code} {exc.read().decode()[:500]}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        return data["result"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wait_all(checks: dict[str, Any], timeout: float, interval: float = 1.0) -> dict[str, Any]:
    """Poll each check until it returns something truthy; {name: last value} of the ones that never did."""
    pending = dict(checks)
    last: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for name, check in list(pending.items()):
            last[name] = check()
            if last[name]:
                del pending[name]
        if pending:
            time.sleep(interval)
    return {name: last.get(name) for name in pending}
