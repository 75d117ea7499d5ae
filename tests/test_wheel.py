"""The wheel as the ecosystem installs it: every package and preset is in it, and from it alone (no repository on the
path) `flywheel --version`, `flywheel bench list` and a short CartPole run work."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from flywheel.testing.run import clean_env

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"flywheel": "flywheel", "proto": "flywheel/proto", "services": "flywheel/services"}  # folder -> in wheel
RUN = ["run", "--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2", "--steps", "3000", "--no-video",
       "--base-port", "0", "--http-port", "0", "--progress-interval", "1", "--checkpoint-dir", "ckpt",
       "--set", "replay.min_size_to_sample=200"]


def _run(argv: list[str | Path], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.pop("PYTHONPATH", None)  # nothing of the test's own import path leaks in
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pip wheel --no-deps` of a copy of the checkout (pip writes build/ and *.egg-info beside the sources)."""
    work = tmp_path_factory.mktemp("wheel")
    source = work / "src"
    anywhere = shutil.ignore_patterns("__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache", ".hypothesis")

    def skip(folder: str, names: list[str]) -> set[str]:  # at the top: what a wheel never takes (runs, docs, tests)
        top = {n for n in names if n.startswith((".git", ".venv", "checkpoints")) or n in ("build", "docs", "tests")}
        return set(anywhere(folder, names)) | (top if Path(folder) == ROOT else set())

    shutil.copytree(ROOT, source, ignore=skip)
    # no build isolation: this venv's setuptools builds it, so no package index is needed
    _ok(_run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
              "--disable-pip-version-check", "-w", work / "dist", source], work, timeout=300))
    [built] = (work / "dist").glob("flywheel_rl-*.whl")
    return built


def test_the_wheel_holds_every_package_module_and_preset(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    wanted = set()
    for folder, inside in SOURCES.items():
        for file in (ROOT / folder).rglob("*"):
            if "__pycache__" in file.parts or not file.is_file():
                continue
            if file.suffix == ".py" or file.parent.name == "presets" and file.suffix == ".yaml":
                wanted.add(f"{inside}/{file.relative_to(ROOT / folder).as_posix()}")
    assert wanted - names == set(), f"missing from the wheel (pyproject.toml's packages/package-data): " \
                                    f"{sorted(wanted - names)}"
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"Version: {project['version']}" in meta and "Description-Content-Type: text/markdown" in meta
    assert "Project-URL: Repository" in meta and "Classifier: Programming Language :: Python :: 3.11" in meta
    assert "Author: The Flywheel authors" in meta and "# Flywheel" in meta  # the README is the long description


@pytest.mark.timeout(400)
def test_flywheel_runs_from_the_installed_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    """A fresh venv holds only the wheel; the dependencies come from this venv's site-packages through a plain path
    line (a .pth line is no site dir: this venv's editable-install finder is never loaded), so every flywheel module
    must come from the wheel. Installing torch and the rest again would take minutes and test pip, not Flywheel."""
    venv = tmp_path / "venv"
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, timeout=120))
    python = venv / "bin" / "python"
    site = Path(_ok(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path,
                         timeout=60)).strip())
    (site / "flywheel-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _ok(_run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "--quiet",
              "--disable-pip-version-check", wheel], tmp_path, timeout=300))

    shown = _ok(_run([python, "-c", "import json, sys, flywheel, flywheel.bench.parts, flywheel.services.actor as a; "
                                    "print(json.dumps([flywheel.__file__, a.__file__, sys.path]))"],
                     tmp_path, timeout=60))
    package, service, path = json.loads(shown)
    assert Path(package).is_relative_to(site) and Path(service).is_relative_to(site), (package, service)
    deps = Path(sysconfig.get_paths()["purelib"])
    assert not [p for p in path if Path(p).is_relative_to(ROOT) and not Path(p).is_relative_to(deps)], path
    flywheel = venv / "bin" / "flywheel"
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert _ok(_run([flywheel, "--version"], tmp_path, timeout=60)).strip() == f"flywheel {version}"
    listed = _ok(_run([flywheel, "bench", "list"], tmp_path, timeout=120))
    assert {line.split()[0] for line in listed.splitlines() if line[:1].isalpha()} >= {"replay", "sb3", "mario"}

    trained = _run([flywheel, *RUN], tmp_path, timeout=240)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "reached 3000 env steps" in trained.stdout, trained.stdout[-3000:]
    assert (tmp_path / "ckpt" / "learner" / "learner.safetensors").is_file()
    assert (tmp_path / "ckpt" / "run.json").is_file()
