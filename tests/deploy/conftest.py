"""Make tests/deploy's helper modules importable under any import mode (importlib, plugins that import tests)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
