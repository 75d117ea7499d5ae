"""docs/ARCHITECTURE.md names every module under services/ that imports zmq: the list stays true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IMPORTS_ZMQ = re.compile(r"^\s*(import zmq\b|from zmq\b)", re.MULTILINE)


def documented_modules() -> set[str]:
    """The modules in the first column of the table under 'Which modules touch ZeroMQ'."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Which modules touch ZeroMQ", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(services/[^`]+\.py)` \|", section, re.MULTILINE))


def test_the_architecture_page_lists_exactly_the_service_modules_that_import_zmq() -> None:
    importing = {str(path.relative_to(ROOT)) for path in (ROOT / "services").rglob("*.py")
                 if IMPORTS_ZMQ.search(path.read_text())}
    assert "services/learner/transport.py" in importing  # the scan finds what it looks for
    assert documented_modules() == importing


def test_the_learner_touches_zmq_only_in_its_transport_module() -> None:
    learner = {path.name for path in (ROOT / "services" / "learner").glob("*.py")
               if IMPORTS_ZMQ.search(path.read_text())}
    assert learner == {"transport.py"}
