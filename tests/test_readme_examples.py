"""Every ``flywheel ...`` command in the bash blocks of README.md and docs/USAGE.md is run, bounded and cheap, so
neither can rot.

``flywheel run`` examples run for real, in document order (README.md, then docs/USAGE.md) in one scratch folder (so
``--resume`` continues the run an earlier example made; an example identical to one already run is not run twice),
with free ports, ``--no-video`` and a safety ``--time-limit`` appended; each is stopped with Ctrl-C (SIGINT) once
its learner and actors report and the actors have stepped. ``flywheel play`` runs there too, its episodes cut at
PLAY_MAX_STEPS, and ``flywheel keys`` runs as written. The block that starts each service alone (``flywheel
replay|learner|actor|gateway`` with CURVE keys and a token file) runs as four real processes that must train
together (``test_standalone_services_really_run`` says what it changes: ports and host names). Every service
example, those with ``...`` placeholders included, also has its settings, env id and CURVE key folder validated as
the service would at start. Anything else is parsed by ``flywheel``'s own argument parser (``flywheel eval`` and
``flywheel export`` among them).
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
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "pipeline"))
from pipeline_helpers import clean_env, get_json, wait_until

from flywheel.processes import launch
from flywheel.testing.ports import free_port_block
from flywheel.testing.run import launcher_endpoints, tail

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = (README, ROOT / "docs" / "USAGE.md")  # the documents whose examples run, in this order
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
    """One ``flywheel`` command of a document: where it is and its arguments after ``flywheel``."""

    line: int
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    doc: str = "README.md"

    @property
    def command(self) -> str:
        return self.argv[0] if self.argv else ""

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: flywheel {shlex.join(self.argv)}"


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


def parse_examples(text: str, doc: str = "README.md") -> list[Example]:
    """Every ``flywheel`` command in the bash blocks, comments and ``...`` placeholders dropped."""
    return [example for start, lines in bash_blocks(text) for example in block_examples(start, lines, doc)]


def block_examples(start: int, lines: list[str], doc: str = "README.md") -> list[Example]:
    """Every ``flywheel`` command of one bash block (``start``: the number of its first line)."""
    examples: list[Example] = []
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
            examples.append(Example(number, tuple(argv), tuple(env), doc))
    return examples


EXAMPLES = [e for path in DOCS for e in parse_examples(path.read_text(), str(path.relative_to(ROOT)))]


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


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{Path(e.doc).stem}-L{e.line}-{e.command}")
def test_every_example_parses(example: Example) -> None:
    """Every flag of every example exists and takes the value given."""
    assert example.command, f"{example}: no subcommand"
    _parse(example)


def _check_service(example: Example, workspace: Path) -> None:
    """Settings, env id and CURVE keys as the service checks them before it starts (it is not started)."""
    from flywheel.envs import env_spec
    from flywheel.launch.registry import settings_class
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

            assert startup_problem(settings, ControlAuth.of(settings)) is None, example
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(saved)


def _flywheel(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flywheel", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _checkpoint_dir(argv: list[str], cwd: Path) -> Path:
    from flywheel.launch.runplan import add_run_flags

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
        assert (ckpt / "run.json").is_file(), f"{example}: no earlier example made a run in {ckpt}"
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
    stdout_text = out.read_text(errors="replace")
    learner_tail = learner_log.read_text(errors="replace")[log_before:][-2500:] if learner_log.exists() else "(none)"
    output = f"{stdout_text[-2500:]}\n--- stderr ---\n{err.read_text()[-2500:]}\n--- learner log ---\n{learner_tail}"
    assert proc.returncode == 0, f"{example}: exit {proc.returncode}\n{output}"
    assert "env steps" in stdout_text and "stopped; checkpoints in" in stdout_text, f"{example}\n{output}"
    assert (ckpt / "learner" / "learner.safetensors").is_file(), f"{example}: no learner checkpoint in {ckpt}\n{output}"
    assert (ckpt / "run.json").is_file() and (ckpt / "replay").is_dir(), f"{example}: nothing checkpointed in {ckpt}"
    if resume:
        assert f"training {saved_env} " in stdout_text, f"{example}: did not resume {saved_env}\n{output[-2000:]}"
        assert had_checkpoint, f"{example}: the run before left no learner checkpoint in {ckpt}"
        resumed = learner_log.read_text(errors="replace")[log_before:]
        assert "learner: resumed from" in resumed, f"{example}: the learner started fresh\n{output}"
    return f"{example}: {time.monotonic() - started:.0f} s"


@pytest.mark.timeout(600)  # five runs of two documents, each bounded by RUN_TIMEOUT_S, on a loaded 2-core machine
@pytest.mark.slow  # five training runs
@pytest.mark.system
def test_run_play_and_keys_examples_really_run(tmp_path: Path) -> None:
    """The ``flywheel run``, ``play`` and ``keys`` examples in document order, sharing one working folder."""
    done: list[str] = []
    seen: set[tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = set()
    for example in EXAMPLES:
        if (example.argv, example.env) in seen:
            continue  # the same command in both documents: it ran already, in the same folder
        seen.add((example.argv, example.env))
        if example.command == "run":
            done.append(_run_example(example, tmp_path))
        elif example.command in ("keys", "play"):
            argv = [*example.argv, *(["--max-steps", str(PLAY_MAX_STEPS)] if example.command == "play" else [])]
            result = _flywheel(argv, tmp_path, clean_env(**dict(example.env)), 120)
            assert result.returncode == 0, f"{example}: exit {result.returncode}\n{result.stderr[-2000:]}"
            done.append(str(example))
    assert any(" run " in line for line in done), done
    assert {Path(e.doc).name for e in EXAMPLES if e.command == "run"} == {path.name for path in DOCS}, done
    print("\n".join(done))


@pytest.mark.system
def test_service_examples_validate(tmp_path: Path) -> None:
    """Each service example's flags make valid settings (after the documents' own ``flywheel keys`` examples)."""
    for example in EXAMPLES:
        if example.command == "keys":
            result = _flywheel(list(example.argv), tmp_path, clean_env(**dict(example.env)), 60)
            assert result.returncode == 0, f"{example}: {result.stderr}"
    checked = [e for e in EXAMPLES if e.command in SERVICES]
    for example in checked:
        _check_service(example, tmp_path)
    assert {e.command for e in checked} >= {"replay", "learner", "actor", "gateway"}, [str(e) for e in checked]


# ---- the standalone services, for real ---------------------------------------------------------------------------
PIPELINE_TIMEOUT_S = 100  # keys made to the actor acting with a learner's second weight version (~25 s here)
CONTROL_TIMEOUT_S = 30  # a command reaching every service (the learner reads control between updates of ~3 s)
STOP_TIMEOUT_S = 30  # each service, after SIGINT, before SIGKILL
_TCP = re.compile(r"tcp://([^:/\s]+):(\d+)")
_WILDCARDS = ("*", "0.0.0.0")


def service_block(text: str) -> tuple[int, list[str]]:
    """The bash block that starts all four services with no ``...`` placeholder: (first line number, lines)."""
    for start, lines in bash_blocks(text):
        commands = {e.command for e in block_examples(start, lines)}
        if commands >= set(SERVICES) and not any("..." in line or "…" in line for line in lines):
            return start, lines
    raise AssertionError("no bash block that starts replay, learner, actor and gateway")


def service_doc() -> Path:
    """The first of DOCS that has the block that starts each service alone (docs/USAGE.md, "Each service alone")."""
    for path in DOCS:
        try:
            service_block(path.read_text())
        except AssertionError:
            continue
        return path
    raise AssertionError(f"none of {', '.join(str(p.relative_to(ROOT)) for p in DOCS)} has a bash block that starts "
                         "replay, learner, actor and gateway")


def _http_port(example: Example) -> int:
    """The gateway's HTTP port: its ``--http-port``, else the settings default (8080)."""
    from flywheel.launch.registry import settings_class

    argv = example.argv
    return int(argv[argv.index("--http-port") + 1]) if "--http-port" in argv else int(
        settings_class("gateway").model_fields["http_port"].default)


