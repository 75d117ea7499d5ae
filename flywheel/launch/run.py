"""``flywheel run``: the whole system as local child processes on loopback, with live progress."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flywheel import presets
from flywheel.launch import remote
from flywheel.launch.runplan import Child, Plan, draw_seed, learner_threads, seed_plan
from flywheel.launch.runwatch import fetch_status, own_reports, progress_line, target_reached
from flywheel.launch.supervisor import Supervisor
from flywheel.launch.tracking_cli import track_env, track_line
from flywheel.presets import Preset
from flywheel.processes import launch
from flywheel.settings import SettingsError

STOP_ORDER = ("actor", "learner", "replay", "gateway")
STOP_TIMEOUT_S = {"actor": 15.0, "learner": 60.0, "replay": 180.0, "gateway": 10.0}
SOCKET_PARENT_MAX = 64  # bytes: PARENT/flywheel-run-PID-XXXXXXXX/transitions fits in sun_path (107 + NUL)
STOP_CHECK_INTERVAL_S = 1.0  # --steps, --target-return and --time-limit are checked this often


def _check_port(port: int, what: str, flag: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the services do; TIME_WAIT is no conflict
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            raise SettingsError(
                f"flywheel run: port {port} ({what}) is already in use: stop the process holding it or pass {flag}"
            ) from None


def default_actors(preset: Preset | None, cores: int | None = None) -> int:
    """One actor per core, less the preset's ``run.spare_cores`` (cores left to the learner; Atari: 1), at least 1."""
    cores = cores or os.cpu_count() or 1
    spare = _run_choice(preset, "spare_cores", 0)
    if isinstance(spare, bool) or not isinstance(spare, int) or spare < 0:
        raise SettingsError(f"preset {preset.name if preset else presets.NONE}: run.spare_cores must be a whole "
                            f"number >= 0, got {spare!r}")
    return max(1, cores - spare)


def learner_core_share(preset: Preset | None) -> float:
    """The preset's ``run.learner_core_share``: the share of the machine's cores the learner's torch threads take when
    the actors fill every core (0: none beyond the cores the actors leave)."""
    share = _run_choice(preset, "learner_core_share", 0.0)
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 1:
        raise SettingsError(f"preset {preset.name if preset else presets.NONE}: run.learner_core_share must be a "
                            f"number in [0, 1], got {share!r}")
    return float(share)


def _run_choice(preset: Preset | None, key: str, default: Any) -> Any:
    """One of ``flywheel run``'s own choices in the preset's ``run`` section (presets.RUN_KEYS)."""
    return default if preset is None else preset.sections.get("run", {}).get(key, default)


def preset_for(args: argparse.Namespace, obs_dtype: str) -> Preset | None:
    """The run's preset: --preset (a name or YAML file; none: no preset), else the env id's (flywheel/presets)."""
    chosen = getattr(args, "preset", None) or "auto"
    if chosen == presets.NONE:
        return None
    try:
        return presets.load(presets.name_for_env(args.env, obs_dtype) if chosen == "auto" else chosen)
    except presets.PresetError as exc:
        raise SettingsError(f"flywheel run: --preset: {exc}") from None


def _private_socket_dir() -> Path:
    """A new folder for the run's Unix sockets: mode 0700 under a name no one can guess (``mkdtemp``), so another
    local user cannot make it first and take the sockets; under /tmp when TMPDIR is too long for socket paths."""
    parent = tempfile.gettempdir()
    if len(parent.encode()) > SOCKET_PARENT_MAX:
        parent = "/tmp"
    return Path(tempfile.mkdtemp(prefix=f"flywheel-run-{os.getpid()}-", dir=parent))


def make_plan(args: argparse.Namespace) -> Plan:
    """The plan for ``args``; with Unix sockets, their private folder is made now (``Plan.remove_socket_dir``)."""
    # Same-host fast path: Unix sockets hold far less data in flight than TCP loopback buffers (which let
    # actors run tens of thousands of small transitions ahead of the replay's rate limiter), and cost less.
    ipc = getattr(args, "local_transport", "tcp") == "ipc" or not args.base_port
    socket_dir = _private_socket_dir() if ipc else None
    try:
        return _make_plan(args, socket_dir)
    except BaseException:
        if socket_dir is not None:
            shutil.rmtree(socket_dir, ignore_errors=True)
        raise


