"""NumPy 2 compatibility fixes for nes-py 8.2.1 and gym-super-mario-bros 7.4.0.

Both packages were written for NumPy 1's *value-based* casting, where
``np.uint8(2) * 1024`` silently promoted to a wider integer type.  NumPy 2
follows NEP 50: a NumPy scalar combined with a Python ``int`` keeps the NumPy
dtype, so the same expression either raises ``OverflowError`` (the Python int
does not fit in ``uint8``) or wraps modulo 256 with a ``RuntimeWarning``.
The affected code paths are:

* ``nes_py._rom.ROM`` header sizes (``16 * header[4]`` etc.) are ``uint8``;
  ``prg_rom_stop = start + prg_rom_size * 2**10`` raises ``OverflowError``, so
  no ROM can be loaded at all.
* ``gym_super_mario_bros.SuperMarioBrosEnv`` RAM readers index a ``uint8``
  RAM view; ``_x_position = ram[0x6d] * 0x100 + ram[0x86]`` raises (or wraps
  at 255), ``_y_position`` wraps above the viewport and ``_left_x_position``
  feeds a negative int to ``np.uint8``.  Their results also leak ``np.uint8``
  into ``info`` and into reward arithmetic (``x - x_last`` wraps on uint8).

:func:`apply` replaces exactly these properties with versions that convert
each byte to a Python ``int`` before doing arithmetic, which reproduces the
NumPy 1 numbers bit-for-bit (NumPy 1 promoted to a type wide enough to hold
the exact result).  Everything else in both packages is untouched.  Importing
this module never imports ``gym``; :func:`apply` does, once, and is
idempotent.  ``gym`` 0.26.2 itself imports cleanly under NumPy 2 (only its
env checker uses removed aliases such as ``np.bool8``, and we never call it);
its ``gym_notices`` banner on stderr is swallowed during that first import.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import io
import threading
from typing import Any

SUPPORTED_VERSIONS: dict[str, str] = {"nes-py": "8.2.1", "gym-super-mario-bros": "7.4.0"}

_LOCK = threading.Lock()
_APPLIED = False


def _byte(ram: Any, address: int) -> int:
    """Read one RAM byte as a Python int (no uint8 arithmetic afterwards)."""
    return int(ram[address])


# --- nes_py._rom.ROM -------------------------------------------------------


def _prg_rom_size(self: Any) -> int:
    """Return the size of the PRG ROM in KB (16 KB units in header byte 4)."""
    return 16 * int(self.header[4])


def _chr_rom_size(self: Any) -> int:
    """Return the size of the CHR ROM in KB (8 KB units in header byte 5)."""
    return 8 * int(self.header[5])


def _prg_ram_size(self: Any) -> int:
    """Return the size of the PRG RAM in KB (0 means 1 unit for compatibility)."""
    return 8 * (int(self.header[8]) or 1)


def _zero_fill(self: Any) -> int:
    """Return the sum of the zero-fill bytes 11..15 of the header."""
    return sum(int(b) for b in self.header[11:])


_ROM_PATCHES = {
    "prg_rom_size": _prg_rom_size,
    "chr_rom_size": _chr_rom_size,
    "prg_ram_size": _prg_ram_size,
    "_zero_fill": _zero_fill,
}


# --- gym_super_mario_bros.SuperMarioBrosEnv --------------------------------


def _level(self: Any) -> int:
    """Return the level index (world * 4 + stage, zero based)."""
    return _byte(self.ram, 0x075F) * 4 + _byte(self.ram, 0x075C)


def _world(self: Any) -> int:
    """Return the current world (1 to 8)."""
    return _byte(self.ram, 0x075F) + 1


def _stage(self: Any) -> int:
    """Return the current stage (1 to 4)."""
    return _byte(self.ram, 0x075C) + 1


def _area(self: Any) -> int:
    """Return the current area number (1 to 5)."""
    return _byte(self.ram, 0x0760) + 1


def _life(self: Any) -> int:
    """Return the number of remaining lives (0xFF after the last one)."""
    return _byte(self.ram, 0x075A)


def _x_position(self: Any) -> int:
    """Return the horizontal position: page (0x6D) * 256 + x on page (0x86)."""
    return _byte(self.ram, 0x6D) * 0x100 + _byte(self.ram, 0x86)


def _left_x_position(self: Any) -> int:
    """Return the number of pixels from the left of the screen."""
    return (_byte(self.ram, 0x86) - _byte(self.ram, 0x071C)) % 256


def _y_pixel(self: Any) -> int:
    """Return the vertical pixel position (0x03B8)."""
    return _byte(self.ram, 0x03B8)


def _y_viewport(self: Any) -> int:
    """Return the y viewport (0 above, 1 visible, >1 below the screen)."""
    return _byte(self.ram, 0x00B5)


def _y_position(self: Any) -> int:
    """Return the height above the screen bottom; may exceed 255 above the viewport."""
    if self._y_viewport < 1:
        return 255 + (255 - self._y_pixel)
    return 255 - self._y_pixel


def _player_state(self: Any) -> int:
    """Return the player state byte (0x000E)."""
    return _byte(self.ram, 0x000E)


_SMB_PATCHES = {
    "_level": _level,
    "_world": _world,
    "_stage": _stage,
    "_area": _area,
    "_life": _life,
    "_x_position": _x_position,
    "_left_x_position": _left_x_position,
    "_y_pixel": _y_pixel,
    "_y_viewport": _y_viewport,
    "_y_position": _y_position,
    "_player_state": _player_state,
}


def _patch_properties(cls: type, patches: dict[str, Any]) -> None:
    """Replace existing properties of ``cls``; fail loudly if the upstream layout changed."""
    for name, func in patches.items():
        if not isinstance(cls.__dict__.get(name), property):
            raise RuntimeError(
                f"nes_compat: {cls.__module__}.{cls.__qualname__}.{name} is not a property; "
                f"the NumPy 2 fixes target {SUPPORTED_VERSIONS} - check installed versions"
            )
        setattr(cls, name, property(func, doc=func.__doc__))


def installed_versions() -> dict[str, str | None]:
    """Return the installed versions of the patched distributions (None if missing)."""
    out: dict[str, str | None] = {}
    for dist in SUPPORTED_VERSIONS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def apply() -> None:
    """Import ``gym``/``nes_py``/``gym_super_mario_bros`` and install the fixes (idempotent)."""
    global _APPLIED
    with _LOCK:
        if _APPLIED:
            return
        require_installed()
        # gym 0.26.2 prints a "Gym has been unmaintained" notice to stderr on import;
        # we only use gym for nes-py's base class and the spaces it builds at import time.
        with contextlib.redirect_stderr(io.StringIO()):
            import gym  # noqa: F401
        import gym_super_mario_bros
        import nes_py._rom

        _patch_properties(nes_py._rom.ROM, _ROM_PATCHES)
        _patch_properties(gym_super_mario_bros.SuperMarioBrosEnv, _SMB_PATCHES)
        _APPLIED = True


_INSTALLED = False  # require_installed passed once


def require_installed() -> None:
    """Raise MissingExtra naming the mario extra when nes-py, gym-super-mario-bros or gym is not installed."""
    global _INSTALLED
    if _INSTALLED:
        return
    missing = [d for d, v in installed_versions().items() if v is None]
    _INSTALLED = not missing
    if missing:
        from flywheel.extras import MissingExtra

        raise MissingExtra("mario", "Super Mario Bros", ImportError(f"missing: {', '.join(missing)}"))


def is_applied() -> bool:
    """Return whether :func:`apply` has run in this process."""
    return _APPLIED
