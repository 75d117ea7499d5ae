"""The ``flywheel`` command as users type it: --x / --no-x for booleans, --version, --log-format json."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # under any import mode
from pipeline_helpers import clean_env

from flywheel.cli import build_parser, package_version
from flywheel.launch.registry import settings_class
from flywheel.processes import launch
from flywheel.settings import JsonLogFormatter, settings_from_args


def settings(*argv: str) -> object:
    args = build_parser().parse_args(list(argv))
    return settings_from_args(settings_class(argv[0]), args, argv[0])


@pytest.mark.parametrize(("argv", "field", "value"), [
    (("learner", "--no-dueling"), "dueling", False),
    (("learner", "--double"), "double", True),
    (("learner", "--resume", "--checkpoint-dir", "ckpt"), "resume", True),
    (("learner", "--no-resume"), "resume", False),
    (("learner", "--resume", "auto"), "resume", "auto"),
    (("learner", "--resume", "true", "--checkpoint-dir", "ckpt"), "resume", True),  # the value form still works
    (("replay", "--no-prioritized"), "prioritized", False),
    (("replay", "--block-inserts"), "block_inserts", True),
    (("replay", "--restore", "false"), "restore", False),
    (("actor", "--no-torch-freeze"), "torch_freeze", False),
    (("gateway", "--no-control-enabled"), "control_enabled", False),
])
def test_boolean_settings_are_flag_pairs_for_every_service(argv: tuple[str, ...], field: str, value: object) -> None:
    assert getattr(settings(*argv), field) == value


def test_environment_variables_still_take_true_and_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_REPLAY_PRIORITIZED", "false")
    monkeypatch.setenv("FLYWHEEL_ACTOR_TORCH_FREEZE", "False")
    monkeypatch.setenv("FLYWHEEL_LEARNER_DUELING", "true")
    assert settings("replay").prioritized is False  # type: ignore[attr-defined]
    assert settings("actor").torch_freeze is False  # type: ignore[attr-defined]
    assert settings("learner").dueling is True  # type: ignore[attr-defined]
    assert settings("replay", "--prioritized").prioritized is True  # type: ignore[attr-defined]  # flag wins


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flywheel", *args], env=clean_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.system
def test_bare_boolean_flag_works_and_negative_flag_takes_no_value() -> None:
    result = run_cli("learner", "--no-resume", "true")
    assert result.returncode == 2 and "--no-resume takes no value" in result.stderr
    result = run_cli("learner", "--resume", "maybe", "--checkpoint-dir", "x")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "--resume" in lines[0] and "auto, true or false" in lines[0]


@pytest.mark.system
def test_version_prints_the_package_version_and_exits_zero() -> None:
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"flywheel {importlib.metadata.version('flywheel-rl')}" == (
        f"flywheel {package_version()}")


def test_json_formatter_writes_one_object_per_line_with_the_traceback() -> None:
    formatter = JsonLogFormatter("learner", "learner-0")
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        record = logging.getLogger("flywheel.learner").makeRecord(
            "flywheel.learner", logging.ERROR, __file__, 1, "failed %s", ("twice",), sys.exc_info())
    line = formatter.format(record)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["level"] == "ERROR" and entry["service"] == "learner" and entry["instance"] == "learner-0"
    assert entry["logger"] == "flywheel.learner" and entry["message"] == "failed twice"
    assert entry["ts"].endswith("Z") and entry["exc_type"] == "ValueError"
    assert "Traceback" in entry["exc_info"] and "bad\nthing" in entry["exc_info"]


@pytest.mark.system
def test_a_service_started_with_log_format_json_writes_json_lines(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    any_port = "tcp://127.0.0.1:0"
    proc = launch(["gateway", "--log-format", "json", "--http-host", "127.0.0.1", "--http-port", "0",
                   "--telemetry-endpoint", any_port, "--control-endpoint", any_port, "--lease-endpoint", any_port,
                   "--instance", "gw-json"], clean_env(), log)
    try:
        deadline = time.monotonic() + 60
        while "HTTP on" not in log.read_text() and "startup complete" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line parses
    assert entries and all({"ts", "level", "service", "logger", "message"} <= set(e) for e in entries)
    assert {e["service"] for e in entries} == {"gateway"} and {e["instance"] for e in entries} == {"gw-json"}
    assert any("HTTP on" in e["message"] for e in entries)
    assert any(e["logger"].startswith("uvicorn") for e in entries), "uvicorn's own lines go through the handler"


def test_run_passes_log_format_to_every_child(tmp_path: Path) -> None:
    from flywheel.launch.run import make_plan

    args = build_parser().parse_args(["run", "--env", "CartPole-v1", "--log-format", "json", "--checkpoint-dir",
                                      str(tmp_path), "--base-port", "0", "--http-port", "0"])
    plan = make_plan(args)
    assert {service: values["LOG_FORMAT"] for service, values in plan.env.items()} == {
        "gateway": "json", "replay": "json", "learner": "json", "actor": "json"}
    plain = make_plan(build_parser().parse_args(["run", "--env", "CartPole-v1", "--checkpoint-dir", str(tmp_path),
                                                 "--base-port", "0", "--http-port", "0"]))
    assert all("LOG_FORMAT" not in values for values in plain.env.values())


def test_every_commands_help_renders(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse formats help with %: a bare percent sign in a help string breaks `flywheel --help` (the image's
    build checks it), so every parser's help is rendered here."""
    import argparse

    parser = build_parser()
    parsers = [parser]
    while parsers:
        current = parsers.pop()
        assert current.format_help()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                parsers.extend(action.choices.values())
