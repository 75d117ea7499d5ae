"""W&B tracking (``--track``) in offline mode, read back from the run files: the sink alone, its resume and retries,
a real ``flywheel run --track`` (and its --resume), and the one-line error when wandb cannot be imported."""

from __future__ import annotations

import csv
import json
import logging
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from flywheel.settings import SettingsError
from flywheel.testing.run import clean_env
from flywheel.tracking import (
    INSTALL_HINT,
    RUN_ID_FILE,
    TrackingUnavailable,
    WandbSink,
    default_mode,
    parse_tags,
    sync_command,
)

wandb = pytest.importorskip("wandb")  # the dev extra has it (and the track extra)

CHEAP = ["--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2", "--base-port", "0", "--http-port", "0",
         "--no-video", "--progress-interval", "1", "--set", "replay.min_size_to_sample=200"]
BLOCK, HEADER = 32768, 7  # the .wandb file: LevelDB-log blocks of records, after a 7-byte ":W&B" header


def wandb_env(home: Path) -> dict[str, str]:
    """Offline, and every W&B folder (config, cache, data) under ``home``: nothing outside the test is touched."""
    return {"WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(home / "config"), "WANDB_CACHE_DIR": str(home / "cache"),
            "WANDB_DATA_DIR": str(home / "data"), "WANDB_SILENT": "true"}


@pytest.fixture(autouse=True)
def _offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in wandb_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(name, value)


