"""The package's layers: scripts/import_cycles.py finds cycles and library-to-service imports in a made-up graph,
and the package has none (make lint runs it too); and no module outside the env families, presets and bench names
a game."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("import_cycles", ROOT / "scripts" / "import_cycles.py")
assert spec is not None and spec.loader is not None
import_cycles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(import_cycles)


def test_cycles_and_layer_breaks_in_a_made_up_graph() -> None:
    graph = {"flywheel.a": {"flywheel.b"}, "flywheel.b": {"flywheel.c"}, "flywheel.c": {"flywheel.a"},
             "flywheel.d": {"flywheel.services.x.core"}, "flywheel.e": set(),
             "flywheel.services.x.core": {"flywheel.d", "flywheel.e"},
             "flywheel.services.x.__main__": {"flywheel.cli"}, "flywheel.cli": {"flywheel.services.x.core"}}
    assert import_cycles.cycles(graph) == [["flywheel.a", "flywheel.b", "flywheel.c"],
                                           ["flywheel.d", "flywheel.services.x.core"]]
    assert import_cycles.layer_breaks(graph) == [("flywheel.d", "flywheel.services.x.core")]


def test_function_level_and_relative_imports_are_edges(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from .transport import receive\n    import flywheel.envs.subproc\n"
                      "from flywheel.envs import make_env, nes_compat\n")
    known = {name: tmp_path for name in ("flywheel.transport", "flywheel.envs", "flywheel.envs.subproc",
                                         "flywheel.envs.nes_compat", "flywheel.m")}
    assert import_cycles.imports("flywheel.m", module, known) == {
        "flywheel.transport", "flywheel.envs", "flywheel.envs.subproc", "flywheel.envs.nes_compat"}


def test_the_package_has_no_import_cycle_and_no_library_module_imports_a_service() -> None:
    graph = import_cycles.graph()
    assert len(graph) > 100 and "flywheel.services.learner.core" in graph
    assert import_cycles.cycles(graph) == []
    assert import_cycles.layer_breaks(graph) == []


GAME_WORDS = ("mario", "x_pos")
GAME_FOLDERS = ("flywheel/envs", "flywheel/presets", "flywheel/bench", "flywheel/examples")


def test_no_module_outside_the_env_families_presets_and_bench_names_a_game() -> None:
    """A game is known only by its env module (its measures), its preset and the bench: services, proto and the
    rest of flywheel/ name none, comments and page templates included (a second game needs no edit there)."""
    files = [path for top in ("services", "proto", "flywheel") for path in (ROOT / top).rglob("*")
             if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".so")
             and not str(path.relative_to(ROOT)).startswith(GAME_FOLDERS)]
    assert len(files) > 100
    naming = [f"{path.relative_to(ROOT)}:{number}" for path in files
              for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
              if any(word in line.lower() for word in GAME_WORDS)]
    assert naming == []
