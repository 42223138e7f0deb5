"""A user's usage: generations and tokens per API key and in total, and the recent API requests.

Counted from the messages themselves (every generation is a message with its token counts), so the
figures hold across replicas and include requests whose client went away mid-stream), plus the usage
records of generations whose chat was deleted (``usage_records.py``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import func, select

from oasst_inference_server.api.deps import ApiCaller, SessionDep
from oasst_inference_server.api.responses import AUTH, error
from oasst_inference_server.db.models import DbApiKey, DbChat, DbMessage, DbUsageRecord
from oasst_inference_server.domain_errors import not_found
from oasst_inference_server.openai_api.openai_service import API_KINDS
from oasst_shared.schemas import (
    ApiKeyUsage,
    ApiRequestRead,
    ListApiRequestsResponse,
    MessageState,
    UsageRead,
    UsageTotals,
)

router = APIRouter(prefix="/usage", tags=["usage"])


def _totals(requests: int | None, prompt: int | None, completion: int | None) -> UsageTotals:
    prompt, completion = int(prompt or 0), int(completion or 0)
    return UsageTotals(
        requests=int(requests or 0),
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
    )


def _add(a: UsageTotals, b: UsageTotals) -> UsageTotals:
    return _totals(
        a.requests + b.requests, a.prompt_tokens + b.prompt_tokens, a.completion_tokens + b.completion_tokens
    )


_SUMS = (
    func.count(),
    func.sum(func.coalesce(DbMessage.prompt_tokens, 0)),
    func.sum(func.coalesce(DbMessage.generated_tokens, 0)),
)


@router.get("", response_model=UsageRead, responses=AUTH)
async def usage(caller: ApiCaller, session: SessionDep) -> UsageRead:
    """Generations (chat answers, completions, embeddings) and their tokens, per API key and in total."""
    user_id = caller.user.id
    queued = DbMessage.enqueued_at.is_not(None)
    per_key = {
        key_id: _totals(*sums)
        for key_id, *sums in (
            await session.exec(
                select(DbMessage.api_key_id, *_SUMS)
                .where(DbMessage.user_id == user_id, queued)
                .group_by(DbMessage.api_key_id)
            )
        ).all()
    }
    recorded = (
        await session.exec(
            select(
                DbUsageRecord.api_key_id,
                func.count(),
                func.sum(DbUsageRecord.prompt_tokens),
                func.sum(DbUsageRecord.generated_tokens),
            )
            .where(DbUsageRecord.user_id == user_id)
            .group_by(DbUsageRecord.api_key_id)
        )
    ).all()
    for key_id, *sums in recorded:  # generations of deleted chats (usage_records.py)
        per_key[key_id] = _add(per_key.get(key_id, UsageTotals()), _totals(*sums))
    chat_row = (
        await session.exec(
            select(*_SUMS)
            .select_from(DbMessage)
            .join(DbChat, DbChat.id == DbMessage.chat_id)
            .where(DbChat.user_id == user_id, DbMessage.user_id.is_(None), queued)
        )
    ).one()
    without_key = _add(per_key.pop(None, UsageTotals()), _totals(*chat_row))
    keys = (
        await session.exec(select(DbApiKey).where(DbApiKey.user_id == user_id).order_by(DbApiKey.created_at))
    ).scalars()
    api_keys = [
        ApiKeyUsage(
            api_key_id=k.id,
            name=k.name,
            prefix=k.prefix,
            revoked=k.revoked_at is not None,
            **per_key.get(k.id, UsageTotals()).model_dump(),
        )
        for k in keys
    ]
    total = without_key
    for key_usage in api_keys:
        total = _add(total, UsageTotals(**key_usage.model_dump(include=set(UsageTotals.model_fields))))
    return UsageRead(total=total, api_keys=api_keys, without_api_key=without_key)


def _request_read(m: DbMessage) -> ApiRequestRead:
    return ApiRequestRead(
        id=m.id,
        kind=m.kind,
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
    query = select(DbMessage).where(DbMessage.user_id == caller.user.id, DbMessage.kind.in_(API_KINDS))
    if api_key_id is not None:
        query = query.where(DbMessage.api_key_id == api_key_id)
    rows = (await session.exec(query.order_by(DbMessage.created_at.desc()).limit(limit))).scalars()
    return ListApiRequestsResponse(requests=[_request_read(m) for m in rows])


@router.get(
    "/requests/{request_id}",
    response_model=ApiRequestRead,
    responses={**AUTH, 404: error("No such request for this user")},
)
async def get_request(request_id: str, caller: ApiCaller, session: SessionDep) -> ApiRequestRead:
    """One API request by its id (the ``X-Request-Id`` header, or a completion id without its prefix)."""
    request_id = request_id.removeprefix("chatcmpl-").removeprefix("cmpl-")
    message = await session.get(DbMessage, request_id)
    if message is None or message.user_id != caller.user.id or message.kind not in API_KINDS:
        raise not_found("request")
    return _request_read(message)
