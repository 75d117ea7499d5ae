"""``flywheel run``'s plan: the replay checkpoints periodically under every preset, as the deployments do, and the
Unix sockets live in a new private folder that no other local user can make first."""

from __future__ import annotations

import os
import re
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from flywheel.cli import build_parser
from flywheel.launch.registry import settings_class
from flywheel.launch.run import make_plan
from flywheel.launch.runplan import DEFAULT_ENV, Plan
from flywheel.launch.runwatch import progress_line
from flywheel.services.replay.settings import ReplaySettings
from flywheel.settings import SettingsError, build_settings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_flywheel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def plans() -> Iterator[list[Plan]]:
    """Plans a test made; their sockets' folders are removed afterwards."""
    made: list[Plan] = []
    yield made
    for plan in made:
        plan.remove_socket_dir()


def plan_for(plans: list[Plan], tmp_path: Path, *argv: str) -> Plan:
    args = build_parser().parse_args(["run", "--checkpoint-dir", str(tmp_path / "ckpt"), "--base-port", "0",
                                      "--http-port", "0", *argv])
    plan = make_plan(args)
    plans.append(plan)
    return plan


def replay_settings(plan: Plan) -> ReplaySettings:
    """The replay's settings as the child will build them from the plan (presets, variables, --set resolved)."""
    settings: object = build_settings(settings_class("replay"), {k.lower(): v for k, v in plan.env["replay"].items()},
                                      "test")
    assert isinstance(settings, ReplaySettings)
    return settings


def deployed_interval() -> float | None:
    """FLYWHEEL_REPLAY_CHECKPOINT_INTERVAL_S as docker-compose.yml and k8s/configmap.yaml set it (None: neither sets a
    value, the preset's applies); they must agree."""
    compose = re.search(r"FLYWHEEL_REPLAY_CHECKPOINT_INTERVAL_S: \$\{FLYWHEEL_REPLAY_CHECKPOINT_INTERVAL_S:-(\d*)\}",
                        (ROOT / "docker-compose.yml").read_text())
    k8s = re.search(r'FLYWHEEL_REPLAY_CHECKPOINT_INTERVAL_S: "(\d+)"', (ROOT / "k8s" / "configmap.yaml").read_text())
    assert compose is not None, "docker-compose.yml passes FLYWHEEL_REPLAY_CHECKPOINT_INTERVAL_S through"
    assert (compose.group(1) or None) == (k8s.group(1) if k8s else None)
    return float(compose.group(1)) if compose.group(1) else None


# -- replay durability ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("env_id", ["CartPole-v1", DEFAULT_ENV])  # the vector and the mario preset
def test_the_replay_checkpoints_periodically_under_every_preset(plans: list[Plan], tmp_path: Path,
                                                                env_id: str) -> None:
    settings = replay_settings(plan_for(plans, tmp_path, "--env", env_id))
    assert settings.checkpoint_interval_s == 600
    assert settings.checkpoint_dir == (tmp_path / "ckpt" / "replay").resolve()


def test_every_preset_names_the_interval_and_the_deployments_keep_it() -> None:
    """A killed replay restarts with its data wherever it runs: every preset checkpoints it every 600 s, and
    compose and the ConfigMap leave that to the preset (an empty pass-through, no key)."""
    from flywheel import presets

    assert len(presets.names()) >= 3
    for name in presets.names():
        assert presets.load(name).sections["replay"]["checkpoint_interval_s"] == 600, name
    assert deployed_interval() is None


