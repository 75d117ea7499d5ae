"""scripts/measure_cartpole_target.py refuses what it cannot run with one clear line, before any training starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.system

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "measure_cartpole_target.py"


def run_script(tmp_path: Path, *args: str, hide_sb3: bool = False) -> subprocess.CompletedProcess[str]:
    hide = "sys.modules['stable_baselines3'] = None; " if hide_sb3 else ""  # as if it were not installed
    code = (f"import runpy, sys; {hide}sys.argv = {[str(SCRIPT), *args]!r}; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


def test_an_unknown_side_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = run_script(tmp_path, "--seeds", "1-1", "--out", str(out), "--sides", "flywheel,ppo")
    assert done.returncode == 2
    assert "--sides 'flywheel,ppo': expected flywheel, sb3 or flywheel,sb3" in done.stderr
    assert not out.exists()


def test_the_sb3_side_without_stable_baselines3_says_how_to_install_it(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    done = run_script(tmp_path, "--seeds", "1-1", "--out", str(out), hide_sb3=True)
    assert done.returncode == 2
    assert "the SB3 side needs stable-baselines3: pip install 'flywheel-rl[bench]' (or --sides flywheel)" in done.stderr
    assert not out.exists()
