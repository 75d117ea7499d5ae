"""docs/ARCHITECTURE.md's transition path against the code: its files exist, its names are defined in them, and
every module that handles the transition record is on the path."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SECTION = "## One transition, from actor to learner and back"
# the record and what derives from it: a module naming one of these handles transitions
RECORD_NAMES = re.compile(
    r"\b(proto\.Transition|TransitionBatch|SampleBatch|Emitted|DeviceBatch|TRANSITION_(FIELDS|NAMES))\b")


def section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    return text[start:end]


def code_cells() -> list[str]:
    """The code column of each hop of the table."""
    rows = [line for line in section().splitlines() if re.match(r"\|\s*\d+\s*\|", line)]
    assert len(rows) >= 9, "the transition's hops table is missing or lost rows"
    return [row.rstrip().rstrip("|").rsplit("|", 1)[1] for row in rows]


def defined_names(path: Path) -> set[str]:
    """Top-level classes and functions of a module, and Class.method for each class's methods."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            names.update(f"{node.name}.{item.name}" for item in node.body
                         if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef))
    return names


def named_code() -> list[tuple[Path, str | None]]:
    """(file, name) pairs of the section: a name belongs to the file named last before it; a bare file name
    (``storage.py``) is in the folder of the last full path."""
    pairs: list[tuple[Path, str | None]] = []
    cells = code_cells()
    tail = section().split("| --- | --- | --- |", 1)[1].split("\n\n", 1)[1]  # the paragraph under the table
    for cell in [*cells, tail]:
        current: Path | None = None
        for token in re.findall(r"`([^`]+)`", cell):
            if token.endswith(".py"):
                current = ROOT / token if "/" in token else (current.parent if current else ROOT) / token
                pairs.append((current, None))
            elif re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_]\w*)?", token) and current is not None:
                pairs.append((current, token))
    return pairs


def test_every_file_and_name_on_the_path_exists_where_the_doc_says() -> None:
    pairs = named_code()
    assert sum(name is not None for _, name in pairs) >= 25
    missing_files = sorted({str(path.relative_to(ROOT)) for path, _ in pairs if not path.is_file()})
    assert not missing_files, f"ARCHITECTURE.md names files that do not exist: {missing_files}"
    undefined = [f"{path.relative_to(ROOT)}: {name}" for path, name in pairs
                 if name is not None and name not in defined_names(path)]
    assert not undefined, f"ARCHITECTURE.md names what these files do not define: {undefined}"


def test_every_module_that_handles_the_record_is_on_the_path() -> None:
    on_path = {path for path, _ in named_code()}
    handlers = {path for folder in ("proto", "services") for path in (ROOT / folder).rglob("*.py")
                if path.name != "__init__.py" and RECORD_NAMES.search(path.read_text())}
    assert len(handlers) >= 10
    left_out = sorted(str(path.relative_to(ROOT)) for path in handlers - on_path)
    assert not left_out, f"these modules handle transitions but ARCHITECTURE.md's path does not name them: {left_out}"


def test_the_record_is_declared_once() -> None:
    """The transition's fields are spelled as declarations in proto/transition.py only."""
    declaration = re.compile(r"^\s+(obs|action|reward|discount|next_obs): [\w.\[\] |]+( = .+)?$", re.M)
    where = {str(path.relative_to(ROOT)) for folder in ("proto", "services", "flywheel")
             for path in (ROOT / folder).rglob("*.py") if declaration.search(path.read_text())}
    assert "proto/transition.py" in where
    assert where <= {"proto/transition.py", "flywheel/envs/vector.py"}, where  # vector.py: an env step's result