def records(path: Path) -> list[Any]:
    """Every record of a .wandb file (wandb's own protobuf ``Record``), in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = path.read_bytes()
    assert struct.unpack("<4sHB", raw[:HEADER]) == (b":W&B", 0xBEE1, 0), raw[:HEADER]
    out, pos, chunks = [], HEADER, b""
    while pos + HEADER <= len(raw):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + HEADER])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunks = (b"" if kind in (1, 2) else chunks) + raw[pos + HEADER:pos + HEADER + length]  # full/first: new
        pos += HEADER + length
        if kind in (1, 4):  # full or last: a whole record
            record = pb.Record()
            record.ParseFromString(chunks)
            out.append(record)
    return out


def read_run(run_dir: Path) -> dict[str, Any]:
    """An offline run folder as {id, project, group, tags, config, history: {step: {key: value}}}."""
    (path,) = run_dir.glob("run-*.wandb")
    run: dict[str, Any] = {"history": {}}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.update(id=r.run_id, project=r.project, group=r.run_group, tags=list(r.tags),
                       config={u.key: json.loads(u.value_json) for u in r.config.update})
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in record.history.item}
            run["history"][record.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    return run


def offline_runs(track_dir: Path) -> list[dict[str, Any]]:
    """Every offline run under TRACK_DIR/wandb, oldest first (a resumed run adds a folder with the same id)."""
    return [read_run(d) for d in sorted((track_dir / "wandb").glob("offline-run-*"))]


@pytest.mark.system  # wandb starts its wandb-core process
def test_offline_points_are_read_back_and_a_resumed_run_continues(tmp_path: Path) -> None:
    sink = WandbSink(tmp_path, project="flywheel-test", group="cartpole", tags=["t1", "t2"], mode="offline",
                     config={"env_id": "CartPole-v1", "gateway": {"curves_interval_s": 1.0}})
    for step in (100, 200, 300):
        assert sink.log(step, {"learner/loss": step / 1000, "replay/size": 2.0 * step})
    assert not sink.log(250, {"replay/size": 1.0})  # steps never go back: left out, not an error
    assert sink.log(300, {"learner/updates": 7.0})  # the same step again: added to that point
    sink.close()
    sink.close()  # twice is fine
    assert sink.failures == 0 and (tmp_path / RUN_ID_FILE).read_text().strip() == sink.run_id
    (first,) = offline_runs(tmp_path)
    assert (first["id"], first["project"], first["group"], first["tags"]) == (sink.run_id, "flywheel-test",
                                                                              "cartpole", ["t1", "t2"])
    assert first["config"]["env_id"] == "CartPole-v1" and first["config"]["gateway"] == {"curves_interval_s": 1.0}
    assert first["history"] == {100: {"learner/loss": 0.1, "replay/size": 200.0},
                                200: {"learner/loss": 0.2, "replay/size": 400.0},
                                300: {"learner/loss": 0.3, "replay/size": 600.0, "learner/updates": 7.0}}

    with WandbSink(tmp_path, project="flywheel-test", mode="offline", resume=True) as resumed:  # the curves go on
        assert resumed.run_id == sink.run_id
        for step in (400, 500):
            assert resumed.log(step, {"replay/size": 2.0 * step})
    runs = offline_runs(tmp_path)
    assert [r["id"] for r in runs] == [sink.run_id] * 2  # `wandb sync` uploads both parts, in order, as one run
    steps = [step for r in runs for step in r["history"]]
    assert steps == [100, 200, 300, 400, 500]

    with WandbSink(tmp_path, project="flywheel-test", mode="offline") as new:  # curves that start over: a new run
        assert new.run_id != sink.run_id and (tmp_path / RUN_ID_FILE).read_text().strip() == new.run_id


@pytest.mark.system
def test_a_failed_call_is_logged_once_counted_and_retried(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class Gone:
        """A run whose W&B service went away."""

        def log(self, values: dict[str, float], step: int) -> None:
            raise BrokenPipeError("wandb-core is gone")

    class NoService:
        """wandb that cannot start a run."""

        Settings = wandb.Settings

        def init(self, **kwargs: Any) -> None:
            raise RuntimeError("cannot start wandb-core")

    caplog.set_level(logging.INFO, logger="flywheel.tracking")
    sink = WandbSink(tmp_path, mode="offline", retry_start_s=0.0)
    assert sink.log(100, {"replay/size": 1.0})
    first_run, sink.run = sink.run, Gone()
    assert not sink.log(200, {"replay/size": 2.0})  # kept, and the run is started again next time
    first_run.finish()
    sink.wandb = NoService()
    assert not sink.log(300, {"replay/size": 3.0})
    assert sink.failures == 2
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "BrokenPipeError" in warnings[0], warnings
    sink.wandb = wandb  # the service is back: every kept point goes, in order, to the same run
    assert sink.log(400, {"replay/size": 4.0})
    sink.close()
    assert "tracking: W&B takes points again" in caplog.text
    runs = offline_runs(tmp_path)
    assert {r["id"] for r in runs} == {sink.run_id}
    assert [(s, v["replay/size"]) for r in runs for s, v in r["history"].items()] == [
        (100, 1.0), (200, 2.0), (300, 3.0), (400, 4.0)]


def test_settings_tags_and_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    from flywheel.services.gateway.settings import GatewaySettings

    assert parse_tags(" a, b,,a ,c") == ["a", "b", "c"]
    with pytest.raises(ValueError, match="longer than 64"):
        parse_tags("x" * 65)
    assert default_mode({"WANDB_MODE": "offline"}) == "offline" and default_mode({}) == "online"
    assert GatewaySettings(track=True, curves_dir=Path("/tmp/c")).track_mode == "offline"  # WANDB_MODE=offline
    for bad in ({"track": True}, {"track_project": "a/b"}, {"track_tags": "y" * 70}, {"track_mode": "cloud"}):
        with pytest.raises(ValueError):
            GatewaySettings(**bad)
    assert sync_command("/runs/ck pt") == "wandb sync '/runs/ck pt/wandb'/offline-run-*"


@pytest.mark.system
def test_the_gateway_tracks_its_curve_points_and_counts_failures(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway's curves writer with tracking on: W&B refusing to start never stops the curves; it is counted
    in /metrics, and once W&B works the points it missed arrive, with the curves' steps and values."""
    import asyncio

    from flywheel import proto, tracking
    from flywheel.services.gateway import views
    from flywheel.services.gateway.curves_writer import write_curves
    from flywheel.services.gateway.settings import GatewaySettings
    from flywheel.services.gateway.transport import GatewayService

    def refuse(**kwargs: Any) -> None:
        raise ConnectionRefusedError("no W&B here")

    real_init = wandb.init
    monkeypatch.setattr(wandb, "init", refuse)
    monkeypatch.setattr(tracking, "RETRY_START_S", 0.0)
    folder = tmp_path / "curves"
    gw = GatewayService(GatewaySettings(instance="gw-test", curves_dir=folder, curves_interval_s=0.05, track=True,
                                        track_project="flywheel-gw", track_tags="gw"))

    def csv_steps() -> list[int]:
        try:
            with open(folder / "progress.csv", newline="") as fh:
                return [int(r["env_steps"]) for r in csv.DictReader(fh)]
        except FileNotFoundError:
            return []

    async def until(check: Any, what: str) -> None:
        for _ in range(400):
            if check():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"timed out waiting for {what}")

    async def scenario() -> None:
        task = asyncio.create_task(write_curves(gw, folder, 0.05), name="gateway-curves")
        for seq, steps in enumerate((1000.0, 2000.0), 1):
            gw.registry.update(proto.Telemetry("actor", "actor-0", seq, 0.0, {"env_steps_total": steps},
                                               {"episode_return_mean": steps / 100}, {}))
            await until(lambda s=steps: int(s) in csv_steps(), f"a curve point at {steps:.0f}")  # curves go on
        await until(lambda: gw.tracking_failures >= 2, "failures counted")
        text = views.metrics_text(gw)
        assert f'flywheel_gateway_tracking_failures_total{{service="gateway",instance="gw-test"}} ' \
               f"{gw.tracking_failures}" in text
        monkeypatch.setattr(wandb, "init", real_init)  # W&B works again
        gw.registry.update(proto.Telemetry("actor", "actor-0", 3, 0.0, {"env_steps_total": 3000.0},
                                           {"episode_return_mean": 30.0}, {}))
        await until(lambda: 3000 in csv_steps(), "a curve point at 3000")
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    gw.ctx.term()
    runs = offline_runs(folder)  # track_dir defaults to the curves folder
    assert {r["id"] for r in runs} == {(folder / RUN_ID_FILE).read_text().strip()}
    assert runs[0]["project"] == "flywheel-gw" and runs[0]["tags"] == ["gw"]
    assert runs[0]["config"]["gateway"]["curves_interval_s"] == 0.05
    history = {step: values for r in runs for step, values in r["history"].items()}
    assert sorted(history) == sorted(set(csv_steps())) and {1000, 2000, 3000} <= set(history)
    assert history[2000]["returns/episode"] == 20.0 and history[3000]["returns/episode"] == 30.0


