"""The services the ``flywheel`` command can start: each one's settings class and entry point, imported lazily."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flywheel.settings import CommonSettings


@dataclass(frozen=True)
class Service:
    """Where a service's settings class and ``main(settings) -> exit code`` live ("module:attribute")."""

    name: str
    settings: str
    main: str

    def settings_class(self) -> type[CommonSettings]:
        """Imported on demand, like the entry point."""
        loaded: type[CommonSettings] = _load(self.settings)
        return loaded

    def entry_point(self) -> Callable[[Any], int]:
        """Imported on demand, so ``flywheel gateway`` does not pay for torch, and so on."""
        return _load(self.main)


def _load(path: str) -> Any:
    module, attribute = path.split(":")
    return getattr(importlib.import_module(module), attribute)


SERVICES: dict[str, Service] = {s.name: s for s in (
    Service("actor", "flywheel.services.actor.settings:ActorSettings", "flywheel.services.actor.main:main"),
    Service("replay", "flywheel.services.replay.settings:ReplaySettings", "flywheel.services.replay.main:main"),
    Service("learner", "flywheel.services.learner.settings:LearnerSettings", "flywheel.services.learner.main:main"),
    Service("gateway", "flywheel.services.gateway.settings:GatewaySettings", "flywheel.services.gateway.main:main"),
)}


def settings_class(name: str) -> type[CommonSettings]:
    """The settings class of service ``name`` (a KeyError names an unknown one)."""
    return SERVICES[name].settings_class()
