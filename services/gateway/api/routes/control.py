"""GET /control (the control book) and POST /control/<command>: one token-protected route per control command.

Each command's request schema is its proto argument class's (``CommandArgs.json_schema``), so the OpenAPI document
says exactly what the check accepts; bodies are read here, whatever the Content-Type, within max_body_bytes.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse

from ...control import COMMANDS, TARGET_PATTERN, CommandError, CommandSpec, TooManyRetained, UnknownCommand
from ...models import Accepted, ControlState
from ..deps import ControlAllowed, GatewayDep, SettingsDep
from ..errors import Reject, error_responses

OPERATOR_PATTERN = r"^[ -~]{1,64}$"

router = APIRouter()


@router.get("/control", summary="Retained and recent commands, and the commands there are",
            response_model=ControlState)
async def control_state(gw: GatewayDep) -> dict[str, Any]:
    return gw.control.state()


async def read_args(request: Request, max_body_bytes: int) -> dict[str, Any]:
    """The body as a JSON object of command arguments ({} when empty); 413 past ``max_body_bytes``, else 400."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
        raise Reject(413, f"body of {declared} bytes is over the {max_body_bytes}-byte limit")
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_body_bytes:
            raise Reject(413, f"body over the {max_body_bytes}-byte limit")
    if not raw.strip():
        return {}
    try:
        args = json.loads(raw)
    except (ValueError, RecursionError):
        raise Reject(400, "body must be a JSON object of command arguments (it is not valid JSON)") from None
    if not isinstance(args, dict):
        raise Reject(400, f"body must be a JSON object of command arguments, not {type(args).__name__}")
    return args


async def run_command(command: str, request: Request, gw: GatewayDep, max_body_bytes: int, target: str | None,
                      operator: str | None) -> Accepted:
    """Check and publish ``command`` with the body's arguments; what was published."""
    unknown = sorted(set(request.query_params) - {"target"})
    if unknown:  # a typo such as ?targt=actor-3 must not fall back to the default target
        raise Reject(422, f"unknown query parameters {[u[:40] for u in unknown[:5]]}; the only one is target")
    args = await read_args(request, max_body_bytes)
    client = request.client.host if request.client else "?"
    by = {"client": client, "token": gw.auth.fingerprint()}
    if operator:
        by["operator"] = operator
    try:
        msg = await gw.command(command, target, args, by)
    except CommandError as exc:
        code = 404 if isinstance(exc, UnknownCommand) else 409 if isinstance(exc, TooManyRetained) else 422
        raise Reject(code, f"{command[:40]}: {exc}") from None
    return Accepted(seq=msg.seq, command=msg.command, target=msg.target, args=msg.args)


def body_doc(name: str, spec: CommandSpec) -> dict[str, Any]:
    """The OpenAPI requestBody of a command: its arguments' schema, help and examples."""
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


def add_command_route(name: str, spec: CommandSpec) -> None:
    """POST /control/<name>: the token first (403/401), then target and operator (422), then the body."""

    async def handler(
        request: Request,
        gw: GatewayDep,
        settings: SettingsDep,
        _allowed: None = ControlAllowed,
        target: str | None = Query(None, min_length=1, max_length=128, pattern=TARGET_PATTERN,
                                   description=f"'*', a service or an instance; default {spec.default_target}"),
        operator: str | None = Header(None, alias="X-Flywheel-Operator", pattern=OPERATOR_PATTERN,
                                      description="who is asking, for the audit log (printable ASCII)"),
    ) -> Accepted:
        return await run_command(name, request, gw, settings.max_body_bytes, target, operator)

    router.add_api_route(
        f"/control/{name}", handler, methods=["POST"], status_code=202, response_model=Accepted,
        summary=spec.help, operation_id=f"control_{name}", tags=["control"],
        responses=error_responses(400, 401, 403, 409, 413, 422), openapi_extra=body_doc(name, spec))


for _name, _spec in COMMANDS.items():
    add_command_route(_name, _spec)


@router.post("/control/{command}", include_in_schema=False)
async def unknown_command(command: str, _allowed: None = ControlAllowed) -> JSONResponse:
    raise Reject(404, f"unknown command {command[:40]!r}; known: {', '.join(sorted(COMMANDS))}")