def _make_plan(args: argparse.Namespace, socket_dir: Path | None) -> Plan:
    from flywheel.envs import UnknownEnvironmentError, env_spec

    if args.actors is not None and args.actors < 1:
        raise SettingsError(f"flywheel run: --actors must be at least 1, got {args.actors}")
    if args.envs_per_actor is not None and args.envs_per_actor < 1:
        raise SettingsError(f"flywheel run: --envs-per-actor must be at least 1, got {args.envs_per_actor}")
    from flywheel.extras import MissingExtra

    try:
        spec = env_spec(args.env)
    except (UnknownEnvironmentError, MissingExtra) as exc:
        raise SettingsError(f"flywheel run: {exc}") from None
    preset = preset_for(args, spec.obs_dtype)
    if args.actors is None:
        args.actors = default_actors(preset)
    base = args.base_port
    names = ("transitions", "sample", "weights", "telemetry", "control", "lease")
    ports = {what: base + i for i, what in enumerate(names)} if base else {}
    ports["http"] = args.http_port
    for what, port in ports.items():
        if not (0 < port < 65536 or (what == "http" and port == 0)):
            raise SettingsError(f"flywheel run: port {port} for {what} is outside 1..65535 (or 0); pass "
                                f"{'--http-port' if what == 'http' else '--base-port'}")
    for what, port in ports.items():
        if port:
            _check_port(port, what, "--http-port" if what == "http" else "--base-port")
    if base:
        endpoint = {what: f"tcp://127.0.0.1:{ports[what]}" for what in names}
    else:  # no TCP port at all: nothing to collide with, and no port to guess in advance
        endpoint = {what: f"ipc://{socket_dir}/{what}" for what in names}
    local = endpoint.__getitem__
    common = {"TELEMETRY_ENDPOINT": local("telemetry"), "CONTROL_ENDPOINT": local("control")}
    transitions_bind, sample_bind = local("transitions"), local("sample")
    transitions_connect, sample_connect = transitions_bind, sample_bind
    if getattr(args, "local_transport", "tcp") == "ipc" and base:
        transitions_connect, sample_connect = f"ipc://{socket_dir}/transitions", f"ipc://{socket_dir}/sample"
        transitions_bind = f"{transitions_connect},{transitions_bind}"
        sample_bind = f"{sample_connect},{sample_bind}"
    ckpt = args.checkpoint_dir.resolve()
    env: dict[str, dict[str, str]] = {
        "gateway": {"TELEMETRY_ENDPOINT": local("telemetry"), "CONTROL_ENDPOINT": local("control"),
                    "LEASE_ENDPOINT": local("lease"), "HTTP_HOST": "127.0.0.1",
                    "HTTP_PORT": str(ports["http"]), "CURVES_DIR": str(ckpt),
                    "CURVES_INTERVAL_S": str(args.progress_interval)},
        "replay": {**common, "TRANSITIONS_BIND": transitions_bind, "SAMPLE_BIND": sample_bind,
                   "CHECKPOINT_DIR": str(ckpt / "replay"), "RESTORE": str(args.resume).lower(), "ENV_ID": args.env},
        "learner": {**common, "ENV_ID": args.env, "SAMPLE_ENDPOINT": sample_connect,
                    "WEIGHTS_BIND": local("weights"), "CHECKPOINT_DIR": str(ckpt / "learner"),
                    "RESUME": str(args.resume and (ckpt / "learner" / "learner.safetensors").exists()).lower()},
        "actor": {**common, "ENV_ID": args.env, "TRANSITIONS_ENDPOINT": transitions_connect,
                  "WEIGHTS_ENDPOINT": local("weights"), "LEASE_ENDPOINT": local("lease")},
    }
    for values in env.values():  # each child reads the preset itself, as a service started alone does
        values["PRESET"] = presets.NONE if preset is None else preset.name  # a shipped name or the file's path
    if getattr(args, "curve_keys_dir", None) is not None:
        for values in env.values():
            values["CURVE_KEYS_DIR"] = str(args.curve_keys_dir.resolve())
    if getattr(args, "log_format", None) is not None:
        for values in env.values():
            values["LOG_FORMAT"] = args.log_format
    if args.envs_per_actor is not None:
        env["actor"]["NUM_ENVS"] = str(args.envs_per_actor)
    env["gateway"].update(track_env(args))  # --track: W&B settings of the gateway, which logs the curves' points
    wired = {"TELEMETRY_ENDPOINT", "CONTROL_ENDPOINT", "INSTANCE"}
    chosen: set[tuple[str, str]] = set()  # (service, KEY) the user set: variables or --set
    for service, values in env.items():  # the user's own FLYWHEEL_* variables win over presets
        prefix = f"FLYWHEEL_{service.upper()}_"
        for name, value in os.environ.items():
            if name.startswith(prefix) and name.removeprefix(prefix) not in wired:
                values[name.removeprefix(prefix)] = value
                chosen.add((service, name.removeprefix(prefix)))
    for item in args.set:  # and --set wins over both
        service, _, rest = item.partition(".")
        key, eq, value = rest.partition("=")
        if service not in env or not key or not eq:
            raise SettingsError(f"flywheel run: --set {item!r} must look like SERVICE.FIELD=VALUE "
                                f"with SERVICE one of {', '.join(env)}")
        env[service][key.upper()] = value
        chosen.add((service, key.upper()))
    join, host = None, "127.0.0.1"
    if (listen := remote.check_listen(args)) is not None:  # --listen: open the run to actors on other hosts
        join = remote.open_to_remote(env, *listen, ckpt)
        host = "127.0.0.1" if listen[0] == "0.0.0.0" else listen[0]
    settings = _validate(env, chosen)
    if settings["learner"].torch_threads == 0:  # 0 (a preset's too): the cores the actors and the replay leave
        threads = learner_threads(args.actors, share=learner_core_share(preset))
        env["learner"]["TORCH_THREADS"] = str(threads)
        settings["learner"] = settings["learner"].model_copy(update={"torch_threads": threads})
    greedy_env = ("actor", "EVAL_ENVS") not in chosen  # --set actor.eval_envs=0 turns the greedy env off
    # actor-0 also films a greedy episode now and then for the live page (--set actor.clip_interval_s=0: never)
    # (every 5 min for pixels: filming and encoding a pixel game costs ~2 ms of CPU per frame, 4 frames a step)
    clip = {"CLIP_INTERVAL_S": env["actor"].pop("CLIP_INTERVAL_S", presets.text(
        _run_choice(preset, "clip_interval_s", 300)))}
    # the actors' start-state pools: CHECKPOINT_DIR/actors, written at the learner's checkpoint cadence (not in the
    # join document: a path of this host's)
    pools = {"CHECKPOINT_DIR": str(ckpt / "actors"), "RESUME": str(args.resume).lower(),
             "CHECKPOINT_INTERVAL_S": env["actor"].pop("CHECKPOINT_INTERVAL_S", presets.text(
                 settings["learner"].checkpoint_interval_s))}
    extra = [{**pools, **({"EVAL_ENVS": "1", **clip} if i == 0 and greedy_env else {})} for i in range(args.actors)]
    return Plan(env, ports, f"http://{host}:{ports['http']}", (args.log_dir or ckpt / "logs").resolve(), extra,
                socket_dir, preset, join, settings)


