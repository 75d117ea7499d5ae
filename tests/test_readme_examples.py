"""Every ``flywheel ...`` command in README.md's bash blocks is run, bounded and cheap, so the README cannot rot.

``flywheel run`` examples run for real, in README order in one scratch folder (so ``--resume`` continues the
run an earlier example made), with free ports, ``--no-video`` and a safety ``--time-limit`` appended; each is
stopped with Ctrl-C (SIGINT) once its learner and actors report and the actors have stepped. ``flywheel
play`` runs there too, its episodes cut at PLAY_MAX_STEPS, and ``flywheel keys`` runs as written. Long-lived
services (``flywheel replay|learner|actor|gateway``) are not started: their flags are parsed and their settings,
env ids and CURVE key folders validated as the service would at start. Anything else is parsed by ``flywheel``'s
own argument parser.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pipeline"))
from pipeline_helpers import clean_env, get_json, wait_until

from flywheel.testing.run import launcher_endpoints

README = Path(__file__).resolve().parents[1] / "README.md"
SERVICES = ("replay", "learner", "actor", "gateway")
RUN_SECONDS = 1  # how long a run example trains once every child reports, before Ctrl-C
RUN_LIMIT_S = 100  # the --time-limit appended as a safety net
PLAY_MAX_STEPS = 100
RUN_TIMEOUT_S = 150  # a run that has not stopped by then is a failure (children start, train, checkpoint)
CONTROL_TOKEN = "readme-example-token-0123456789"  # containers mount one; a gateway beyond loopback needs it
_FENCE = re.compile(r"^\s*```\s*([\w+-]*)")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_SEPARATORS = {";", "&&", "||", "|", "&"}


@dataclass(frozen=True)
class Example:
    """One ``flywheel`` command of the README: where it is and its arguments after ``flywheel``."""

    line: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    @property
    def command(self) -> str:
        return self.argv[0] if self.argv else ""

    def __str__(self) -> str:
        return f"README.md:{self.line}: flywheel {shlex.join(self.argv)}"


def bash_blocks(text: str) -> list[tuple[int, list[str]]]:
    """(first line number, lines) of every fenced block tagged bash/sh/shell/console (others are skipped)."""
    blocks: list[tuple[int, list[str]]] = []
    inside, keep, start, lines = False, False, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        fence = _FENCE.match(line)
        if fence and not inside:
            inside, keep, start, lines = True, fence.group(1) in ("bash", "sh", "shell", "console"), number + 1, []
        elif fence:
            if keep:
                blocks.append((start, lines))
            inside = False
        elif inside:
            lines.append(line)
    return blocks


def logical_lines(start: int, lines: list[str]) -> list[tuple[int, str]]:
    """Join ``\\`` continuations; drop a leading ``$ `` prompt; keep the number of each command's first line."""
    out: list[tuple[int, str]] = []
    pending, first = "", start
    for offset, raw in enumerate(lines):
        line = raw.rstrip()
        if not pending:
            first = start + offset
            line = re.sub(r"^\s*\$\s+", "", line)
        if line.endswith("\\") and not line.lstrip().startswith("#"):
            pending += line[:-1] + " "
            continue
        out.append((first, pending + line))
        pending = ""
    if pending:
        out.append((first, pending))
    return out


def parse_examples(text: str) -> list[Example]:
    """Every ``flywheel`` command in the bash blocks, comments and ``...`` placeholders dropped."""
    examples: list[Example] = []
    for start, lines in bash_blocks(text):
        for number, line in logical_lines(start, lines):
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError:  # unbalanced quotes: not a command this test can run
                continue
            commands: list[list[str]] = [[]]
            for token in tokens:
                if token in _SEPARATORS:
                    commands.append([])
                else:
                    commands[-1].append(token)
            for words in commands:
                env: list[tuple[str, str]] = []
                while words and _ASSIGNMENT.match(words[0]):
                    name, _, value = words.pop(0).partition("=")
                    env.append((name, value))
                if not words or words[0] != "flywheel":
                    continue
                argv = [w for w in words[1:] if w not in ("...", "…")]
                examples.append(Example(number, tuple(argv), tuple(env)))
    return examples


EXAMPLES = parse_examples(README.read_text())


def _parse(example: Example) -> object:
    from flywheel.cli import build_parser

    try:
        return build_parser().parse_args(list(example.argv))
    except SystemExit as exc:  # argparse printed why
        raise AssertionError(f"{example}: flywheel's parser refuses it (exit {exc.code})") from None


def test_the_parser_finds_the_readme_examples() -> None:
    text = "\n".join([
        "```bash", "flywheel run --env X \\", "    --steps 5   # a comment", "# flywheel nothing", "make test",
        "FOO=1 flywheel keys generate k/ ...", "```", "```", "flywheel not-bash", "```",
    ])
    assert [(e.line, e.argv, e.env) for e in parse_examples(text)] == [
        (2, ("run", "--env", "X", "--steps", "5"), ()), (6, ("keys", "generate", "k/"), (("FOO", "1"),))]
    commands = {e.command for e in EXAMPLES}
    assert "run" in commands and any("--resume" in e.argv for e in EXAMPLES), [str(e) for e in EXAMPLES]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"L{e.line}-{e.command}")
def test_every_example_parses(example: Example) -> None:
    """Every flag of every example exists and takes the value given."""
    assert example.command, f"{example}: no subcommand"
    _parse(example)


