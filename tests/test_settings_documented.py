"""Every field of every service's settings is set by a shipped preset or documented in docs/*.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flywheel import presets
from flywheel.launch.registry import settings_class
from flywheel.settings import flag_name

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("actor", "replay", "learner", "gateway")


def _docs_text() -> str:
    return "\n".join(path.read_text(errors="replace") for path in sorted((ROOT / "docs").glob("*.md")))


def _preset_keys(service: str) -> set[str]:
    keys: set[str] = set()
    for name in presets.names():
        keys |= set(presets.load(name).section(service))
    return keys


def documented(service: str, field: str, docs: str) -> bool:
    """The field as `field`, `service.field`, its --flag, or its FLYWHEEL_<SERVICE>_FIELD variable (also written
    FLYWHEEL_<SERVICE>_FIELD or ..._FIELD for a field every service has)."""
    upper = field.upper()
    patterns = (rf"`{re.escape(field)}`", rf"\b{service}\.{re.escape(field)}\b",
                rf"{re.escape(flag_name(field))}(?![a-z0-9-])",
                rf"(FLYWHEEL_{service.upper()}|FLYWHEEL_<SERVICE>|\.\.\.)_{upper}\b")
    return any(re.search(pattern, docs) for pattern in patterns)


@pytest.mark.parametrize("service", SERVICES)
def test_every_setting_is_set_by_a_preset_or_documented(service: str) -> None:
    docs, in_presets = _docs_text(), _preset_keys(service)
    missing = [name for name in settings_class(service).model_fields
               if name not in in_presets and not documented(service, name, docs)]
    assert not missing, f"{service} settings neither in a preset nor in docs/*.md: {', '.join(missing)}"


def test_the_check_finds_an_undocumented_name() -> None:
    docs = "`lr` and learner.batch_size, --weights-bind tcp://*:5557, FLYWHEEL_LEARNER_SEED, ..._CURVE_SERVER_KEY"
    for field in ("lr", "batch_size", "weights_bind", "seed", "curve_server_key"):
        assert documented("learner", field, docs), field
    for field in ("l", "batch", "weights", "seed_x", "curve_server"):
        assert not documented("learner", field, docs), field
