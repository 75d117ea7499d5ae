"""run.json: what ``flywheel run`` started (env, every service's settings, versions), read back by --resume."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flywheel.launch.runfolder import FORMAT, FORMAT_VERSION, RUN_CONFIG, RunConfigError, load_run_config
from flywheel.settings import SettingsError

if TYPE_CHECKING:
    from flywheel.launch.runplan import Plan

RESTORED_FLAGS = ("env", "actors", "envs_per_actor", "local_transport", "curve_keys_dir", "track", "wandb_project",
                  "wandb_entity", "wandb_group", "wandb_tags", "preset", "seed")
_WIRED = {"TELEMETRY_ENDPOINT", "CONTROL_ENDPOINT", "INSTANCE"}  # make_plan's, never the user's


def given_flags(argv: list[str]) -> set[str]:
    """The ``flywheel run`` flags (argparse dests) named on the command line ``argv`` (from the subcommand on)."""
    from flywheel.launch.runplan import add_run_flags

    parser = argparse.ArgumentParser(add_help=False)
    add_run_flags(parser)
    for action in parser._actions:
        action.default = argparse.SUPPRESS
    rest = argv[argv.index("run") + 1:] if "run" in argv else argv
    return set(vars(parser.parse_known_args(rest)[0]))


def _given(args: argparse.Namespace) -> set[str]:
    given = getattr(args, "given_flags", None)
    if given is not None:
        return set(given)
    defaults = argparse.ArgumentParser(add_help=False)  # called without the command line: non-defaults count
    from flywheel.launch.runplan import add_run_flags

    add_run_flags(defaults)
    return {d for d in RESTORED_FLAGS if getattr(args, d, None) != defaults.get_default(d)}


def _same_env(saved: str, wanted: str) -> bool:
    """The same base id with the same observations and actions (options such as reward shaping may change)."""
    from flywheel.envs import env_spec, split_env_id

    if saved == wanted:
        return True
    if split_env_id(saved)[0] != split_env_id(wanted)[0]:
        return False
    a, b = env_spec(saved), env_spec(wanted)
    return (a.obs_shape, a.obs_dtype, a.n_actions) == (b.obs_shape, b.obs_dtype, b.n_actions)


def apply_saved(args: argparse.Namespace) -> dict[str, Any] | None:
    """On --resume, fill the flags not given again from CHECKPOINT_DIR/run.json; refuse another env.

    The saved overrides (SERVICE.FIELD=VALUE) go before this invocation's --set items, which win.
    """
    if not args.resume:
        return None
    try:
        saved = load_run_config(args.checkpoint_dir)
    except RunConfigError as exc:
        raise SettingsError(f"flywheel run --resume: {exc}") from None
    if saved is None:
        return None
    given = _given(args)
    path = Path(args.checkpoint_dir) / RUN_CONFIG
    if "env" in given and not _same_env(saved["env_id"], args.env):
        raise SettingsError(f"flywheel run --resume: --env {args.env} conflicts with {saved['env_id']} saved in "
                            f"{path}; a resumed run keeps its env (use another --checkpoint-dir for a new run)")
    for dest in RESTORED_FLAGS:
        if dest not in given and dest in saved.get("flags", {}):
            value = saved["flags"][dest]
            setattr(args, dest, Path(value) if dest == "curve_keys_dir" and value is not None else value)
    if "env" not in given:
        args.env = saved["env_id"]
    args.set = _known_overrides([str(item) for item in saved.get("overrides", [])], path) + list(args.set)
    return saved


def _known_overrides(items: list[str], path: Path) -> list[str]:
    """The saved SERVICE.FIELD=VALUE overrides of settings this version still has; one of a setting since removed
    (e.g. learner.torso) is left out with one line saying so, and the run resumes without it."""
    from flywheel.launch.registry import settings_class

    kept = []
    for item in items:
        service, _, rest = item.partition(".")
        field = rest.partition("=")[0].lower()
        try:
            known = field in settings_class(service).model_fields
        except KeyError:  # not a service: make_plan refuses it with its own line
            known = True
        if known:
            kept.append(item)
        else:
            print(f"flywheel run --resume: ignoring {item} saved in {path}: {service} has no setting {field!r} in "
                  "this version (it was removed)", file=sys.stderr, flush=True)
    return kept


def start_index(saved: dict[str, Any] | None) -> int:
    """Which start of its run this invocation is: 0 for a new run, 1 for the first --resume, ... (run.json's
    ``resumes``; the children's seeds are derived from it, so a resumed run does not replay its first draws)."""
    return int(saved.get("resumes", 0)) + 1 if saved else 0


def check_plan(saved: dict[str, Any] | None, plan: Plan, directory: Path) -> None:
    """Refuse a resumed plan that cannot work with the saved run: a replay smaller than the one checkpointed."""
    if saved is None:
        return
    before = saved.get("settings", {}).get("replay", {}).get("capacity")
    if before is None:  # a run.json of an older version: its "services" held the preset's values
        before = saved.get("services", {}).get("replay", {}).get("CAPACITY")
    replay = plan.settings.get("replay")
    now = replay.capacity if replay is not None else plan.env["replay"].get("CAPACITY")
    try:
        smaller = before is not None and now is not None and int(now) < int(before)
    except ValueError:
        return
    if smaller:
        raise SettingsError(f"flywheel run --resume: replay capacity {now} is smaller than the saved run's {before} "
                            f"({directory / RUN_CONFIG}); its replay checkpoint needs capacity >= {before}")


def _secret_keys(service: str) -> set[str]:
    """Upper-case names of the service's SecretStr settings (kept out of run.json)."""
    from flywheel.launch.registry import settings_class

    fields = settings_class(service).model_fields
    return {name.upper() for name, f in fields.items() if "SecretStr" in str(f.annotation)}


def user_overrides(args: argparse.Namespace, services: list[str]) -> list[str]:
    """FLYWHEEL_<SERVICE>_* variables then --set items as SERVICE.field=value, the last per field, no secrets."""
    chosen: dict[tuple[str, str], str] = {}
    for service in services:
        prefix = f"FLYWHEEL_{service.upper()}_"
        for name, value in os.environ.items():
            if name.startswith(prefix) and name.removeprefix(prefix) not in _WIRED:
                chosen[(service, name.removeprefix(prefix))] = value
    for item in args.set:
        service, _, rest = item.partition(".")
        key, _, value = rest.partition("=")
        chosen.pop((service, key.upper()), None)
        chosen[(service, key.upper())] = value
    secrets = {s: _secret_keys(s) for s in services}
    return [f"{s}.{k.lower()}={v}" for (s, k), v in chosen.items() if k not in secrets.get(s, set())]


def _git_commit() -> dict[str, Any] | None:
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip()) if dirty.returncode == 0 else None}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def build_run_config(args: argparse.Namespace, plan: Plan, saved: dict[str, Any] | None) -> dict[str, Any]:
    """The run.json document for this invocation (secrets left out)."""
    from flywheel import __version__
    from flywheel.envs import split_env_id

    base, options = split_env_id(args.env)
    services = {}
    for service, values in plan.env.items():
        secrets = _secret_keys(service)
        services[service] = {k: v for k, v in sorted(values.items()) if k not in secrets}
    resolved = {  # what each service ran with, the preset read (actor-0's extras aside)
        service: settings.model_dump(mode="json", exclude={"instance", *map(str.lower, _secret_keys(service))})
        for service, settings in plan.settings.items()}
    now = time.time()
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "env_id": args.env, "env": {"id": base, "options": options},
        "flags": {"env": args.env, "actors": args.actors, "envs_per_actor": args.envs_per_actor,
                  "local_transport": getattr(args, "local_transport", "tcp"),
                  "curve_keys_dir": None if args.curve_keys_dir is None else str(args.curve_keys_dir),
                  "steps": args.steps, "time_limit": args.time_limit, "target_return": args.target_return,
                  **{d: getattr(args, d, None) for d in RESTORED_FLAGS[5:]}},  # --track, W&B names, preset, seed
        "preset": None if plan.preset is None else {"name": plan.preset.name, "sha256": plan.preset.sha256},
        "overrides": user_overrides(args, list(plan.env)),
        "services": services,
        "settings": resolved,
        "actor_instances": plan.actor_extra,
        "versions": {"flywheel": __version__, "torch": _version("torch"), "python": sys.version.split()[0]},
        "git": _git_commit(),
        "created_at": saved.get("created_at", now) if saved else now,
        "started_at": now,
        "resumes": start_index(saved),
    }


def write_run_config(args: argparse.Namespace, plan: Plan, saved: dict[str, Any] | None) -> Path:
    """Check a resumed plan against run.json, then write CHECKPOINT_DIR/run.json atomically (tmp + replace)."""
    directory = Path(args.checkpoint_dir).resolve()
    check_plan(saved, plan, directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RUN_CONFIG
    tmp = path.with_name(f".{RUN_CONFIG}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(build_run_config(args, plan, saved), indent=2) + "\n")
    os.replace(tmp, path)
    return path