def _join_env(plan: Plan) -> dict[str, dict[str, str]]:
    """The values the join document is written from: a preset file of the user's, which another host does not have,
    goes as its actor values beneath the run's own (a shipped preset goes by name, and the actor reads it)."""
    if plan.preset is None or plan.preset.name in presets.names():
        return plan.env
    actor = {**plan.preset.as_variables("actor"), **plan.env["actor"], "PRESET": presets.NONE}
    return {**plan.env, "actor": actor}


def _validate(env: dict[str, dict[str, str]], chosen: set[tuple[str, str]]) -> dict[str, Any]:
    """Build each service's settings from the planned values (the preset read as the child will read it), so a bad
    value fails before anything starts. The learner's network record goes to the actors (NetworkSpec: their weights
    are refused otherwise), field by field unless the user set that field for the actors."""
    from flywheel.launch.registry import settings_class
    from flywheel.security import CurveKeyError, keys_from_settings
    from flywheel.settings import build_settings

    built: dict[str, Any] = {}
    for service in sorted(env, key=lambda s: s == "actor"):  # the learner's settings before the actors'
        values = env[service]
        cls = settings_class(service)
        known = set(cls.model_fields)
        for key in values:
            if key.lower() not in known:
                raise SettingsError(f"flywheel run: {service} has no setting {key.lower()!r} "
                                    f"(known: {', '.join(sorted(known))})")
        if service == "actor" and "learner" in built:
            for name, value in built["learner"].network().model_dump().items():
                if ("actor", name.upper()) not in chosen:
                    values[name.upper()] = presets.text(value)
        settings = build_settings(cls, {k.lower(): v for k, v in values.items()}, f"run ({service})")
        try:
            keys_from_settings(settings, service)
        except CurveKeyError as exc:
            raise SettingsError(f"flywheel run ({service}): {exc}") from None
        built[service] = settings
    return built


