"""The live page at / rendered by headless Chromium (Debian's package) against a gateway fed telemetry over ZeroMQ.

The DOM after the page's script ran must show the live numbers, the learning curve must have points, and the
screenshot must show the curve drawn (its colour is in the image). When the actors report their env's progress and
success measures (here as a platformer names them: furthest x and flag), /history carries them and cards and a second
chart show them under the env's labels, restarted episodes apart; without them they stay hidden.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import cv2
import numpy as np
import pytest
import zmq
from gateway_helpers import gateway_env, http_get, start_gateway, wait_for

from flywheel.transport import TelemetryReporter

pytestmark = pytest.mark.system

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CURVE_BGR = np.array([255, 166, 88])  # #58a6ff, the return line
PROGRESS_BGR = np.array([221, 212, 86])  # #56d4dd, the measures chart's mean progress line
RESTARTED_BGR = np.array([186, 120, 247])  # #f778ba, its restarted episodes' progress line
SUCCESS_BGR = np.array([65, 179, 227])  # #e3b341, its success rate line
LABELS = {"progress_label": "furthest x", "success_label": "flag"}  # what the actors' env calls its measures


class Texts(HTMLParser):
    """Text of every element with an id, and the attributes of the canvas and of table rows."""

    def __init__(self) -> None:
        super().__init__()
        self.by_id: dict[str, str] = {}
        self.attrs: dict[str, dict[str, str | None]] = {}
        self.rows: list[list[str]] = []
        self._stack: list[str | None] = []
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        ident = found.get("id")
        if ident:
            self.by_id.setdefault(ident, "")
            self.attrs[ident] = found
        self._stack.append(ident)
        if tag == "tr" and found.get("class") == "instance":
            self._row = []
        if tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if self._stack:
            self._stack.pop()
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        if tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None

    def handle_data(self, data: str) -> None:
        for ident in self._stack:
            if ident:
                self.by_id[ident] += data
        if self._cell is not None:
            self._cell.append(data)


@pytest.fixture
def fed_gateway(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A gateway fed telemetry; ``indirect`` parameter True: the actors report their env's measures too."""
    measured = bool(getattr(request, "param", False))
    log = tmp_path / "gateway.log"
    proc, url, telemetry = start_gateway(gateway_env(FLYWHEEL_GATEWAY_HISTORY_INTERVAL_S="0.2"), log)
    ctx = zmq.Context()
    try:
        wait_for(lambda: _up(url), timeout=30, what=f"gateway on {url}")
        stop = threading.Event()
        feeder = threading.Thread(target=feed, args=(ctx, telemetry, stop, measured),
                                  daemon=True)
        feeder.start()
        wait_for(lambda: len(json.loads(http_get(f"{url}/history")[1])["points"]) >= 6, timeout=20,
                 what="six curve points")
        yield url
        stop.set()
        feeder.join(timeout=10)
    finally:
        ctx.destroy(linger=0)
        proc.terminate()
        proc.wait(timeout=15)


