"""GET /healthz, /metrics (Prometheus text), /status and /history: what the gateway knows of the running system."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import PlainTextResponse

from ... import views
from ...models import Health, History, Status
from ..deps import GatewayDep

PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

router = APIRouter()


@router.get("/healthz", response_model=Health, summary="Liveness and readiness probe",
            responses={503: {"model": Health, "description": "a background task stopped"}})
async def healthz(gw: GatewayDep, response: Response) -> Health:
    ok, why = gw.healthy()
    response.status_code = 200 if ok else 503
    return Health(ok=ok, detail=why)


@router.get("/metrics", response_class=PlainTextResponse,
            summary="Every instance of every service, Prometheus text",
            responses={200: {"content": {PROM_CONTENT_TYPE: {}}}})
async def metrics(request: Request) -> PlainTextResponse:
    renderer: views.MetricsRenderer = request.app.state.metrics  # written in a thread: leases go on meanwhile
    return PlainTextResponse(await renderer.text(), media_type=PROM_CONTENT_TYPE)


# The views build plain dicts; each route's model checks one and writes it (a missing optional key stays missing).
@router.get("/status", summary="Every instance: role, version, rates, last report; a summary; control state",
            response_model=Status, response_model_exclude_unset=True)
async def status(gw: GatewayDep) -> dict[str, Any]:
    return views.status(gw)


@router.get("/history", summary="The learning curve (points at least interval_s apart, thinned when long)",
            response_model=History)
async def history(gw: GatewayDep, since: float | None = Query(None, ge=0, allow_inf_nan=False,
                                                              description="only points after this Unix time")
                  ) -> dict[str, Any]:
    return views.history(gw, since)
