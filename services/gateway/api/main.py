"""The gateway's API router: every resource's routes, in the order the OpenAPI document lists them."""

from __future__ import annotations

from fastapi import APIRouter

from .routes import clips, control, join, monitoring, page

api_router = APIRouter()
for routes in (page, monitoring, clips, join, control):
    api_router.include_router(routes.router)