def flywheel_run(cwd: Path, *argv: str, env: dict[str, str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flywheel", "run", *CHEAP, *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.system
def test_flywheel_run_track_offline_holds_the_curves_points(tmp_path: Path) -> None:
    env = clean_env(**wandb_env(tmp_path / "wandb-home"))
    ckpt = tmp_path / "ckpt"
    track = ["--track", "--wandb-project", "flywheel-ci", "--wandb-group", "cartpole", "--wandb-tags", "ci,offline"]
    done = flywheel_run(tmp_path, "--checkpoint-dir", "ckpt", "--steps", "3000", *track, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if "W&B" in x)
    assert line == (f"flywheel: tracking to W&B offline (project flywheel-ci, group cartpole) in {ckpt / 'wandb'}; "
                    f"upload later with: wandb sync {ckpt / 'wandb'}/offline-run-*"), line
    run_id = (ckpt / RUN_ID_FILE).read_text().strip()
    (run,) = offline_runs(ckpt)
    assert (run["id"], run["project"], run["group"], run["tags"]) == (run_id, "flywheel-ci", "cartpole",
                                                                      ["ci", "offline"])
    assert run["config"]["env_id"] == "CartPole-v1" and run["config"]["gateway"]["track_mode"] == "offline"
    assert run["config"]["services"]["gateway"]["TRACK"] == "true"  # run.json, as flywheel run wrote it
    with open(ckpt / "progress.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    steps = list(run["history"])
    assert steps == sorted(set(steps)) and steps == sorted({int(r["env_steps"]) for r in rows})  # the same points
    assert steps[-1] >= 3000, steps
    last = run["history"][steps[-1]]
    assert {"learner/updates", "replay/size", "actors/env_steps_per_second"} <= set(last), last
    assert last["replay/size"] == pytest.approx(float(rows[-1]["replay_size"]), rel=1e-5)
    assert "tracking: W&B run" in (ckpt / "logs" / "gateway-0.log").read_text()

    again = flywheel_run(tmp_path, "--resume", "--checkpoint-dir", "ckpt", "--steps", "4500", env=env)  # run.json
    # brings --track and its W&B names back
    assert again.returncode == 0, again.stdout + again.stderr
    first, second = offline_runs(ckpt)
    assert first["id"] == second["id"] == run_id
    assert second["history"] and min(second["history"]) > steps[-1]  # the steps go on from the first part
    assert max(second["history"]) >= 4500


@pytest.mark.system
@pytest.mark.parametrize("command", ["run", "gateway"])
def test_tracking_without_wandb_is_one_clear_line(tmp_path: Path, command: str) -> None:
    shim = tmp_path / "shim" / "wandb"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text('raise ImportError("No module named \'wandb\'")\n')
    env = clean_env(PYTHONPATH=str(shim.parent), **wandb_env(tmp_path / "wandb-home"))
    argv = ([*CHEAP, "--track", "--checkpoint-dir", str(tmp_path / "ckpt")] if command == "run" else
            ["--track", "--curves-dir", str(tmp_path / "ckpt"), "--http-port", "0"])
    done = subprocess.run([sys.executable, "-m", "flywheel", command, *argv], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    where = "flywheel run --track" if command == "run" else "flywheel gateway"
    missing = TrackingUnavailable(ImportError("No module named 'wandb'"))  # flywheel/extras.py's wording
    assert lines == [f"error: {where}: {missing}"] and INSTALL_HINT in lines[0], lines
    assert not (tmp_path / "ckpt" / "logs").exists()  # nothing started


def test_track_env_refuses_bad_tags() -> None:
    import argparse

    from flywheel.launch.tracking_cli import track_env

    args = argparse.Namespace(track=True, wandb_project="p", wandb_entity="", wandb_group="", wandb_tags="z" * 80)
    with pytest.raises(SettingsError, match="flywheel run --track: tag"):
        track_env(args)
    args.wandb_tags = "a,b"
    assert track_env(args) == {"TRACK": "true", "TRACK_PROJECT": "p", "TRACK_TAGS": "a,b", "TRACK_MODE": "offline"}