def _start(service: str, name: str, values: dict[str, str], log_dir: Path) -> Child:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(f"FLYWHEEL_{service.upper()}_")}
    child_env.update({f"FLYWHEEL_{service.upper()}_{k}": v for k, v in values.items()})
    child_env[f"FLYWHEEL_{service.upper()}_INSTANCE"] = name
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    log = log_dir / f"{name}.log"
    fds = (int(values["HTTP_FD"]),) if "HTTP_FD" in values else ()  # the gateway's inherited listening socket
    return Child(service, name, launch([service], child_env, log, new_session=True, pass_fds=fds), log)


def _http_socket(plan: Plan) -> socket.socket | None:
    """With --http-port 0: the launcher listens on a port the kernel picks and every gateway it starts (restarts
    too) serves on that socket, so the port never changes and no port is guessed in advance."""
    if plan.ports["http"] != 0:
        return None
    from flywheel.services.gateway.server import listen_socket

    sock = listen_socket(plan.env["gateway"]["HTTP_HOST"], 0)
    plan.env["gateway"]["HTTP_FD"] = str(sock.fileno())
    plan.gateway_url = f"{plan.gateway_url.rsplit(':', 1)[0]}:{sock.getsockname()[1]}"
    return sock


def stop_children(children: list[Child]) -> list[str]:
    """SIGTERM in order (actors, learner, replay, gateway), SIGKILL what does not stop in time."""
    problems: list[str] = []
    for service in STOP_ORDER:
        group = [c for c in children if c.service == service and c.proc.poll() is None]
        for child in group:
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S[service]
        for child in group:
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
                problems.append(f"{child.name} did not stop in {STOP_TIMEOUT_S[service]:.0f} s and was killed")
    return problems


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def run(args: argparse.Namespace) -> int:
    from flywheel.launch.runfolder import take

    with take(args):  # --if-exists/--resume: the folder this run writes to, locked for the run's life
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from flywheel import curves
    from flywheel.launch import runconfig

    saved = runconfig.apply_saved(args)  # --resume: the env and settings of CHECKPOINT_DIR/run.json
    plan = make_plan(args)
    if getattr(args, "seed", None) is None:  # none given or saved: one is drawn, and run.json records it
        args.seed = draw_seed()
    seed_plan(plan, args.seed, runconfig.start_index(saved))
    runconfig.write_run_config(args, plan, saved)
    if plan.join is not None:  # what `flywheel actor --join` on another host reads from the gateway's /join
        preset_id = None if plan.preset is None else {"name": plan.preset.name, "sha256": plan.preset.sha256}
        remote.write_join_file(plan.join, _join_env(plan), args.env, preset_id, args.checkpoint_dir.resolve())
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    if not args.resume:  # the gateway writes tb/ and progress.csv; a new run's curves start over
        curves.reset(args.checkpoint_dir.resolve())
    else:  # and a resumed run's add every env step its new services make to the last row
        curves.Curves.mark_counters_restart(args.checkpoint_dir.resolve())
    http = _http_socket(plan)
    stop_reason: list[str] = []

    def on_signal(signum: int, _frame: object) -> None:
        stop_reason.append(signal.Signals(signum).name)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    children: list[Child] = []
    supervisor = Supervisor(children, plan, _start, args)  # restarts children that die (flywheel/launch/supervisor.py)
    code = 0
    started = time.monotonic()
    try:
        children.append(_start("gateway", "gateway-0", plan.env["gateway"], plan.log_dir))
        children.append(_start("replay", "replay-0", plan.env["replay"], plan.log_dir))
        children.append(_start("learner", "learner-0", plan.env["learner"], plan.log_dir))
        for i, extra in enumerate(plan.actor_extra):
            children.append(_start("actor", f"actor-{i}", {**plan.env["actor"], **extra}, plan.log_dir))
        preset = f" (preset {plan.preset.name}, seed {args.seed})" if plan.preset is not None else \
            f" (seed {args.seed})"
        print(f"flywheel: training {args.env} with {args.actors} actors{preset}; gateway {plan.gateway_url} "
              f"(/status, /metrics); weights {plan.env['learner']['WEIGHTS_BIND']}; logs in {plan.log_dir}; "
              "Ctrl-C stops and checkpoints", flush=True)
        if (tracking := track_line(plan.env["gateway"])) is not None:  # where W&B tracking goes
            print(tracking, flush=True)
        next_progress = time.monotonic() + min(args.progress_interval, 3.0)
        watching = bool(args.steps or args.target_return is not None or args.time_limit)
        next_check = min(next_progress, time.monotonic() + STOP_CHECK_INTERVAL_S) if watching else next_progress
        while not stop_reason:
            time.sleep(0.2)
            c = supervisor.poll(stopping=lambda: bool(stop_reason))
            if c is not None:
                print(f"error: {c.name} exited with code {c.proc.returncode} ({supervisor.reason}): {_tail(c.log)} "
                      f"(log: {c.log})", file=sys.stderr, flush=True)
                code = 1
                break
            now = time.monotonic()
            if now < next_check:
                continue
            printing = now >= next_progress  # the progress line every progress_interval, the stop checks each second
            if printing:
                next_progress = now + args.progress_interval
            next_check = now + STOP_CHECK_INTERVAL_S if watching else next_progress
            status = fetch_status(plan.gateway_url)
            if status is None:
                continue
            summary = curves.summarize(status)
            if args.steps and (summary["env_steps"] or 0) >= args.steps:
                stop_reason.append(f"reached {args.steps} env steps")
            if (reached := target_reached(curves.summarize(own_reports(status)), args.target_return)) is not None:
                stop_reason.append(reached)
            if args.time_limit and now - started >= args.time_limit:
                stop_reason.append(f"time limit of {args.time_limit:.0f} s")
            if printing or stop_reason:  # the figures a stop was decided on are printed with it
                print(progress_line(now - started, summary) + supervisor.progress(), flush=True)
    finally:
        if stop_reason:
            print(f"flywheel: stopping ({stop_reason[0]}) after {time.monotonic() - started:.0f} s; "
                  "checkpointing...", flush=True)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        problems = stop_children(children)
        supervisor.close()
        for problem in problems:
            print(f"warning: {problem}", file=sys.stderr)
        for c in children:  # a service ends by SIGTERM only while it starts, before its handler is set
            if c.service == "learner" and c.proc.returncode == -signal.SIGTERM:
                print(f"warning: {c.name} was stopped while starting, before it could checkpoint: {_tail(c.log)}",
                      file=sys.stderr)
        failed = [c for c in children if c.proc.returncode not in (0, -signal.SIGTERM, None)]
        if failed and code == 0 and not problems:
            code = 1
            for c in failed:
                print(f"error: {c.name} exited with code {c.proc.returncode}: {_tail(c.log)}", file=sys.stderr)
    if http is not None:
        http.close()
    plan.remove_socket_dir()
    if code == 0 and not getattr(args, "no_video", False):
        from flywheel.tools.film import film_run

        film_run(args.checkpoint_dir.resolve(), args.env)
    print(f"flywheel: stopped; checkpoints in {args.checkpoint_dir.resolve()} (flywheel play {args.checkpoint_dir}; "
          f"flywheel run --resume --checkpoint-dir {args.checkpoint_dir})", flush=True)
    return code
