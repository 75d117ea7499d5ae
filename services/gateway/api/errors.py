"""How the HTTP API refuses: every 4xx is JSON ``{"error": "<reason>"}``, and each is counted by route and status."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..models import ErrorBody
from ..transport import GatewayService

REASONS = {400: "the body is not a JSON object", 401: "missing or wrong bearer token",
           403: "control is off on this gateway", 404: "no such command", 409: "too many retained commands",
           413: "body too large", 422: "an argument, the target or a parameter is out of range"}


class Reject(Exception):
    """Answer ``status`` with ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` entries of these refusals."""
    return {code: {"model": ErrorBody, "description": REASONS[code]} for code in codes}


async def _on_reject(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Reject)
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)


async def _on_invalid(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    reasons = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ()))
        reasons.append(f"{where}: {err.get('msg', 'invalid')}")
    return JSONResponse({"error": "; ".join(reasons) or "invalid request"}, status_code=422)


async def _on_http(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)


def install_error_handling(app: FastAPI, gw: GatewayService) -> None:
    """JSON reasons for every refusal (ours, FastAPI's validation, Starlette's 404/405), each counted by ``gw``."""
    app.add_exception_handler(Reject, _on_reject)
    app.add_exception_handler(RequestValidationError, _on_invalid)
    app.add_exception_handler(StarletteHTTPException, _on_http)

    @app.middleware("http")
    async def count_rejects(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if 400 <= response.status_code < 500:
            route = getattr(request.scope.get("route"), "path", "unmatched")
            gw.count_http_reject(route, response.status_code, request.client.host if request.client else "?")
        return response
