"""scripts/import_cycles.py: it finds cycles and library-to-service imports in a made-up graph, and the package has
none (make lint runs it too)."""

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