def _localised(example: Example, ports: dict[int, int]) -> list[str]:
    """The example's argv with every port it names replaced by its free port and every host (``replay``,
    ``learner``, ``gateway``: other machines) by 127.0.0.1; wildcard binds stay; the gateway gets ``--http-port``."""
    def endpoint(match: re.Match[str]) -> str:
        host = match[1] if match[1] in _WILDCARDS else "127.0.0.1"
        return f"tcp://{host}:{ports[int(match[2])]}"

    argv = [_TCP.sub(endpoint, word) for word in example.argv]
    if example.command == "gateway":
        if "--http-port" in argv:
            argv[argv.index("--http-port") + 1] = str(ports[_http_port(example)])
        else:
            argv += ["--http-port", str(ports[_http_port(example)])]
    return argv


def _post(url: str, token: str | None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    request = urllib.request.Request(url, data=b"{}", method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _instances(status: dict, service: str) -> list[dict]:
    return status.get("services", {}).get(service, {}).get("instances", [])


def _stop(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGINT (Ctrl-C) to each service, actors first as ``flywheel run`` stops them; SIGKILL after a timeout."""
    for name in ("actor", "learner", "replay", "gateway"):
        proc = procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(240)
@pytest.mark.system
def test_standalone_services_really_run(tmp_path: Path) -> None:
    """The block that starts each service alone (docs/USAGE.md) runs as written, as four real processes.

    Its lines run in order in one scratch folder: those before the services through bash as written (``flywheel
    keys generate``, ``openssl rand ... > token.txt``), then replay, learner, actor and gateway as processes of
    their own with the document's flags: CURVE keys, ``tcp://*`` binds, Mario, the 1M replay, batch 512, the token
    file. What a test must change, and only that: every port the block names (5555-5560) and the
    gateway's HTTP port (8080, its default) become free ports, rewritten the same way in all four commands; the
    hosts that stand for other machines (``replay``, ``learner``, ``gateway``) become 127.0.0.1; the run is bounded
    by this test, which stops every service with SIGINT (SIGKILL after STOP_TIMEOUT_S) however it ends.

    Checked on the gateway's /status: the replay receives transitions and is sampled, the learner updates, the
    actor acts with weight version >= 2 (taken over CURVE after an update) and replay, learner and actor report
    CURVE on; control answers 401 without the token and with a wrong one, and with the token from token.txt a
    pause then a resume reach every service. Every service exits 0 after SIGINT.
    """
    started = time.monotonic()
    doc = service_doc()
    start, lines = service_block(doc.read_text())
    examples = {e.command: e for e in block_examples(start, lines) if e.command in SERVICES}
    assert len(examples) == len(SERVICES), [str(e) for e in block_examples(start, lines)]
    readme_ports = sorted({int(m[2]) for e in examples.values() for w in e.argv for m in _TCP.finditer(w)}
                          | {_http_port(examples["gateway"])})
    base = free_port_block(len(readme_ports), "0.0.0.0")  # the binds are tcp://*: free on every interface
    ports = {port: base + i for i, port in enumerate(readme_ports)}

    shim = tmp_path / "bin" / "flywheel"  # ``flywheel`` on PATH: this interpreter's, as every other example runs
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m flywheel "$@"\n')
    shim.chmod(0o755)
    shell_env = clean_env(PATH=f"{shim.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    service_lines = {e.line for e in examples.values()}
    for number, line in logical_lines(start, lines):  # what comes before the services, through bash as written
        if number in service_lines or not shlex.split(line, comments=True):
            continue
        result = subprocess.run(["bash", "-c", line], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                                env=shell_env, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, f"{doc.name}:{number}: {line}\nexit {result.returncode}\n{result.stderr}"
    assert (tmp_path / "keys" / "server.key_secret").is_file(), sorted(p.name for p in tmp_path.iterdir())
    token = (tmp_path / "token.txt").read_text().strip()
    assert len(token) >= 16, f"token.txt holds {token!r}"

    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = {name: tmp_path / f"{name}.log" for name in examples}
    url = f"http://127.0.0.1:{ports[_http_port(examples['gateway'])]}"
    try:
        for name, example in examples.items():  # document order
            procs[name] = launch(_localised(example, ports), clean_env(**dict(example.env)), logs[name],
                                 cwd=tmp_path)

        def alive() -> None:
            dead = {name: p.returncode for name, p in procs.items() if p.poll() is not None}
            assert not dead, f"exited early: {dead}\n" + _tails(logs)

        def working() -> dict | None:
            alive()
            status = get_json(f"{url}/status")
            if status is None:
                return None
            totals = {s: status["services"].get(s, {}).get("totals", {}) for s in ("replay", "learner")}
            actors = _instances(status, "actor")
            ok = (totals["replay"].get("transitions_received_total", 0) > 0
                  and totals["replay"].get("samples_total", 0) > 0
                  and totals["learner"].get("updates_total", 0) > 0
                  and len(actors) == 1 and actors[0]["gauges"].get("weight_version", 0) >= 2)
            return status if ok else None

        status = wait_until(working, PIPELINE_TIMEOUT_S, "replay, learner and actor to work (weights v2)",
                            list(logs.values()))
        for service in ("replay", "learner", "actor"):
            curve = {i["instance"]: i.get("info", {}).get("curve") for i in _instances(status, service)}
            assert len(curve) == 1 and set(curve.values()) == {"on"}, f"{service}: telemetry info curve {curve}"
        endpoints = json.dumps(status["gateway"]["endpoints"])  # the document's tcp://* binds, on every interface
        binds = {int(m[2]) for w in examples["gateway"].argv for m in _TCP.finditer(w) if m[1] in _WILDCARDS}
        assert binds and all(f"0.0.0.0:{ports[p]}" in endpoints for p in binds), endpoints
        assert "CURVE on" in logs["gateway"].read_text(), "the gateway binds with CURVE\n" + _tails(logs)
        print(f"pipeline working after {time.monotonic() - started:.0f} s: actor weights "
              f"v{_instances(status, 'actor')[0]['gauges']['weight_version']:.0f}, learner updates "
              f"{status['services']['learner']['totals']['updates_total']:.0f}")

        assert _post(f"{url}/control/pause", None) == 401
        assert _post(f"{url}/control/pause", "not-the-token-" + token[:8]) == 401
        for command, paused in (("pause", 1.0), ("resume", 0.0)):
            assert _post(f"{url}/control/{command}", token) == 202, command

            def reached(paused: float = paused) -> bool:
                alive()
                status = get_json(f"{url}/status") or {}
                return all(any(i["gauges"].get("paused") == paused for i in _instances(status, s))
                           for s in ("replay", "learner", "actor"))

            wait_until(reached, CONTROL_TIMEOUT_S, f"{command} to reach replay, learner and actor", list(logs.values()))
        recent = (get_json(f"{url}/control") or {}).get("recent", [])
        assert [c["command"] for c in recent][-2:] == ["pause", "resume"], recent
    except BaseException:
        print(_tails(logs))
        raise
    finally:
        _stop(procs)
    codes = {name: p.returncode for name, p in procs.items()}
    assert all(code == 0 for code in codes.values()), f"exit codes after SIGINT {codes}\n" + _tails(logs)
    print(f"standalone services: {time.monotonic() - started:.0f} s")


def _tails(logs: dict[str, Path]) -> str:
    return "\n".join(f"--- {path.name}\n{tail(path, 25)}" for path in logs.values() if path.exists())
