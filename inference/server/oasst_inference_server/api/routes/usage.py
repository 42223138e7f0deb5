"""A user's usage: generations and tokens per API key and in total, and the recent API requests.

Counted from the messages themselves (every generation is a message with its token counts), so the
figures hold across replicas and include requests whose client went away mid-stream), plus the usage
records of generations whose chat was deleted (``usage_records.py``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from oasst_inference_server.api.deps import ApiCaller, SessionDep
from oasst_inference_server.api.responses import AUTH, error
from oasst_inference_server.chats.usage_report import get_api_request, recent_api_requests, user_usage
from oasst_inference_server.db.models import DbMessage, MessageKind
from oasst_inference_server.openai_api.api_scrub import API_KINDS
from oasst_inference_server.responses_api.objects import RESPONSE_KIND
from oasst_inference_server.responses_api.service import DELETED_KIND
from oasst_shared.schemas import (
    ApiRequestRead,
    ListApiRequestsResponse,
    MessageState,
    UsageRead,
)

router = APIRouter(prefix="/usage", tags=["usage"])
# The requests listed: the OpenAI-compatible API's, and the Responses API's stored responses.
LISTED_KINDS = (*API_KINDS, RESPONSE_KIND, DELETED_KIND)


@router.get("", response_model=UsageRead, responses=AUTH)
async def usage(caller: ApiCaller, session: SessionDep) -> UsageRead:
    """Generations (chat answers, completions, embeddings) and their tokens, per API key and in total."""
    return await user_usage(session, caller.user.id)


def _request_read(m: DbMessage) -> ApiRequestRead:
    return ApiRequestRead(
        id=m.id,
        kind=MessageKind(m.kind).value,
        api_key_id=m.api_key_id,
        model_config_name=m.model_config_name,
        state=MessageState(m.state),
        finish_reason=m.finish_reason,
        prompt_tokens=m.prompt_tokens,
        completion_tokens=m.generated_tokens,
        error=m.error,
        chat_id=m.chat_id,
        created_at=m.created_at,
        finished_at=m.finished_at,
    )


@router.get("/requests", response_model=ListApiRequestsResponse, responses=AUTH)
async def list_requests(
    caller: ApiCaller,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    api_key_id: str | None = None,
) -> ListApiRequestsResponse:
    """The user's most recent requests of the OpenAI-compatible API, newest first."""
    rows = await recent_api_requests(session, caller.user.id, LISTED_KINDS, limit, api_key_id)
    return ListApiRequestsResponse(requests=[_request_read(m) for m in rows])


@router.get(
    "/requests/{request_id}",
    response_model=ApiRequestRead,
    responses={**AUTH, 404: error("No such request for this user")},
)
async def get_request(request_id: str, caller: ApiCaller, session: SessionDep) -> ApiRequestRead:
    """One API request by its id (the ``X-Request-Id`` header, or a completion, response or message id)."""
    request_id = (
        request_id.removeprefix("chatcmpl-").removeprefix("cmpl-").removeprefix("resp_").removeprefix("msg_")
    )
    message = await get_api_request(session, caller.user.id, LISTED_KINDS, request_id)
    return _request_read(message)
