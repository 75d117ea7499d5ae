"""Presets as data: the shipped YAML files, the settings source every service reads, precedence, the CLI."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from flywheel import presets
from flywheel.cli import build_parser, main
from flywheel.launch import run as run_module
from flywheel.launch import runconfig
from flywheel.launch.registry import settings_class
from flywheel.launch.runplan import Plan
from flywheel.netspec import NETWORK_FIELDS
from flywheel.settings import SettingsError, build_settings

LearnerSettings = settings_class("learner")
ActorSettings = settings_class("actor")


@pytest.fixture(autouse=True)
def _no_preset_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests choose presets themselves (tests/conftest.py sets FLYWHEEL_PRESET=none for every other test)."""
    for name in [n for n in os.environ if n.startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)


@pytest.mark.parametrize("name", presets.names())
def test_every_shipped_preset_names_real_settings_and_builds(name: str) -> None:
    preset = presets.load(name)
    assert preset.description and len(preset.sha256) == 64
    for service in presets.SERVICES:
        fields = settings_class(service).model_fields
        assert set(preset.sections.get(service, {})) <= set(fields), f"{name}: {service} has no such setting"
        env_id = {"vector": "CartPole-v1", "pixel": "SuperMarioBros-1-1-v0", "mario": "SuperMarioBros-1-1-v0",
                  "atari": "ALE/Pong-v5", "grid": "Snake-v0"}[name]
        values = {"preset": name} | ({"env_id": env_id} if "env_id" in fields else {}) | (
            {"device": "cpu"} if service == "learner" else {})
        settings = build_settings(settings_class(service), values, service)
        for key, value in preset.section(service).items():  # each value arrives, as its field's type
            if key not in fields:  # a common value goes to the services that have the field
                continue
            assert getattr(settings, key) == type(getattr(settings, key))(value), (name, service, key)
    assert set(preset.sections.get("run", {})) <= set(presets.RUN_KEYS)
    every = {name for service in presets.SERVICES for name in settings_class(service).model_fields}
    assert set(preset.sections.get("common", {})) <= every, f"{name}: a common value no service has"


def test_presets_are_chosen_from_the_env_id() -> None:
    assert presets.name_for_env("CartPole-v1") == "vector"
    assert presets.name_for_env("SuperMarioBros-1-1-v0?size=42,crop_top=32") == "mario"
    assert presets.name_for_env(presets.DEFAULT_ENV) == "mario"  # the default job: rejump=true is the controller
    assert presets.name_for_env("SuperMarioBros-v0") == presets.name_for_env("SuperMarioBrosRandomStages-v1") \
        == "pixel"  # whole-game and random-stage ids keep no start states: mario's curriculum would refuse them
    assert presets.name_for_env("ALE/Breakout-v5", "uint8") == "atari"
    assert presets.name_for_env("Snake-v0?size=12") == presets.name_for_env("MettaGrid-v0") == "grid"
    snake = LearnerSettings(env_id="Snake-v0", device="cpu")
    assert (snake.lr, snake.batch_size, snake.tau) == (0.002, 128, 0.02)  # vector's recipe, which grid extends
    assert ActorSettings(env_id="MettaGrid-v0").num_envs % 4 == 0  # whole simulations of its 4 agents
    cartpole = LearnerSettings(env_id="CartPole-v1", device="cpu")
    assert (cartpole.lr, cartpole.batch_size, cartpole.tau) == (0.002, 128, 0.02)
    mario = LearnerSettings(env_id="SuperMarioBros-1-1-v0", device="cpu")
    assert (mario.lr, mario.batch_size, mario.compile) == (0.00025, 32, "on")  # lr mario's own, the rest pixel's
    assert LearnerSettings(env_id="SuperMarioBros-v0", device="cpu").lr == 0.0001  # the whole game: pixel's
    mario_actor = ActorSettings(env_id="SuperMarioBros-1-1-v0")
    assert (mario_actor.gamma, mario_actor.num_envs) == (0.9, 8)  # pixel's, which mario extends
    assert (mario_actor.n_step, mario_actor.start_state_share) == (10, 0.25)  # mario's own
    assert ActorSettings(env_id="SuperMarioBros-1-1-v0", preset="pixel").start_state_share == 0.0
    assert ActorSettings(env_id="CartPole-v1").hidden == LearnerSettings(env_id="CartPole-v1").hidden == 128


