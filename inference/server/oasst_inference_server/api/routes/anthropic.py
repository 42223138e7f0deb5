"""The Anthropic Messages API: ``POST /v1/messages`` and ``POST /v1/messages/count_tokens``.

Authenticate with a user's API key as ``x-api-key`` (what Anthropic's SDKs and Claude Code send) or as
``Authorization: Bearer``; ``anthropic-version`` and ``anthropic-beta`` are accepted and need not be
sent. Errors have Anthropic's shape and status codes (:mod:`oasst_inference_server.anthropic_api.errors`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response

from oasst_inference_server.anthropic_api.schemas import (
    AnthropicErrorResponse,
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
)
from oasst_inference_server.api.deps import AnthropicCaller, AnthropicServingDep, SessionDep
from oasst_inference_server.api.served import respond

router = APIRouter(prefix="/v1", tags=["anthropic"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {
        "model": AnthropicErrorResponse,
        "description": "invalid_request_error: invalid or unsupported parameters",
    },
    401: {
        "model": AnthropicErrorResponse,
        "description": "authentication_error: missing, invalid or revoked API key",
    },
    404: {"model": AnthropicErrorResponse, "description": "not_found_error: unknown model"},
    413: {
        "model": AnthropicErrorResponse,
        "description": "request_too_large: the body or its work is too large",
    },
    429: {
        "model": AnthropicErrorResponse,
        "description": "rate_limit_error: rate or concurrency limit (Retry-After)",
    },
    500: {"model": AnthropicErrorResponse, "description": "api_error: the generation failed"},
    529: {
        "model": AnthropicErrorResponse,
        "description": "overloaded_error: no worker serves the model right now",
    },
}
_STREAM = {"content": {"text/event-stream": {}}, "description": "With stream=true: server-sent events"}
AnthropicVersion = Annotated[
    str | None, Header(alias="anthropic-version", max_length=64, description="Accepted; may be left out.")
]


@router.post("/messages", response_model=MessageResponse, responses={**_ERRORS, 200: _STREAM})
async def create_message(
    request: Request,
    response: Response,
    body: MessagesRequest,
    caller: AnthropicCaller,
    session: SessionDep,
    serving: AnthropicServingDep,
    anthropic_version: AnthropicVersion = None,
) -> Any:
    """Answer a conversation (``system``, user and assistant messages with text, ``tool_use`` and
    ``tool_result`` blocks); ``stream`` for server-sent events."""
    return respond(await serving.create(session, caller, body, request.is_disconnected), response)


@router.post("/messages/count_tokens", response_model=CountTokensResponse, responses=_ERRORS)
async def count_tokens(
    body: CountTokensRequest,
    caller: AnthropicCaller,
    session: SessionDep,
    serving: AnthropicServingDep,
    anthropic_version: AnthropicVersion = None,
) -> CountTokensResponse:
    """The tokens of the prompt the model would read for these messages, system prompt and tools, counted
    with the model's own tokenizer."""
    return await serving.count_tokens(session, caller, body)