def test_the_user_still_chooses_the_interval(plans: list[Plan], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    assert replay_settings(plan_for(plans, tmp_path, "--env", "CartPole-v1", "--set",
                                    "replay.checkpoint_interval_s=0")).checkpoint_interval_s == 0
    monkeypatch.setenv("FLYWHEEL_REPLAY_CHECKPOINT_INTERVAL_S", "30")
    assert replay_settings(plan_for(plans, tmp_path, "--env", "CartPole-v1")).checkpoint_interval_s == 30


# -- the Unix sockets' folder ---------------------------------------------------------------------------------------

def _ipc_paths(plan: Plan) -> set[Path]:
    return {Path(part.removeprefix("ipc://")).parent for values in plan.env.values() for value in values.values()
            for part in value.split(",") if part.startswith("ipc://")}


def test_the_sockets_folder_is_new_private_and_ours(plans: list[Plan], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    squatted = tmp_path / f"flywheel-run-{os.getpid()}-0"  # the old, predictable path, made first by someone else
    squatted.mkdir()
    squatted.chmod(0o777)
    plan = plan_for(plans, tmp_path, "--env", "CartPole-v1")
    folder = plan.socket_dir
    assert folder is not None and folder != squatted and folder.parent in (tmp_path, Path("/tmp"))  # /tmp: too long
    info = folder.lstat()
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    assert _ipc_paths(plan) == {folder}  # every Unix socket of every service is in it
    assert len(f"{folder}/transitions".encode()) < 108  # sun_path
    other = plan_for(plans, tmp_path, "--env", "CartPole-v1")  # a second run of the same process: its own
    assert other.socket_dir not in (None, folder)
    plan.remove_socket_dir()
    assert not folder.exists() and squatted.exists()  # ours removed at the end; the squatter's left alone


def test_a_long_temp_dir_still_gives_short_socket_paths(plans: list[Plan], tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    folder = plan_for(plans, tmp_path, "--env", "CartPole-v1").socket_dir
    assert folder is not None and len(f"{folder}/transitions".encode()) < 108
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_refused_plan_leaves_no_folder(plans: list[Plan], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(SettingsError, match="capacity"):
        plan_for(plans, tmp_path, "--env", "CartPole-v1", "--set", "replay.capacity=many")
    assert not list(tmp_path.glob("flywheel-run-*"))
    tcp_only = plan_for(plans, tmp_path, "--env", "CartPole-v1", "--base-port", "47811", "--local-transport", "tcp")
    assert tcp_only.socket_dir is None and not list(tmp_path.glob("flywheel-run-*"))


def test_target_return_stops_on_the_actors_greedy_return_or_the_learners_kept_best() -> None:
    """In five fresh-clone CartPole runs the actors' rolling greedy return never held 475 while every kept best
    played 500 (docs/benchmarks/results/cartpole_best_play.json): either reaching the target stops the run."""
    from flywheel.launch.runwatch import target_reached

    assert target_reached({"greedy_return": 500.0, "env_steps": 9}, None) is None
    assert target_reached({"greedy_return": 400.0, "best_return": 470.0, "env_steps": 9}, 475) is None
    assert target_reached({"greedy_return": None, "best_return": None}, 475) is None
    assert "greedy return 480.0 reached the target 475 at 1234 env steps" in str(
        target_reached({"greedy_return": 480.0, "best_return": 500.0, "env_steps": 1234}, 475))
    best = target_reached({"greedy_return": 300.0, "best_return": 500.0, "best_version": 711, "env_steps": 99}, 475)
    assert best is not None and "kept best policy (v711) scored 500.0" in best
    assert "reached the target 475 at 99 env steps" in best  # the phrase tests/pipeline/test_learning_regression reads


# -- the progress line ----------------------------------------------------------------------------------------------

def test_the_progress_line_shows_the_envs_measures_under_its_own_labels() -> None:
    """The labels come from the actors' telemetry (the env's measures): level-start episodes, restarted ones apart;
    an env without measures shows none."""
    summary = {"env_steps": 5000.0, "env_steps_per_second": 100.0, "updates": 10.0, "updates_per_second": 1.0,
               "return": 1.0, "greedy_return": None, "epsilon_min": 0.01, "epsilon_max": 0.4, "replay_size": 100.0,
               "weight_version": 3.0, "actors_up": 2.0, "progress_mean": 1820.0, "progress_label": "furthest x",
               "restarted_progress_mean": 2400.0}
    assert progress_line(5.0, summary).endswith("| actors 2 | furthest x 1,820 (restarted 2,400)")
    alone = progress_line(5.0, {**summary, "restarted_progress_mean": None})
    assert alone.endswith("| actors 2 | furthest x 1,820")
    plain = progress_line(5.0, {**summary, "progress_label": None, "progress_mean": None})
    assert plain.endswith("| actors 2") and "restarted" not in plain


# -- a run.json of an earlier version -------------------------------------------------------------------------------

def test_a_run_json_that_sets_a_removed_setting_resumes_without_it_saying_so_in_one_line(
        plans: list[Plan], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Settings removed after their trials lost (learner.torso, learner.bootstrap_epsilon, actor.n_step_final, ...)
    may be in a run.json written before: --resume leaves each out with one line; the rest of the run comes back."""
    import json

    from pydantic import ValidationError

    from flywheel.launch import runconfig

    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({
        "format": "flywheel-run", "env_id": "CartPole-v1", "flags": {"env": "CartPole-v1", "actors": 1},
        "overrides": ["learner.torso=strided", "learner.lr=0.002", "actor.n_step_final=3",
                      "actor.n_step_anneal_steps=1000"],
        "services": {"replay": {"CAPACITY": "100000"}}}))
    args = build_parser().parse_args(["run", "--resume", "--checkpoint-dir", str(folder), "--base-port", "0",
                                      "--http-port", "0"])
    saved = runconfig.apply_saved(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("flywheel run --resume: ignoring ") for line in lines)
    assert "learner.torso=strided" in lines[0] and "has no setting 'torso'" in lines[0]
    assert args.set == ["learner.lr=0.002"] and args.env == "CartPole-v1" and args.actors == 1
    plan = make_plan(args)
    plans.append(plan)
    assert plan.settings["learner"].lr == 0.002
    runconfig.check_plan(saved, plan, folder)  # the vector preset's capacity, as the saved run had it
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):  # told one directly, it refuses
        settings_class("learner")(torso="strided")
