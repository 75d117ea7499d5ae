"""Make the reliability helpers (and the pipeline helpers they build on) importable under any import mode."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = Path(__file__).resolve().parent
for _path in (str(_HERE), str(_HERE.parent / "pipeline")):
    if _path not in sys.path:
        sys.path.insert(0, _path)
