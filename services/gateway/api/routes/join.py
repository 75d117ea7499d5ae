"""GET /join: the run's join document, for actors on other hosts (flywheel run --listen; flywheel actor --join)."""

from __future__ import annotations

from fastapi import APIRouter

from ... import views
from ...models import ErrorBody, JoinDocument
from ..deps import SettingsDep
from ..errors import Reject

router = APIRouter()


@router.get("/join", summary="What an actor on another host runs with: env id, preset, settings, endpoints "
            "(flywheel run --listen; flywheel actor --join)", response_model=JoinDocument,
            response_model_exclude_unset=True,
            responses={404: {"model": ErrorBody}})
async def join(settings: SettingsDep) -> JoinDocument:
    document = views.join_document(settings.join_file)
    if document is None:
        raise Reject(404, "this run takes no actors from other hosts (flywheel run --listen ADDR opens it)")
    return document
