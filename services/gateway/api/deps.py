"""Dependencies of the HTTP API's routes: the gateway service and its settings, and the control token check."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..settings import GatewaySettings
from ..transport import GatewayService
from .errors import Reject

# Only documents the scheme in OpenAPI; the check itself is ControlAuth.check on the raw header.
BEARER = HTTPBearer(auto_error=False, scheme_name="controlToken",
                    description="FLYWHEEL_GATEWAY_CONTROL_TOKEN (or the file FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE)")


def get_gateway(request: Request) -> GatewayService:
    """The gateway service the app was created with (create_app keeps it in ``app.state``)."""
    return cast(GatewayService, request.app.state.gateway)


def get_settings(request: Request) -> GatewaySettings:
    """The settings the app was created with."""
    return cast(GatewaySettings, request.app.state.settings)


GatewayDep = Annotated[GatewayService, Depends(get_gateway)]
SettingsDep = Annotated[GatewaySettings, Depends(get_settings)]


async def require_control_token(
    request: Request, gw: GatewayDep, _doc: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)] = None,
) -> None:
    """Refuse before anything else is looked at: 403 when control is off, 401 without the token."""
    if not gw.auth.active:
        why = ("set FLYWHEEL_GATEWAY_CONTROL_TOKEN or FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE on the gateway"
               if gw.auth.enabled else "FLYWHEEL_GATEWAY_CONTROL_ENABLED is false")
        raise Reject(403, f"control is off: {why}")
    if not gw.auth.check(request.headers.get("authorization")):
        raise Reject(401, "missing or wrong token: send 'Authorization: Bearer <token>'",
                     {"WWW-Authenticate": 'Bearer realm="flywheel-control"'})


ControlAllowed = Depends(require_control_token)
