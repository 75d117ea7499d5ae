"""The gateway's HTTP API (FastAPI): /, /metrics, /status, /history, /healthz and token-protected /control.

Every route is in the OpenAPI document (/openapi.json, /docs), with a request schema and examples per control
command; every 4xx answer is JSON ``{"error": "<reason>"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPBearer
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from flywheel import __version__

from . import views
from .auth import StartupError, startup_problem
from .control import COMMANDS, TARGET_PATTERN, CommandError, CommandSpec, TooManyRetained, UnknownCommand
from .curves_writer import write_curves
from .page import LIVE_PAGE
from .settings import GatewaySettings
from .transport import GatewayService

__all__ = ["GatewayService", "create_app"]
log = logging.getLogger("flywheel.gateway")
PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPERATOR_PATTERN = r"^[ -~]{1,64}$"
NO_CLIP = ("no clip yet: an actor with an eval env and FLYWHEEL_ACTOR_CLIP_INTERVAL_S > 0 films one greedy "
           "episode per interval (flywheel run: actor-0)")
# Only documents the scheme in OpenAPI; the check itself is ControlAuth.check on the raw header.
BEARER = HTTPBearer(auto_error=False, scheme_name="controlToken",
                    description="FLYWHEEL_GATEWAY_CONTROL_TOKEN (or the file FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE)")


class ErrorBody(BaseModel):
    """Every refused request gets this, with the reason."""

    error: str = Field(examples=["lr must be in (0, 1], got 5"])


class Accepted(BaseModel):
    """A command as published on the control channel."""

    seq: int = Field(description="sequence number; subscribers drop repeats by it")
    command: str
    target: str = Field(description="'*', a service name or an instance name")
    args: dict[str, Any] = Field(description="the checked arguments, as sent")


class Health(BaseModel):
    ok: bool
    detail: str


class Reject(Exception):
    """Answer ``status`` with ``{"error": message}``."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    reasons = {400: "the body is not a JSON object", 401: "missing or wrong bearer token",
               403: "control is off on this gateway", 404: "no such command", 409: "too many retained commands",
               413: "body too large",
               422: "an argument, the target or a parameter is out of range"}
    return {code: {"model": ErrorBody, "description": reasons[code]} for code in codes}


def _body_doc(name: str, spec: CommandSpec) -> dict[str, Any]:
    examples = {key: {"summary": f"{name} {json.dumps(value)}", "value": value} for key, value in spec.examples.items()}
    content: dict[str, Any] = {"schema": spec.schema}
    if examples:
        content["examples"] = examples
    try:
        spec.check({})
        required = False
    except CommandError:
        required = True
    return {"requestBody": {"required": required, "description": spec.help,
                            "content": {"application/json": content}}}


