"""``POST /v1/moderations`` (OpenAI's shape), answered by the moderation hook (404 while it is off)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from oasst_inference_server.api.deps import ApiCaller, ModerationServingDep, SessionDep
from oasst_inference_server.api.served import respond
from oasst_inference_server.openai_protocol.errors import ErrorResponse
from oasst_inference_server.openai_protocol.moderations import ModerationRequest, ModerationResponse

router = APIRouter(prefix="/v1", tags=["openai"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        400: "Invalid input: empty, too many or too long texts",
        401: "Missing, invalid or revoked API key",
        404: "The moderation hook is off",
        429: "Rate limit or concurrency limit (see Retry-After)",
        503: "The classifier's embedding model has no worker right now",
    }.items()
}


@router.post("/moderations", response_model=ModerationResponse, responses=_ERRORS)
async def create_moderation(
    request: Request,
    response: Response,
    body: ModerationRequest,
    caller: ApiCaller,
    session: SessionDep,
    serving: ModerationServingDep,
) -> ModerationResponse:
    """Each input's categories, flagged or not, and their scores."""
    return respond(await serving.create(session, caller, body, request.is_disconnected), response)
