"""GET /: the live page (the numbers that matter and a learning curve, from /status and /history)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

from ...page import LIVE_PAGE

router = APIRouter()


@router.get("/", response_class=HTMLResponse, summary="Live page: the numbers that matter and a learning curve")
async def live_page() -> HTMLResponse:
    return HTMLResponse(LIVE_PAGE)