def create_app(settings: GatewaySettings, service: GatewayService | None = None) -> FastAPI:
    """The FastAPI app; its lifespan binds (if not yet bound) and runs the gateway's ZeroMQ side."""
    gw = service or GatewayService(settings)
    problem = startup_problem(settings, gw.auth)
    if problem is not None:
        raise StartupError(problem)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        if settings.curves_dir is not None:  # stopped with the gateway's other tasks (the last point at the stop)
            gw.tasks.append(asyncio.create_task(
                write_curves(gw, settings.curves_dir, settings.curves_interval_s), name="gateway-curves"))
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(
        title="Flywheel gateway", version=__version__, lifespan=lifespan,
        description="Metrics, status and control of a Flywheel (distributed Ape-X DQN) system. POST /control/* "
                    "needs `Authorization: Bearer <token>` (FLYWHEEL_GATEWAY_CONTROL_TOKEN or _FILE); bodies are "
                    "JSON objects whatever the Content-Type.",
    )
    app.state.gateway = gw

    @app.exception_handler(Reject)
    async def on_reject(_request: Request, exc: Reject) -> JSONResponse:
        return JSONResponse({"error": exc.message}, status_code=exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        reasons = []
        for err in exc.errors()[:5]:
            where = ".".join(str(p) for p in err.get("loc", ()))
            reasons.append(f"{where}: {err.get('msg', 'invalid')}")
        return JSONResponse({"error": "; ".join(reasons) or "invalid request"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    @app.middleware("http")
    async def count_rejects(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response = await call_next(request)
        if 400 <= response.status_code < 500:
            route = getattr(request.scope.get("route"), "path", "unmatched")
            gw.count_http_reject(route, response.status_code, request.client.host if request.client else "?")
        return response

    @app.get("/", response_class=HTMLResponse, summary="Live page: the numbers that matter and a learning curve")
    async def live_page() -> HTMLResponse:
        return HTMLResponse(LIVE_PAGE)

    @app.get("/healthz", response_model=Health, summary="Liveness and readiness probe",
             responses={503: {"model": Health, "description": "a background task stopped"}})
    async def healthz() -> JSONResponse:
        ok, why = gw.healthy()
        return JSONResponse({"ok": ok, "detail": why}, status_code=200 if ok else 503)

    @app.get("/metrics", response_class=PlainTextResponse, summary="Every instance of every service, Prometheus text",
             responses={200: {"content": {PROM_CONTENT_TYPE: {}}}})
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(views.metrics_text(gw), media_type=PROM_CONTENT_TYPE)

    @app.get("/status", summary="Every instance: role, version, rates, last report; a summary; control state",
             response_model=dict[str, Any])
    async def status() -> JSONResponse:
        return JSONResponse(views.status(gw))

    @app.get("/history", summary="The learning curve (points at least interval_s apart, thinned when long)",
             response_model=dict[str, Any])
    async def history(since: float | None = Query(None, ge=0, allow_inf_nan=False,
                                                  description="only points after this Unix time")) -> JSONResponse:
        return JSONResponse(views.history(gw, since))

    @app.get("/clip", summary="What the newest filmed greedy episode showed (404 before an actor sent one)",
             response_model=dict[str, Any], responses={404: {"model": ErrorBody}})
    async def clip_info() -> JSONResponse:
        if gw.clips.newest is None:
            raise Reject(404, NO_CLIP)
        return JSONResponse(gw.clips.newest.info())

    @app.get("/clip.mp4", summary="The newest filmed greedy episode, an H.264 mp4 at the env's frame rate",
             response_class=Response, responses={200: {"content": {"video/mp4": {}}}, 404: {"model": ErrorBody}})
    async def clip_video() -> Response:
        clip = gw.clips.newest
        if clip is None:
            raise Reject(404, NO_CLIP)
        return Response(clip.data, media_type="video/mp4",
                        headers={"Cache-Control": "no-store", "X-Weight-Version": str(clip.weight_version)})

    @app.get("/join", summary="What an actor on another host runs with: env id, preset, settings, endpoints "
             "(flywheel run --listen; flywheel actor --join)", response_model=dict[str, Any],
             responses={404: {"model": ErrorBody}})
    async def join() -> JSONResponse:
        document = views.join_document(settings.join_file)
        if document is None:
            raise Reject(404, "this run takes no actors from other hosts (flywheel run --listen ADDR opens it)")
        return JSONResponse(document)

    @app.get("/control", summary="Retained and recent commands, and the commands there are",
             response_model=dict[str, Any])
    async def control_state() -> JSONResponse:
        return JSONResponse(gw.control.state())

    async def authorized(request: Request, _doc: Annotated[Any, Security(BEARER)] = None) -> str:
        """Refuse before anything else is looked at: 403 when control is off, 401 without the token."""
        if not gw.auth.active:
            why = ("set FLYWHEEL_GATEWAY_CONTROL_TOKEN or FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE on the gateway"
                   if gw.auth.enabled else "FLYWHEEL_GATEWAY_CONTROL_ENABLED is false")
            raise Reject(403, f"control is off: {why}")
        if not gw.auth.check(request.headers.get("authorization")):
            raise Reject(401, "missing or wrong token: send 'Authorization: Bearer <token>'",
                         {"WWW-Authenticate": 'Bearer realm="flywheel-control"'})
        return "ok"

    async def read_args(request: Request) -> dict[str, Any]:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
            raise Reject(413, f"body of {declared} bytes is over the {settings.max_body_bytes}-byte limit")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > settings.max_body_bytes:
                raise Reject(413, f"body over the {settings.max_body_bytes}-byte limit")
        if not raw.strip():
            return {}
        try:
            args = json.loads(raw)
        except (ValueError, RecursionError):
            raise Reject(400, "body must be a JSON object of command arguments (it is not valid JSON)") from None
        if not isinstance(args, dict):
            raise Reject(400, f"body must be a JSON object of command arguments, not {type(args).__name__}")
        return args

    async def run_command(command: str, request: Request, target: str | None, operator: str | None) -> JSONResponse:
        unknown = sorted(set(request.query_params) - {"target"})
        if unknown:  # a typo such as ?targt=actor-3 must not fall back to the default target
            raise Reject(422, f"unknown query parameters {[u[:40] for u in unknown[:5]]}; the only one is target")
        args = await read_args(request)
        client = request.client.host if request.client else "?"
        by = {"client": client, "token": gw.auth.fingerprint()}
        if operator:
            by["operator"] = operator
        try:
            msg = await gw.command(command, target, args, by)
        except CommandError as exc:
            code = 404 if isinstance(exc, UnknownCommand) else 409 if isinstance(exc, TooManyRetained) else 422
            raise Reject(code, f"{command[:40]}: {exc}") from None
        return JSONResponse({"seq": msg.seq, "command": msg.command, "target": msg.target, "args": msg.args},
                            status_code=202)

    def add_command_route(name: str, spec: CommandSpec) -> None:
        async def handler(
            request: Request,
            _auth: str = Depends(authorized),
            target: str | None = Query(None, min_length=1, max_length=128, pattern=TARGET_PATTERN,
                                       description=f"'*', a service or an instance; default {spec.default_target}"),
            operator: str | None = Header(None, alias="X-Flywheel-Operator", pattern=OPERATOR_PATTERN,
                                          description="who is asking, for the audit log (printable ASCII)"),
        ) -> JSONResponse:
            return await run_command(name, request, target, operator)

        app.add_api_route(
            f"/control/{name}", handler, methods=["POST"], status_code=202, response_model=Accepted,
            summary=spec.help, operation_id=f"control_{name}", tags=["control"],
            responses=_errors(400, 401, 403, 409, 413, 422), openapi_extra=_body_doc(name, spec))

    for name, spec in COMMANDS.items():
        add_command_route(name, spec)

    @app.post("/control/{command}", include_in_schema=False)
    async def unknown_command(command: str, _auth: str = Depends(authorized)) -> JSONResponse:
        raise Reject(404, f"unknown command {command[:40]!r}; known: {', '.join(sorted(COMMANDS))}")

    return app
