"""The gateway service: telemetry to /metrics and /status, token-protected control, exploration leases.

Only the light, client-side pieces are imported here (actors use the lease client); the FastAPI app lives in
``flywheel.services.gateway.app``.
"""

from .lease import LeaseClient, apex_epsilon
from .settings import GatewaySettings

__all__ = ["GatewaySettings", "LeaseClient", "apex_epsilon"]