def test_precedence_flags_over_variables_over_preset_over_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    default = LearnerSettings.model_fields["lr"].default
    assert LearnerSettings(env_id="CartPole-v1", preset="none").lr == default
    assert LearnerSettings(env_id="CartPole-v1").lr == 0.002  # the preset over the default
    monkeypatch.setenv("FLYWHEEL_LEARNER_LR", "0.003")
    assert LearnerSettings(env_id="CartPole-v1").lr == 0.003  # a variable over the preset
    assert LearnerSettings(env_id="CartPole-v1", lr=0.004).lr == 0.004  # a flag over both
    assert LearnerSettings(env_id="CartPole-v1").batch_size == 128  # the preset's other values stay


def test_the_preset_is_named_by_flag_service_variable_or_global_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_PRESET", "pixel")
    assert LearnerSettings(env_id="CartPole-v1").batch_size == 32  # the global variable names it
    monkeypatch.setenv("FLYWHEEL_LEARNER_PRESET", "vector")
    assert LearnerSettings(env_id="CartPole-v1").batch_size == 128  # the service's own variable wins
    assert LearnerSettings(env_id="CartPole-v1", preset="none").batch_size == 512  # and the flag over both


def test_a_users_yaml_file_is_a_preset(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text("description: mine\ncommon: {hidden: 64}\nlearner: {lr: 0.0005}\nactor: {gamma: 0.95}\n")
    learner = LearnerSettings(env_id="CartPole-v1", preset=str(path))
    assert (learner.lr, learner.hidden, learner.batch_size) == (0.0005, 64, 512)  # the rest: defaults
    actor = ActorSettings(env_id="CartPole-v1", preset=str(path))
    assert (actor.gamma, actor.hidden) == (0.95, 64)


def test_a_preset_extends_another_and_overrides_some_of_its_values(tmp_path: Path) -> None:
    vector = presets.load("vector")
    assert presets.load("grid").sections == vector.sections  # grid takes vector's recipe whole, for now
    path = tmp_path / "wider.yaml"
    path.write_text("extends: vector\nlearner: {lr: 0.0005}\n")
    wider = presets.load(str(path))
    assert wider.section("learner") == {**vector.section("learner"), "lr": 0.0005}
    assert wider.section("actor") == vector.section("actor") and wider.sha256 != vector.sha256
    learner = LearnerSettings(env_id="CartPole-v1", preset=str(path))
    assert (learner.lr, learner.tau, learner.batch_size) == (0.0005, 0.02, 128)
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(presets.PresetError, match="extends loops back"):
        presets.load(str(tmp_path / "a.yaml"))
    (tmp_path / "c.yaml").write_text("extends: [vector]\n")
    with pytest.raises(presets.PresetError, match="extends must name one preset"):
        presets.load(str(tmp_path / "c.yaml"))


@pytest.mark.parametrize(("content", "message"), [
    ("learner: {lrr: 0.1}\n", "learner has no setting 'lrr'"),
    ("learnr: {lr: 0.1}\n", "unknown section(s) learnr"),
    ("learner: [1, 2]\n", "section 'learner' must map setting names to values"),
    ("learner: {lr: [1]}\n", "learner.lr must be a single value"),
    ("learner: {lr: 0.1\n", "not valid YAML"),
    ("learner: {lr: -1}\n", "invalid value"),
    ("run: {spare_core: 1}\n",
     "run.spare_core is not one of flywheel run's choices (clip_interval_s, learner_core_share, spare_cores)"),
])
def test_a_bad_preset_file_is_one_line_naming_it(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / f"bad{abs(hash(content))}.yaml"
    path.write_text(content)
    with pytest.raises(SettingsError) as caught:
        build_settings(LearnerSettings, {"env_id": "CartPole-v1", "preset": str(path)}, "learner")
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_unknown_names_and_missing_files_are_refused() -> None:
    with pytest.raises(SettingsError, match="unknown preset 'fast': choose one of atari, grid, mario, pixel, vector"):
        build_settings(LearnerSettings, {"preset": "fast"}, "learner")
    with pytest.raises(SettingsError, match="preset file /nonexistent/x.yaml"):
        build_settings(LearnerSettings, {"preset": "/nonexistent/x.yaml"}, "learner")


def test_a_check_across_settings_is_one_line_without_a_made_up_flag() -> None:
    with pytest.raises(SettingsError) as caught:
        build_settings(LearnerSettings, {"lr_final": 1e-4}, "learner")
    message = str(caught.value)
    assert message.startswith("flywheel learner: invalid settings: ") and "an lr schedule needs both" in message
    assert "--?" not in message and "\n" not in message


def test_presets_command_lists_and_shows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "list"]) == 0
    listed = capsys.readouterr().out
    assert all(f"{name} " in listed for name in presets.names())
    assert main(["presets", "show", "pixel"]) == 0
    shown = capsys.readouterr().out
    assert presets.load("pixel").sha256 in shown and "gamma: 0.9" in shown
    assert main(["presets", "show", "grid"]) == 0
    shown = capsys.readouterr().out
    assert "extends: vector" in shown and "# resolved" in shown and "tau: 0.02" in shown
    assert main(["presets", "show", "fast"]) == 2
    assert "error: flywheel presets: unknown preset 'fast'" in capsys.readouterr().err