def feed(ctx: zmq.Context, endpoint: str, stop: threading.Event, measured: bool = False) -> None:
    """Telemetry of a system whose returns climb, every 0.2 s until stopped (through TelemetryReporter, as the
    services send it): 1000 env steps per actor, 900 inserts and 3600 samples per step. With ``measured`` the
    actors' env measures climb too, then hold: progress means 660 and 680, maxima twice that, success rates 0.1 and
    0.3; actor-1 also restarts episodes at kept start states, whose progress is its mean + 500 and success rate 0.5."""
    actors = [TelemetryReporter(ctx, endpoint, "actor", f"actor-{i}") for i in range(2)]
    replay = TelemetryReporter(ctx, endpoint, "replay", "replay-0")
    learner = TelemetryReporter(ctx, endpoint, "learner", "learner-0")
    step = 0
    while not stop.is_set():
        returns = 10.0 * min(step, 11)  # climbs, then holds at 110 (and 132 for the greedy runs)
        for i, actor in enumerate(actors):
            progress = 60.0 * min(step, 11) + 20 * i
            extra = {"episode_progress_mean": progress, "episode_progress_max": 2 * progress,
                     "episode_success_rate": min(step, 11) / 110 + 0.2 * i} if measured else {}
            if measured and i == 1:
                extra.update(restarted_progress_mean=progress + 500, restarted_success_rate=0.5)
            actor.send({"env_steps_total": 1000.0 * step, "episodes_total": 2.0 * step},
                       {"epsilon": [0.4, 0.0007][i], "weight_version": 40 + i,
                        "episode_return_mean": returns + i, "eval_return_mean": 1.2 * returns, **extra},
                       {"env_id": "SuperMarioBros-1-1-v0", **LABELS} if measured else {"env_id": "CartPole-v1"})
        replay.send({"transitions_received_total": 900.0 * step, "samples_total": 3600.0 * step},
                    {"size_transitions": 1234.0, "capacity_transitions": 5000.0})
        learner.send({"updates_total": 20.0 * step}, {"weight_version": 42, "loss": 0.125, "data_wait_ratio": 0.25})
        step += 1
        stop.wait(0.2)
    for reporter in (*actors, replay, learner):
        reporter.close()


def _up(url: str) -> bool:
    try:
        return http_get(f"{url}/healthz", timeout=1)[0] == 200
    except OSError:
        return False


def colour_pixels(image: np.ndarray, bgr: np.ndarray) -> int:
    return int((np.abs(image.astype(int) - bgr).sum(axis=2) < 40).sum())


def number(text: str) -> float:
    """A number as the page shows it: 950, 12.5, 17.8k, 1.20M."""
    scale = {"k": 1e3, "M": 1e6}.get(text[-1:], 1.0)
    return float(text[:-1] if scale != 1.0 else text) * scale


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    assert Path(CHROMIUM).exists(), "chromium missing: install Debian's chromium package (make system-deps)"
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'chromium-profile'}",
             "--window-size=1280,1100", "--virtual-time-budget=4000"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, timeout=90)


def rendered(tmp_path: Path, url: str) -> Texts:
    """The page's DOM after its script ran, parsed; its error line must be empty."""
    done = chromium(tmp_path, "--dump-dom", url)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    page = Texts()
    page.feed(done.stdout.decode())
    assert page.by_id["error"].strip() == ""
    return page


def screenshot(tmp_path: Path, url: str, name: str) -> np.ndarray:
    """The page as a 1280x1100 BGR image."""
    shot = tmp_path / name
    done = chromium(tmp_path, f"--screenshot={shot}", url)
    assert done.returncode == 0 and shot.exists(), done.stderr.decode(errors="replace")[-2000:]
    image = cv2.imread(str(shot))
    assert image is not None and image.shape[:2] == (1100, 1280)
    return image


