"""``flywheel run``'s W&B tracking flags (``--track``, ``--wandb-*``) and the gateway settings they become."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from flywheel.settings import SettingsError
from flywheel.tracking import INSTALL_HINT, TrackingUnavailable, default_mode, describe, parse_tags, require_wandb


def add_track_flags(parser: argparse.ArgumentParser) -> None:
    """``flywheel run``'s tracking flags: they set the gateway's track settings."""
    parser.add_argument("--track", action="store_true",
                        help="track the run's curves in Weights & Biases (the gateway logs each point; WANDB_MODE="
                             f"offline keeps it local for `wandb sync` later; needs {INSTALL_HINT})")
    parser.add_argument("--wandb-project", default="flywheel", help="W&B project (default: flywheel)")
    parser.add_argument("--wandb-entity", default="", help="W&B entity, a user or team (default: your default)")
    parser.add_argument("--wandb-group", default="", help="W&B group of the run (default: none)")
    parser.add_argument("--wandb-tags", default="", help="W&B tags, comma-separated")


def track_env(args: argparse.Namespace) -> dict[str, str]:
    """The gateway variables (less FLYWHEEL_GATEWAY_) for ``--track``; SettingsError when it cannot work here."""
    if not getattr(args, "track", False):
        return {}
    try:
        require_wandb()
        parse_tags(args.wandb_tags)
    except (TrackingUnavailable, ValueError) as exc:
        raise SettingsError(f"flywheel run --track: {exc}") from None
    values = {"TRACK": "true", "TRACK_PROJECT": args.wandb_project, "TRACK_ENTITY": args.wandb_entity,
              "TRACK_GROUP": args.wandb_group, "TRACK_TAGS": args.wandb_tags, "TRACK_MODE": default_mode()}
    return {k: v for k, v in values.items() if v}


def track_line(gateway_env: Mapping[str, str]) -> str | None:
    """The start line saying where tracking goes, from the gateway's planned variables (FLYWHEEL_GATEWAY_ less
    the prefix, as ``track_env`` made them and the gateway's settings read them); None when it is off."""
    if gateway_env.get("TRACK", "").lower() not in ("1", "true", "yes", "on"):
        return None
    mode = gateway_env.get("TRACK_MODE") or default_mode()
    track_dir = Path(gateway_env.get("TRACK_DIR") or gateway_env.get("CURVES_DIR") or Path.cwd())
    return describe(mode, track_dir, gateway_env.get("TRACK_PROJECT") or "flywheel",
                    gateway_env.get("TRACK_ENTITY", ""), gateway_env.get("TRACK_GROUP", ""))
