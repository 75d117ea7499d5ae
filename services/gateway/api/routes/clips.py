"""GET /clip and /clip.mp4: the newest filmed greedy episode, what it showed and the video itself."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from ...models import ClipInfo, ErrorBody
from ..deps import GatewayDep
from ..errors import Reject

NO_CLIP = ("no clip yet: an actor with an eval env and FLYWHEEL_ACTOR_CLIP_INTERVAL_S > 0 films one greedy "
           "episode per interval (flywheel run: actor-0)")

router = APIRouter()


@router.get("/clip", summary="What the newest filmed greedy episode showed (404 before an actor sent one)",
            response_model=ClipInfo, responses={404: {"model": ErrorBody}})
async def clip_info(gw: GatewayDep) -> dict[str, Any]:
    if gw.clips.newest is None:
        raise Reject(404, NO_CLIP)
    return gw.clips.newest.info()


@router.get("/clip.mp4", summary="The newest filmed greedy episode, an H.264 mp4 at the env's frame rate",
            response_class=Response, responses={200: {"content": {"video/mp4": {}}}, 404: {"model": ErrorBody}})
async def clip_video(gw: GatewayDep) -> Response:
    clip = gw.clips.newest
    if clip is None:
        raise Reject(404, NO_CLIP)
    return Response(clip.data, media_type="video/mp4",
                    headers={"Cache-Control": "no-store", "X-Weight-Version": str(clip.weight_version)})
