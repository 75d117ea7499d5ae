"""The gym-super-mario-bros 7.4.0 env ids: which exist, and what each one asks for (ROM mode, stage, game)."""

from __future__ import annotations

import re
from dataclasses import dataclass

ROM_MODES = ("vanilla", "downsample", "pixel", "rectangle")
_STAGE_ID = re.compile(r"SuperMarioBros-([1-8])-([1-4])-v([0-3])")
_GAME_ID = re.compile(r"SuperMarioBros-v([0-3])")
_RANDOM_ID = re.compile(r"SuperMarioBrosRandomStages-v([0-3])")
_LOST_ID = re.compile(r"SuperMarioBros2-v([01])")


@dataclass(frozen=True)
class MarioId:
    """A parsed gym-super-mario-bros id."""

    rom_mode: str
    lost_levels: bool = False
    target: tuple[int, int] | None = None
    random_stages: bool = False


def parse_mario_id(env_id: str) -> MarioId | None:
    """Parse any gym-super-mario-bros 7.4.0 id; return None if ``env_id`` is not one."""
    if m := _STAGE_ID.fullmatch(env_id):
        return MarioId(ROM_MODES[int(m[3])], target=(int(m[1]), int(m[2])))
    if m := _GAME_ID.fullmatch(env_id):
        return MarioId(ROM_MODES[int(m[1])])
    if m := _RANDOM_ID.fullmatch(env_id):
        return MarioId(ROM_MODES[int(m[1])], random_stages=True)
    if m := _LOST_ID.fullmatch(env_id):
        return MarioId(ROM_MODES[int(m[1])], lost_levels=True)
    return None


def mario_env_ids() -> list[str]:
    """Return every id gym-super-mario-bros 7.4.0 registers."""
    ids = [f"SuperMarioBros-v{v}" for v in range(4)]
    ids += [f"SuperMarioBrosRandomStages-v{v}" for v in range(4)]
    ids += [f"SuperMarioBros2-v{v}" for v in range(2)]
    ids += [f"SuperMarioBros-{w}-{s}-v{v}" for v in range(4) for w in range(1, 9) for s in range(1, 5)]
    return ids
