"""The gateway service: telemetry to /metrics and /status, token-protected control, exploration leases.

The FastAPI app lives in ``flywheel.services.gateway.app``; ``flywheel gateway`` starts it.
"""

from .settings import GatewaySettings

__all__ = ["GatewaySettings"]
