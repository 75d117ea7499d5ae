"""docs/README.md is the docs index: every page under docs/ (and the research log) has its line, every link works."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_every_doc_is_in_the_index_and_every_link_resolves() -> None:
    index = (DOCS / "README.md").read_text()
    targets = {(DOCS / target).resolve() for target in LINK.findall(index) if "://" not in target}
    pages = {p.resolve() for p in [*DOCS.glob("*.md"), *(DOCS / "research").glob("*.md")] if p.name != "README.md"}
    missing = sorted(str(p.relative_to(DOCS)) for p in pages - targets)
    assert not missing, f"add a line to docs/README.md for: {missing}"
    assert all(t.exists() for t in targets), sorted(str(t) for t in targets if not t.exists())
    assert {(ROOT / n).resolve() for n in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")} <= targets
