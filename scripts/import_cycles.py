#!/usr/bin/env python3
"""Print the import cycles among the package's modules (function-level imports included) and the library modules
that import a service; exit 1 if there is any.

The package's three source folders map to module names as pyproject.toml's package-dir says: flywheel/ is
``flywheel``, proto/ is ``flywheel.proto`` and services/ is ``flywheel.services``. Every ``import`` and
``from ... import`` anywhere in a module (module level, in functions, under TYPE_CHECKING: a cycle a type
checker sees is still a cycle of the design) counts as an edge to the package module it names; an import of a
package, or of a name from it that is not a submodule, is an edge to its ``__init__``; ``from pkg import sub`` is
an edge to ``pkg.sub`` alone (as import-linter counts it), although Python runs ``pkg/__init__`` first. Cycles
are the strongly connected components of more than one module.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"flywheel": ROOT / "flywheel", "flywheel.proto": ROOT / "proto", "flywheel.services": ROOT / "services"}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (packages as their ``__init__``)."""
    found: dict[str, Path] = {}
    for prefix, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([prefix, *parts])
            if prefix == "flywheel" and parts and parts[0] in ("proto", "services"):
                continue  # not a folder of flywheel/ (package-dir maps them elsewhere)
            found[name] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` is or lies in (``flywheel.envs.make_env`` -> ``flywheel.envs``)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules ``name`` imports anywhere in its file."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]  # a submodule, else an attribute of base
        for target in targets:
            resolved = _resolve(target, known)
            if resolved is not None and resolved != name:
                edges.add(resolved)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    sys.setrecursionlimit(10_000)

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found, key=lambda c: (-len(c), c))


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


SERVICES = "flywheel.services."


def layer_breaks(g: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(library module, service module) imports: the library the services stand on (every module outside
    flywheel.services that a service imports, directly or not; a service's ``__main__`` only calls flywheel.cli,
    the dispatcher above everything) must import no service itself."""
    below: set[str] = set()
    todo = [m for m in g if m.startswith(SERVICES) and not m.endswith(".__main__")]  # entry points call the CLI
    seen = set(todo)
    while todo:
        for target in g[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
                if not target.startswith(SERVICES):
                    below.add(target)
    return sorted((m, t) for m in below for t in g[m] if t.startswith(SERVICES))


def main() -> int:
    g = graph()
    found = cycles(g)
    for component in found:
        members = set(component)
        print(f"cycle of {len(component)} modules:")
        for module in component:
            print(f"  {module} -> {', '.join(sorted(g[module] & members))}")
    breaks = layer_breaks(g)
    for library, service in breaks:
        print(f"library module {library} (the services import it) imports the service module {service}")
    print(f"{len(g)} modules, {sum(len(e) for e in g.values())} imports, {len(found)} import cycle(s), "
          f"{len(breaks)} library-to-service import(s)")
    return 1 if found or breaks else 0


if __name__ == "__main__":
    sys.exit(main())
