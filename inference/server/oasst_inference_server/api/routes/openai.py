"""The OpenAI-compatible API: ``/v1/models``, ``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``.

Authenticate with a user's API key (``Authorization: Bearer oak-...``) or access token. Errors have
OpenAI's shape and status codes (see :mod:`oasst_inference_server.api.error_handlers`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import ValidationError

from oasst_inference_server.admission.capabilities import check_capabilities
from oasst_inference_server.admission.output_schemas import check_output_schemas
from oasst_inference_server.admission.request_bounds import check_chat_completion_bounds
from oasst_inference_server.api.deps import ApiCaller, OpenAIServiceDep, SessionDep, SettingsDep
from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.dispatch.worker_registry import LiveModel
from oasst_inference_server.domain_errors import GenerationFailed, InvalidRequest, NotFound
from oasst_inference_server.errors import ApiError
from oasst_inference_server.openai_api.openai_service import ClientGone, OpenAIService
from oasst_inference_server.openai_api.openai_streams import (
    ChatChunks,
    CompletionChunks,
    OpenAIStreamResponse,
    stream_answer,
    stream_choices,
)
from oasst_inference_server.settings import Settings
from oasst_shared.logprobs import TokenLogprob
from oasst_shared.openai_schemas import (
    AssistantMessage,
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChoiceLogprobs,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionResponse,
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    UsageInfo,
    encode_embedding_base64,
    openai_finish_reason,
)
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schemas import MessageRead

router = APIRouter(prefix="/v1", tags=["openai"])

_STARTED = int(time.time())
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid or unsupported parameters"},
    401: {"model": ErrorResponse, "description": "Missing, invalid or revoked API key"},
    404: {"model": ErrorResponse, "description": "Unknown model"},
    413: {"model": ErrorResponse, "description": "The work would be over the worker frame limit"},
    429: {"model": ErrorResponse, "description": "Rate limit or concurrency limit (see Retry-After)"},
    500: {"model": ErrorResponse, "description": "The generation failed"},
    503: {"model": ErrorResponse, "description": "No worker serves the model right now"},
}
_STREAM = {"content": {"text/event-stream": {}}, "description": "With stream=true: server-sent chunks"}


def _card(model: LiveModel) -> ModelCard:
    return ModelCard(
        id=model.config.name,
        created=_STARTED,
        context_length=model.config.max_total_length,
        max_input_length=model.config.max_input_length,
        kind=model.config.kind,
        worker_count=model.worker_count,
    )


@router.get("/models", response_model=ModelList, responses={401: _ERRORS[401]})
async def list_models(caller: ApiCaller, service: OpenAIServiceDep) -> ModelList:
    """The models at least one connected worker serves now, with their context length."""
    live = await service.live_models()
    return ModelList(data=[_card(m) for _, m in sorted(live.items())])


@router.get(
    "/models/{model:path}", response_model=ModelCard, responses={401: _ERRORS[401], 404: _ERRORS[404]}
)
async def retrieve_model(model: str, caller: ApiCaller, service: OpenAIServiceDep) -> ModelCard:
    live = await service.live_models(wanted=model)
    if model not in live:
        available = ", ".join(sorted(live)) or "none"
        raise NotFound("model_not_found", f"the model {model!r} does not exist; available: {available}")
    return _card(live[model])


def _sampling(body: ChatCompletionRequest | CompletionRequest, model: LiveModel) -> SamplingParameters:
    try:
        return body.to_sampling_parameters(default_max_tokens=model.config.max_total_length)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequest("invalid_value", f"{param}: {first['msg']}", param=param) from None


def _check_capabilities(
    body: ChatCompletionRequest | CompletionRequest, sampling: SamplingParameters, model: LiveModel
) -> None:
    """400, naming the parameter, when some worker of the model cannot honour the request."""
    param = "top_logprobs" if isinstance(body, ChatCompletionRequest) else "logprobs"
    tool_schemas = (
        {f"tools[{i}].function.parameters": t.function.parameters for i, t in enumerate(body.tools or [])}
        if isinstance(body, ChatCompletionRequest) and body.tool_choice not in (None, "none", "auto")
        else {}
    )
    check_capabilities(
        sampling, model, body.required_capabilities(), top_logprobs_param=param, tool_schemas=tool_schemas
    )


async def _answer(
    service: OpenAIService, message: DbMessage, request: Request, logprobs: list[TokenLogprob] | None = None
) -> MessageRead:
    try:
        return await service.wait(message, request.is_disconnected, logprobs)
    except ClientGone:
        raise ApiError(499, "client_closed_request", "the client closed the connection") from None


async def _answers(
    service: OpenAIService, messages: list[DbMessage], request: Request, logprobs: bool
) -> list[tuple[MessageRead, list[TokenLogprob] | None]]:
    """Every message's answer (and logprobs), waited for together; the first failure cancels the rest."""
    results: list[tuple[MessageRead, list[TokenLogprob] | None] | None] = [None] * len(messages)

    async def one(index: int, message: DbMessage) -> None:
        collected: list[TokenLogprob] | None = [] if logprobs else None
        results[index] = (await _answer(service, message, request, collected), collected)

    tasks = [asyncio.ensure_future(one(index, message)) for index, message in enumerate(messages)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()  # after a failure: the other choices stop (their waits cancel their jobs)
        await asyncio.gather(*tasks, return_exceptions=True)
    return [r for r in results if r is not None]


def _chat_choice(index: int, final: MessageRead, logprobs: list[TokenLogprob] | None) -> ChatCompletionChoice:
    calls = final.tool_calls
    return ChatCompletionChoice(
        index=index,
        message=AssistantMessage(content=None if calls else final.content or "", tool_calls=calls),
        finish_reason=openai_finish_reason(final.finish_reason, bool(calls)),
        logprobs=(ChoiceLogprobs(content=logprobs) if logprobs is not None else None),
    )


def _completion_choice(
    index: int, final: MessageRead, logprobs: list[TokenLogprob] | None
) -> CompletionChoice:
    return CompletionChoice(
        index=index,
        text=final.content or "",
        finish_reason=openai_finish_reason(final.finish_reason),
        logprobs=(CompletionLogprobs.of(logprobs) if logprobs is not None else None),
    )


def _sampling_of_choice(sampling: SamplingParameters, index: int) -> SamplingParameters:
    # Several choices with one seed would be the same answer n times: each gets its own seed.
    if index == 0 or sampling.seed is None:
        return sampling
    return sampling.model_copy(update={"seed": (sampling.seed + index) % 2**64})


async def _generate(
    request: Request,
    response: Response,
    body: ChatCompletionRequest | CompletionRequest,
    caller: Caller,
    session: SessionDep,
    settings: Settings,
    service: OpenAIService,
) -> Any:
    """Both generation endpoints: queue the request (one job per choice), then stream its chunks or
    answer when done."""
    chat = isinstance(body, ChatCompletionRequest)
    if isinstance(body, ChatCompletionRequest):
        check_chat_completion_bounds(settings, body)
    model = await service.resolve_model(body.model, "generation")
    sampling = _sampling(body, model)
    if isinstance(body, ChatCompletionRequest):
        await check_output_schemas(sampling, tools=body.tools, tool_choice=body.tool_choice)
    else:
        await check_output_schemas(sampling)
    _check_capabilities(body, sampling, model)
    # One job per choice, admitted together: the limits count all of them.
    choices = [_sampling_of_choice(sampling, index) for index in range(body.choices)]
    if isinstance(body, ChatCompletionRequest):
        system_prompt, thread = body.to_thread()
        tools = body.tools if body.tools else None
        messages = await service.submit_chat(
            session, caller, model, choices, system_prompt, thread, tools, body.tool_choice
        )
    else:
        messages = await service.submit_completion(session, caller, model, choices, body.prompt_text)
    await session.close()  # do not hold a database connection while the answer is generated
    message = messages[0]
    completion_id = f"{'chatcmpl' if chat else 'cmpl'}-{message.id}"
    created, name = int(message.created_at.timestamp()), model.config.name
    if body.stream:
        make = ChatChunks if chat else CompletionChunks
        headers = {"X-Request-Id": ",".join(m.id for m in messages)}
        if len(messages) > 1:
            choices = stream_choices(
                service,
                messages,
                [make(completion_id, created, name, index) for index in range(len(messages))],
                include_usage=body.include_usage,
                is_disconnected=request.is_disconnected,
            )
            return OpenAIStreamResponse(choices, headers=headers)
        stream = stream_answer(
            service,
            message,
            make(completion_id, created, name),
            include_usage=body.include_usage,
            is_disconnected=request.is_disconnected,
        )
        return OpenAIStreamResponse(stream, headers=headers)
    answers = await _answers(service, messages, request, body.wants_logprobs()[0])
    response.headers["X-Request-Id"] = ",".join(m.id for m in messages)
    # Each choice is a job of its own, whose prompt was processed too: usage counts every one.
    usage = UsageInfo.of(
        sum(final.prompt_tokens or 0 for final, _ in answers),
        sum(final.generated_tokens or 0 for final, _ in answers),
    )
    if chat:
        return ChatCompletionResponse(
            id=completion_id,
            created=created,
            model=name,
            choices=[_chat_choice(i, final, lp) for i, (final, lp) in enumerate(answers)],
            usage=usage,
        )
    return CompletionResponse(
        id=completion_id,
        created=created,
        model=name,
        choices=[_completion_choice(i, final, lp) for i, (final, lp) in enumerate(answers)],
        usage=usage,
    )


@router.post("/chat/completions", response_model=ChatCompletionResponse, responses={**_ERRORS, 200: _STREAM})
async def chat_completions(
    request: Request,
    response: Response,
    body: ChatCompletionRequest,
    caller: ApiCaller,
    session: SessionDep,
    settings: SettingsDep,
    service: OpenAIServiceDep,
) -> Any:
    """Answer a conversation (system, user and assistant messages); ``stream`` for server-sent chunks."""
    return await _generate(request, response, body, caller, session, settings, service)


@router.post("/completions", response_model=CompletionResponse, responses={**_ERRORS, 200: _STREAM})
async def completions(
    request: Request,
    response: Response,
    body: CompletionRequest,
    caller: ApiCaller,
    session: SessionDep,
    settings: SettingsDep,
    service: OpenAIServiceDep,
) -> Any:
    """Continue a raw prompt (no chat template); ``stream`` for server-sent chunks."""
    return await _generate(request, response, body, caller, session, settings, service)


@router.post("/embeddings", response_model=EmbeddingResponse, responses=_ERRORS)
async def embeddings(
    request: Request,
    response: Response,
    body: EmbeddingRequest,
    caller: ApiCaller,
    session: SessionDep,
    service: OpenAIServiceDep,
) -> EmbeddingResponse:
    """Embed each input with an embedding model's workers (one vector per input, in input order)."""
    model = await service.resolve_model(body.model, "embedding")
    inputs = body.inputs
    message = await service.submit_embedding(session, caller, model, inputs)
    await session.close()
    try:
        await _answer(service, message, request)
        vectors, prompt_tokens = await service.embeddings_of(message)
    finally:
        await service.settle(message, finished=True)  # the vectors are read: erase them
    if len(vectors) != len(inputs):
        raise GenerationFailed(
            "embeddings_mismatch", f"the worker returned {len(vectors)} vectors for {len(inputs)} inputs"
        )
    response.headers["X-Request-Id"] = message.id
    return EmbeddingResponse(
        data=[
            EmbeddingData(
                index=i, embedding=encode_embedding_base64(v) if body.encoding_format == "base64" else v
            )
            for i, v in enumerate(vectors)
        ],
        model=model.config.name,
        usage=UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
    )