def _plan(tmp_path: Path, *extra: str) -> tuple[argparse.Namespace, Plan]:
    args = build_parser().parse_args(["run", "--checkpoint-dir", str(tmp_path / "ckpt"), "--base-port", "0",
                                      "--http-port", "0", *extra])
    plan = run_module.make_plan(args)
    plan.remove_socket_dir()
    return args, plan


def test_flywheel_run_hands_its_children_the_presets_name_and_records_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    args, plan = _plan(tmp_path, "--env", "CartPole-v1", "--set", "learner.lr=0.01")
    vector = presets.load("vector")
    assert plan.preset == vector
    for service in presets.SERVICES:
        assert plan.env[service]["PRESET"] == "vector"  # each child reads it, as a service started alone does
        passed = {f.upper() for f in NETWORK_FIELDS} if service == "actor" else {"LR"}  # the network, the --set
        assert not (set(vector.as_variables(service)) - passed) & set(plan.env[service]), service  # no copies
        for key, value in vector.section(service).items():
            if key in settings_class(service).model_fields and (service, key) != ("learner", "lr"):
                assert getattr(plan.settings[service], key) == value, (service, key)
    assert plan.env["learner"]["LR"] == "0.01" and plan.settings["learner"].lr == 0.01  # --set wins
    assert plan.actor_extra[0]["CLIP_INTERVAL_S"] == "120"  # the preset's run section
    monkeypatch.setattr(runconfig, "_git_commit", lambda: None)  # no git process in a fast test
    record = runconfig.build_run_config(args, plan, None)
    assert record["preset"] == {"name": "vector", "sha256": vector.sha256}
    assert record["flags"]["preset"] is None
    assert record["overrides"] == ["learner.lr=0.01"] and record["settings"]["replay"]["capacity"] == 100_000


def test_flywheel_run_preset_flag_takes_a_name_or_file_and_refuses_unknown_ones(tmp_path: Path) -> None:
    _, plan = _plan(tmp_path, "--env", "CartPole-v1", "--preset", "pixel")
    assert plan.env["learner"]["PRESET"] == "pixel" and "BATCH_SIZE" not in plan.env["learner"]
    assert plan.settings["learner"].batch_size == 32 and plan.settings["actor"].gamma == 0.9
    path = tmp_path / "mine.yaml"
    path.write_text("learner: {lr: 0.0007}\n")
    _, plan = _plan(tmp_path, "--env", "CartPole-v1", "--preset", str(path))
    assert plan.env["learner"]["PRESET"] == str(path.resolve()) and "LR" not in plan.env["learner"]
    assert plan.settings["learner"].lr == 0.0007 and plan.settings["learner"].batch_size == 512  # not vector's 128
    _, plan = _plan(tmp_path, "--env", "CartPole-v1", "--preset", "none")
    assert plan.preset is None and plan.env["actor"]["PRESET"] == "none" and plan.settings["actor"].num_envs == 8
    with pytest.raises(SettingsError, match="flywheel run: --preset: unknown preset 'fast'"):
        _plan(tmp_path, "--env", "CartPole-v1", "--preset", "fast")


@pytest.mark.parametrize(("env_id", "named"), [("CartPole-v1", "vector"), ("CartPole-v1", "pixel"),
                                               ("CartPole-v1", "mine.yaml")])