def _check_service(example: Example, workspace: Path) -> None:
    """Settings, env id and CURVE keys as the service checks them before it starts (it is not started)."""
    from flywheel.envs import env_spec
    from flywheel.registry import settings_class
    from flywheel.security import keys_from_settings
    from flywheel.settings import settings_from_args

    args = _parse(example)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clean_env(**dict(example.env)))
    if "--control-token-file" in example.argv:  # made by the README's line before it (openssl rand)
        (workspace / example.argv[example.argv.index("--control-token-file") + 1]).write_text(CONTROL_TOKEN)
    else:
        os.environ.setdefault("FLYWHEEL_GATEWAY_CONTROL_TOKEN", CONTROL_TOKEN)
    cwd = os.getcwd()
    try:
        os.chdir(workspace)
        settings = settings_from_args(settings_class(example.command), args, example.command)
        keys_from_settings(settings, example.command)
        if getattr(settings, "env_id", None):
            env_spec(settings.env_id)
        if example.command == "gateway":
            from flywheel.services.gateway.auth import ControlAuth, startup_problem

            assert startup_problem(settings, ControlAuth(settings)) is None, example
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def _flywheel(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flywheel", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _checkpoint_dir(argv: list[str], cwd: Path) -> Path:
    from flywheel.run import add_run_flags

    parser = argparse.ArgumentParser(add_help=False)
    add_run_flags(parser)
    return cwd / parser.parse_known_args(argv)[0].checkpoint_dir


def _run_example(example: Example, workspace: Path) -> str:
    """Run one ``flywheel run`` example until it trains, then Ctrl-C; check it checkpoints (and resumes)."""
    argv = list(example.argv[1:])
    ckpt = _checkpoint_dir(argv, workspace)
    learner_log = ckpt / "logs" / "learner-0.log"
    resume = "--resume" in argv
    if resume:
        assert (ckpt / "run.json").is_file(), f"{example}: no earlier README example made a run in {ckpt}"
        saved_env = json.loads((ckpt / "run.json").read_text())["env_id"]
        had_checkpoint = (ckpt / "learner" / "learner.safetensors").is_file()
    log_before = learner_log.stat().st_size if learner_log.exists() else 0
    bounded = ["run", *argv, "--time-limit", str(RUN_LIMIT_S), "--no-video", "--base-port", "0", "--http-port", "0",
               "--progress-interval", "1"]  # Unix sockets, and the HTTP port the kernel picks (printed at start)
    started = time.monotonic()
    out, err = workspace / "run.out", workspace / "run.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "flywheel", *bounded], cwd=workspace, stdout=stdout,
                                stderr=stderr, env=clean_env(**dict(example.env)), stdin=subprocess.DEVNULL)
    try:
        def training() -> bool:
            if proc.poll() is not None:
                return True  # exited early: the checks below say why
            endpoints = launcher_endpoints(out)
            status = get_json(f"{endpoints[0]}/status") if endpoints is not None else None
            services = (status or {}).get("services", {})
            learner_up = any(i.get("up") for i in services.get("learner", {}).get("instances", []))
            return learner_up and services.get("actor", {}).get("totals", {}).get("env_steps_total", 0) > 0
        wait_until(training, RUN_LIMIT_S, f"{example} to train", [out, err])
        time.sleep(RUN_SECONDS)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stdout_text, output = out.read_text(errors="replace"), out.read_text(errors="replace") + err.read_text()
    assert proc.returncode == 0, f"{example}: exit {proc.returncode}\n{output[-3000:]}"
    assert "env steps" in stdout_text and "stopped; checkpoints in" in stdout_text, f"{example}\n{output[-3000:]}"
    assert (ckpt / "learner" / "learner.safetensors").is_file(), f"{example}: no learner checkpoint in {ckpt}"
    assert (ckpt / "run.json").is_file() and (ckpt / "replay").is_dir(), f"{example}: nothing checkpointed in {ckpt}"
    if resume:
        assert f"training {saved_env} " in stdout_text, f"{example}: did not resume {saved_env}\n{output[-2000:]}"
        assert had_checkpoint, f"{example}: the run before left no learner checkpoint in {ckpt}"
        resumed = learner_log.read_text(errors="replace")[log_before:]
        assert "learner: resumed from" in resumed, f"{example}: the learner started fresh\n{resumed[-2000:]}"
    return f"{example}: {time.monotonic() - started:.0f} s"


def test_run_play_and_keys_examples_really_run(tmp_path: Path) -> None:
    """The ``flywheel run``, ``play`` and ``keys`` examples in README order, sharing one working folder."""
    done: list[str] = []
    for example in EXAMPLES:
        if example.command == "run":
            done.append(_run_example(example, tmp_path))
        elif example.command in ("keys", "play"):
            argv = [*example.argv, *(["--max-steps", str(PLAY_MAX_STEPS)] if example.command == "play" else [])]
            result = _flywheel(argv, tmp_path, clean_env(**dict(example.env)), 120)
            assert result.returncode == 0, f"{example}: exit {result.returncode}\n{result.stderr[-2000:]}"
            done.append(str(example))
    assert any(" run " in line for line in done), done
    print("\n".join(done))


def test_service_examples_validate(tmp_path: Path) -> None:
    """Each service example's flags make valid settings (after the README's own ``flywheel keys`` examples)."""
    for example in EXAMPLES:
        if example.command == "keys":
            result = _flywheel(list(example.argv), tmp_path, clean_env(**dict(example.env)), 60)
            assert result.returncode == 0, f"{example}: {result.stderr}"
    checked = [e for e in EXAMPLES if e.command in SERVICES]
    for example in checked:
        _check_service(example, tmp_path)
    assert {e.command for e in checked} >= {"replay", "learner", "actor", "gateway"}, [str(e) for e in checked]
