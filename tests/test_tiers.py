"""The test tiers: tests/conftest.py fails a fast-tier test that starts a process and lets a marked one run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.system  # it runs pytest in a child process

ROOT = Path(__file__).resolve().parents[1]

CASES = '''
import multiprocessing
import os
import subprocess
import sys

import pytest


def test_pure():
    assert sum(range(4)) == 6


def test_subprocess():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_multiprocessing():
    child = multiprocessing.get_context("spawn").Process(target=int)
    child.start()
    child.join()


@pytest.fixture
def started():
    subprocess.run(["true"], check=True)


def test_process_in_a_fixture(started):
    pass


def test_bare_fork():  # the replay's checkpoint child: not a program started
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


@pytest.mark.system
def test_marked_system():
    subprocess.run(["true"], check=True)


@pytest.mark.slow
def test_marked_slow():
    subprocess.run(["true"], check=True)
'''


def test_a_fast_tier_test_that_starts_a_process_fails_and_names_the_mark(tmp_path: Path) -> None:
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n" + "".join(f"    {m}\n" for m in markers))
    (tmp_path / "test_cases.py").write_text(CASES)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:importnb", "-p", "no:cacheprovider",
                           "--strict-markers", "-rA", "-q", "test_cases.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    outcomes = {name: outcome for outcome, name in re.findall(r"^(PASSED|FAILED|ERROR) test_cases\.py::(\w+)",
                                                               done.stdout, re.MULTILINE)}
    assert outcomes == {"test_pure": "PASSED", "test_subprocess": "FAILED", "test_multiprocessing": "FAILED",
                        "test_process_in_a_fixture": "ERROR", "test_bare_fork": "PASSED",
                        "test_marked_system": "PASSED", "test_marked_slow": "PASSED"}, done.stdout[-4000:]
    assert "started a process in its call (subprocess.Popen:" in done.stdout, done.stdout[-4000:]
    assert "started a process in its call (multiprocessing:" in done.stdout
    assert "started a process in its setup (subprocess.Popen: true)" in done.stdout
    assert "mark it @pytest.mark.system" in done.stdout