def test_a_service_started_by_flywheel_run_gets_the_settings_of_one_started_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env_id: str, named: str) -> None:
    """One road from a preset to settings: a child of flywheel run reads its variables (the preset's name, the
    wiring, the user's values) as a service started alone with the same env id and preset reads its own."""
    if named == "mine.yaml":
        named = str(tmp_path / named)
        Path(named).write_text("extends: vector\ncommon: {hidden: 96}\nlearner: {lr: 0.003}\nactor: {gamma: 0.95}\n")
    _, plan = _plan(tmp_path, "--env", env_id, "--preset", named)
    for service in presets.SERVICES:
        cls = settings_class(service)
        with monkeypatch.context() as m:  # the child: its FLYWHEEL_<SERVICE>_* variables, nothing else
            for key, value in plan.env[service].items():
                m.setenv(f"FLYWHEEL_{service.upper()}_{key}", value)
            child = cls()
        prefix = f"FLYWHEEL_{service.upper()}_"
        with monkeypatch.context() as m:  # started alone (as compose starts it): the env id and the preset
            m.setenv(f"{prefix}PRESET", named)
            if "env_id" in cls.model_fields:
                m.setenv(f"{prefix}ENV_ID", env_id)
            alone = cls()
        wired = {key.lower() for key in plan.env[service]} - {"preset", "env_id"}
        for field in set(cls.model_fields) - wired - {"instance"}:
            assert getattr(child, field) == getattr(alone, field), (service, field)
        assert child.model_dump(exclude={"instance"}) == plan.settings[service].model_dump(exclude={"instance"})
    assert plan.settings["actor"].hidden == plan.settings["learner"].hidden == (96 if "mine" in named else 128 if
                                                                                named == "vector" else 256)


@pytest.mark.system  # starts learner processes
def test_a_service_names_its_preset_in_its_first_lines(tmp_path: Path) -> None:
    """A learner started on its own (as in compose) reads its env id's preset and says which, first thing."""
    import socket
    import subprocess
    import sys

    from flywheel.testing.run import clean_env

    def start_lines(**env: str) -> str:  # a port in use stops it right after its first line
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            return subprocess.run([sys.executable, "-m", "flywheel", "learner", "--env-id", "CartPole-v1", "--device",
                                   "cpu", "--weights-bind", f"tcp://127.0.0.1:{port}"], env=clean_env(**env),
                                  capture_output=True, text=True, timeout=120).stderr

    vector = presets.load("vector")
    assert f"learner: preset vector (sha256 {vector.sha256[:12]})" in start_lines(FLYWHEEL_PRESET="")
    assert "learner: preset pixel" in start_lines(FLYWHEEL_PRESET="pixel")
    assert "preset" not in start_lines()  # clean_env: FLYWHEEL_PRESET=none, and errors stay one line


def test_the_actor_count_follows_the_presets_spare_cores(tmp_path: Path) -> None:
    assert run_module.default_actors(presets.load("mario"), cores=2) == 2  # Mario: one actor per core
    assert run_module.default_actors(presets.load("atari"), cores=8) == 7  # a core left to the 84x84 learner
    assert run_module.default_actors(presets.load("atari"), cores=1) == 1
    assert run_module.default_actors(presets.load("vector"), cores=3) == 3
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: pixel\nrun: {spare_cores: 3}\n")
    args, plan = _plan(tmp_path, "--env", "CartPole-v1", "--preset", str(mine))
    assert args.actors == max(1, (os.cpu_count() or 1) - 3) == len(plan.actor_extra)
    for bad in ("-1", "1.5", "two", "true"):
        mine.write_text(f"run: {{spare_cores: {bad}}}\n")
        presets._load.cache_clear()
        with pytest.raises(SettingsError, match=r"run.spare_cores must be a whole number >= 0"):
            _plan(tmp_path, "--env", "CartPole-v1", "--preset", str(mine))


def test_a_bad_learner_core_share_is_one_line_naming_it(tmp_path: Path) -> None:
    assert run_module.learner_core_share(presets.load("mario")) == 0.3
    assert run_module.learner_core_share(presets.load("vector")) == 0.0
    mine = tmp_path / "mine.yaml"
    for bad in ("-0.1", "1.5", "half", "true"):
        mine.write_text(f"extends: pixel\nrun: {{learner_core_share: {bad}}}\n")
        presets._load.cache_clear()
        with pytest.raises(SettingsError, match=r"run.learner_core_share must be a number in \[0, 1\]"):
            _plan(tmp_path, "--env", "CartPole-v1", "--preset", str(mine))