def test_live_page_shows_live_numbers_and_a_curve(fed_gateway: str, tmp_path: Path) -> None:
    status, html = http_get(fed_gateway + "/")
    assert status == 200 and "<canvas" in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html), "the page must not load anything external"

    page = rendered(tmp_path, fed_gateway + "/")
    t = page.by_id
    assert t["gateway"].startswith("gateway gateway-test v") and "control on" in t["gateway"]
    # the reporters advance 1000 env steps per actor, 900 inserts and 3600 samples every 0.2 s
    # rates come from real report intervals, which stretch on a loaded machine: bounds are loose on purpose
    assert 1_000 < number(t["env_steps_per_s"]) < 15_000
    assert 400 < number(t["transitions_received_per_s"]) < 7_000 and 1_800 < number(t["samples_per_s"]) < 27_000
    assert t["replay_size"] == "1234 / 5000"
    assert t["weight_version"] == "42" and t["policy_lag"] == "2"
    assert t["data_wait_ratio"] == "25 %" and t["loss"] == "0.1250"
    assert t["episode_return_mean"] == "110.5" and t["eval_return_mean"] == "132"
    points = int(page.attrs["curve"]["data-points"] or 0)
    assert points >= 5, f"the curve has {points} points"
    assert f"{points} points" in t["curve_info"]
    assert "hidden" in page.attrs["measures_panel"] and t["progress_mean"] == "-"  # no measures: no cards, no chart
    rows = {(r[0], r[1]): r for r in page.rows}
    assert set(rows) == {("actor", "actor-0"), ("actor", "actor-1"), ("replay", "replay-0"),
                         ("learner", "learner-0")}
    assert all(r[2] == "up" for r in rows.values())
    assert rows[("actor", "actor-1")][5] == "0.0007"

    image = screenshot(tmp_path, fed_gateway + "/", "live-page.png")
    curve_pixels = colour_pixels(image, CURVE_BGR)
    assert curve_pixels > 200, f"the return curve is not in the screenshot ({curve_pixels} pixels of its colour)"
    assert colour_pixels(image, PROGRESS_BGR) < 20, "a measures chart drawn for an env without measures"
    points = json.loads(http_get(fed_gateway + "/history")[1])["points"]
    assert points and all(p["progress_mean"] is None and p["success_rate"] is None for p in points)
    summary = json.loads(http_get(fed_gateway + "/status")[1])["summary"]
    assert summary["progress_label"] is None and summary["success_label"] is None


@pytest.mark.parametrize("fed_gateway", [True], indirect=True, ids=["measured"])
def test_live_page_charts_the_envs_measures_under_its_labels(fed_gateway: str, tmp_path: Path) -> None:
    """Actors whose env declares measures: /history and /status carry progress and success rate (restarted
    episodes apart), and the page shows them under the env's labels and charts them over time."""
    def held() -> list[dict[str, object]]:
        points = json.loads(http_get(fed_gateway + "/history")[1])["points"]
        return points if points[-1]["progress_mean"] == 670 else []

    points = wait_for(held, timeout=20, what="the measures to climb and hold")
    last = points[-1]
    assert last["progress_max"] == 1360 and last["success_rate"] == pytest.approx(0.2)
    assert last["restarted_progress_mean"] == 1180
    climbing = [p["progress_mean"] for p in points if p["progress_mean"] is not None]
    assert len(climbing) >= 5 and climbing == sorted(climbing) and climbing[0] < climbing[-1], climbing
    summary = json.loads(http_get(fed_gateway + "/status")[1])["summary"]
    assert (summary["progress_mean"], summary["progress_max"], summary["restarted_progress_mean"]) == (670, 1360, 1180)
    assert summary["success_rate"] == pytest.approx(0.2) and summary["restarted_success_rate"] == 0.5
    assert (summary["progress_label"], summary["success_label"]) == ("furthest x", "flag")

    page = rendered(tmp_path, fed_gateway + "/")
    t = page.by_id
    assert "hidden" not in page.attrs["measures_panel"] and "hidden" not in page.attrs["legend_restarted_item"]
    assert (t["progress_title"], t["progress_mean"]) == ("furthest x mean (level start / restarted)", "670 / 1180")
    assert (t["progress_max_title"], t["progress_max"]) == ("furthest x max", "1360")
    assert (t["success_title"], t["success_rate"]) == ("flag rate (level start / restarted)", "20.0 % / 50.0 %")
    assert t["measures_title"] == "furthest x and flag rate over time"
    assert t["legend_restarted"] == "furthest x of restarted episodes (mean)"
    charted = int(page.attrs["measures"]["data-points"] or 0)
    assert charted >= 5 and f"{charted} points" in t["measures_info"], t["measures_info"]

    image = screenshot(tmp_path, fed_gateway + "/", "live-page-measures.png")
    for name, bgr in (("progress", PROGRESS_BGR), ("restarted progress", RESTARTED_BGR), ("success rate", SUCCESS_BGR)):
        pixels = colour_pixels(image, bgr)
        assert pixels > 200, f"the {name} line is not in the screenshot ({pixels} pixels of its colour)"
