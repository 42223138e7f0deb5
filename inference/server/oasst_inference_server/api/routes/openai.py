"""The OpenAI-compatible API: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

Authenticate with a user's API key (``Authorization: Bearer oak-...``) or access token. Errors have
OpenAI's shape and status codes (see :mod:`oasst_inference_server.api.error_handlers`). Each route is one
call into its serving object (:mod:`oasst_inference_server.openai_api`), its result made an HTTP response
(:func:`oasst_inference_server.api.served.respond`).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request, Response

from oasst_inference_server.api.deps import (
    ApiCaller,
    ChatServingDep,
    CompletionServingDep,
    EmbeddingServingDep,
    ModelServingDep,
    SessionDep,
)
from oasst_inference_server.api.served import EventStreamResponse, respond
from oasst_inference_server.openai_protocol.embeddings import EmbeddingRequest, EmbeddingResponse
from oasst_inference_server.openai_protocol.errors import ErrorResponse
from oasst_inference_server.openai_protocol.generation_requests import (
    ChatCompletionRequest,
    CompletionRequest,
)
from oasst_inference_server.openai_protocol.generation_responses import (
    ChatCompletionResponse,
    CompletionResponse,
)
from oasst_inference_server.openai_protocol.models import ModelCard, ModelList

router = APIRouter(prefix="/v1", tags=["openai"])

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid or unsupported parameters"},
    401: {"model": ErrorResponse, "description": "Missing, invalid or revoked API key"},
    403: {"model": ErrorResponse, "description": "The key may not use the model (its allow-list)"},
    404: {"model": ErrorResponse, "description": "Unknown model"},
    413: {"model": ErrorResponse, "description": "The work would be over the worker frame limit"},
    429: {
        "model": ErrorResponse,
        "description": "Rate, concurrency, tokens-per-minute limit or budget (see Retry-After and the code)",
    },
    500: {"model": ErrorResponse, "description": "The generation failed"},
    503: {"model": ErrorResponse, "description": "No worker serves the model right now"},
}
_STREAM = {"content": {"text/event-stream": {}}, "description": "With stream=true: server-sent chunks"}
_RESUME_ERRORS: dict[int | str, dict[str, Any]] = {
    200: _STREAM,
    400: {"model": ErrorResponse, "description": "A malformed id or Last-Event-ID"},
    401: _ERRORS[401],
    404: {"model": ErrorResponse, "description": "No such stream of yours, or it has expired"},
    429: {"model": ErrorResponse, "description": "Too many event streams open (see Retry-After)"},
}
LastEventId = Annotated[str | None, Header()]


@router.get("/models", response_model=ModelList, responses={401: _ERRORS[401]})
async def list_models(caller: ApiCaller, session: SessionDep, serving: ModelServingDep) -> ModelList:
    """The models at least one connected worker serves now (and the caller may use), with their context
    length."""
    return await serving.list(session, caller)


@router.get(
    "/models/{model:path}", response_model=ModelCard, responses={401: _ERRORS[401], 404: _ERRORS[404]}
)
async def retrieve_model(
    model: str, caller: ApiCaller, session: SessionDep, serving: ModelServingDep
) -> ModelCard:
    return await serving.retrieve(model, session, caller)


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses={**_ERRORS, 200: _STREAM})
async def chat_completions(
    request: Request,
    response: Response,
    body: ChatCompletionRequest,
    caller: ApiCaller,
    session: SessionDep,
    serving: ChatServingDep,
) -> Any:
    """Answer a conversation (system, user and assistant messages); ``stream`` for server-sent chunks."""
    return respond(await serving.create(session, caller, body, request.is_disconnected), response)


@router.post("/completions", response_model=CompletionResponse, responses={**_ERRORS, 200: _STREAM})
async def completions(
    request: Request,
    response: Response,
    body: CompletionRequest,
    caller: ApiCaller,
    session: SessionDep,
    serving: CompletionServingDep,
) -> Any:
    """Continue a raw prompt (no chat template); ``stream`` for server-sent chunks."""
    return respond(await serving.create(session, caller, body, request.is_disconnected), response)


@router.get("/chat/completions/{completion_id}/stream", responses=_RESUME_ERRORS)
async def resume_chat_completion(
    request: Request,
    response: Response,
    completion_id: str,
    caller: ApiCaller,
    serving: ChatServingDep,
    last_event_id: LastEventId = None,
    include_usage: bool = False,
) -> EventStreamResponse:
    """The rest of a streamed chat completion after ``Last-Event-ID`` (every chunk has an id), from any
    replica; the whole stream without it. ``include_usage`` as the request's ``stream_options`` had."""
    resumed = await serving.resume(
        caller,
        completion_id,
        last_event_id=last_event_id,
        include_usage=include_usage,
        is_disconnected=request.is_disconnected,
    )
    return respond(resumed, response)


@router.get("/completions/{completion_id}/stream", responses=_RESUME_ERRORS)
async def resume_completion(
    request: Request,
    response: Response,
    completion_id: str,
    caller: ApiCaller,
    serving: CompletionServingDep,
    last_event_id: LastEventId = None,
    include_usage: bool = False,
) -> EventStreamResponse:
    """As ``GET /v1/chat/completions/{id}/stream``, for a streamed completion."""
    resumed = await serving.resume(
        caller,
        completion_id,
        last_event_id=last_event_id,
        include_usage=include_usage,
        is_disconnected=request.is_disconnected,
    )
    return respond(resumed, response)


@router.post("/embeddings", response_model=EmbeddingResponse, responses=_ERRORS)
async def embeddings(
    request: Request,
    response: Response,
    body: EmbeddingRequest,
    caller: ApiCaller,
    session: SessionDep,
    serving: EmbeddingServingDep,
) -> EmbeddingResponse:
    """Embed each input with an embedding model's workers (one vector per input, in input order)."""
    return respond(await serving.create(session, caller, body, request.is_disconnected), response)
