"""The HTTP API: text-generation-inference's routes over the llama.cpp model."""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

import llama_cpp
import pydantic
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from loguru import logger
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from oasst_cpu_backend.metrics import BackendMetrics
from oasst_cpu_backend.model import GenerationJob, GenerationResult, ModelEngine, Step
from oasst_cpu_backend.responses import (
    EventStreamResponse,
    error_response,
    sse_data,
    sse_error,
    wait_for_disconnect,
)
from oasst_cpu_backend.scheduler import OverloadedError, Scheduler, ShuttingDownError, Ticket
from oasst_cpu_backend.schemas import (
    Details,
    ErrorType,
    GenerateRequest,
    GenerateResponse,
    Info,
    InputToken,
    SimpleToken,
    StreamDetails,
    StreamResponse,
    Token,
    TokenizeRequest,
)
from oasst_cpu_backend.settings import Settings
from oasst_cpu_backend.validation import InvalidRequest, Limits, build_job, check_parameters, grammar_to_gbnf

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


def package_version() -> str:
    try:
        return version("oasst-inference-worker")
    except PackageNotFoundError:
        return "0.0.0"


@dataclass
class Backend:
    settings: Settings
    engine: ModelEngine
    scheduler: Scheduler
    metrics: BackendMetrics
    limits: Limits
    info: Info


def _build_info(settings: Settings, engine: ModelEngine, limits: Limits) -> Info:
    metadata = engine.metadata
    return Info(
        model_id=settings.model_id,
        model_dtype=f"gguf:{engine.model_path.name}",
        max_concurrent_requests=settings.max_concurrent_requests,
        max_stop_sequences=limits.max_stop_sequences,
        max_input_length=limits.max_input_length,
        max_input_tokens=limits.max_input_length,
        max_total_tokens=limits.n_ctx,
        max_top_n_tokens=limits.max_top_n_tokens,
        version=package_version(),
        llama_cpp_version=llama_cpp.__version__,
        chat_template=metadata.get("tokenizer.chat_template"),
        bos_token=engine.special_token_text("tokenizer.ggml.bos_token_id"),
        eos_token=engine.special_token_text("tokenizer.ggml.eos_token_id"),
        add_bos_token=metadata.get("tokenizer.ggml.add_bos_token", "false").lower() == "true",
    )


def _load_engine(settings: Settings) -> ModelEngine:
    return ModelEngine(
        settings.resolved_model_path(),
        n_ctx=settings.n_ctx,
        n_threads=settings.n_threads,
        n_batch=settings.n_batch,
        prefill_chunk_tokens=settings.prefill_chunk_tokens,
        prefix_cache=settings.prefix_cache,
    )


def create_app(settings: Settings | None = None, engine: ModelEngine | None = None) -> FastAPI:
    """Build the app; the model is loaded in the lifespan unless an engine is given."""
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = engine is None
        model: ModelEngine = engine if engine is not None else await asyncio.to_thread(_load_engine, settings)
        limits = Limits(
            n_ctx=model.n_ctx,
            max_input_length=min(settings.effective_max_input_length, model.n_ctx - 1),
            max_stop_sequences=settings.max_stop_sequences,
            max_top_n_tokens=settings.max_top_n_tokens,
        )
        metrics = BackendMetrics()
        scheduler = Scheduler(model, metrics, settings.max_concurrent_requests)
        app.state.loop = asyncio.get_running_loop()
        app.state.backend = Backend(
            settings, model, scheduler, metrics, limits, _build_info(settings, model, limits)
        )
        logger.info("ready to serve {} (context {} tokens)", settings.model_id, model.n_ctx)
        try:
            yield
        finally:
            logger.info("shutting down: stopping generations")
            await asyncio.to_thread(scheduler.shutdown)
            if owned:
                model.close()
            logger.info("shut down")

    app = FastAPI(title="oasst CPU backend (TGI-compatible)", version=package_version(), lifespan=lifespan)
    _install_error_handlers(app)
    _install_routes(app)
    return app


def begin_shutdown(app: FastAPI) -> None:
    """End in-flight generations with an error their clients understand and refuse new ones.

    Meant for the server's signal handler (any thread): uvicorn would otherwise keep streaming until its
    graceful-shutdown timeout and then cut the connections.
    """
    backend: Backend | None = getattr(app.state, "backend", None)
    loop: asyncio.AbstractEventLoop | None = getattr(app.state, "loop", None)
    if backend is not None and loop is not None and not loop.is_closed():
        loop.call_soon_threadsafe(backend.scheduler.stop_accepting)


def _backend(request: Request) -> Backend:
    backend: Backend = request.app.state.backend
    return backend


def _install_error_handlers(app: FastAPI) -> None:
    async def invalid(request: Request, exc: Exception) -> Response:
        backend = getattr(request.app.state, "backend", None)
        if backend is not None:
            backend.metrics.requests.labels(outcome="validation_error").inc()
        return error_response(str(exc), "validation")

    async def overloaded(request: Request, exc: Exception) -> Response:
        status = 503 if isinstance(exc, ShuttingDownError) else 429
        return error_response(str(exc), "overloaded", status, headers={"Retry-After": "1"})

    async def fastapi_validation(request: Request, exc: Exception) -> Response:
        return error_response(f"Input validation error: {exc}", "validation")

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code, headers=exc.headers)

    async def unexpected(request: Request, exc: Exception) -> Response:
        logger.opt(exception=exc).error("unexpected error on {} {}", request.method, request.url.path)
        return error_response(f"internal error: {type(exc).__name__}", "generation", status_code=500)

    app.add_exception_handler(InvalidRequest, invalid)
    app.add_exception_handler(OverloadedError, overloaded)
    app.add_exception_handler(RequestValidationError, fastapi_validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


async def _parse_body(request: Request, model: type[ModelT]) -> ModelT:
    limit = _backend(request).settings.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise InvalidRequest(f"Input validation error: the request body exceeds {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise InvalidRequest(f"Input validation error: the request body exceeds {limit} bytes")
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'body'}: {problem['msg']}"
            for problem in error.errors(include_url=False)
        )
        raise InvalidRequest(f"Input validation error: {problems}") from error


async def _prepare(backend: Backend, body: GenerateRequest, *, stream: bool, arrived: float) -> GenerationJob:
    params = body.parameters
    check_parameters(params, backend.limits, stream=stream)
    if not body.inputs:
        raise InvalidRequest("`inputs` cannot be empty")
    gbnf = grammar_to_gbnf(params)
    # Off the event loop: a long input takes a noticeable time to tokenize.
    tokens = await asyncio.to_thread(backend.engine.tokenize, body.inputs)
    return build_job(
        params,
        tokens,
        backend.limits,
        gbnf=gbnf,
        enqueued_at=arrived,
        queue_deadline=arrived + backend.settings.queue_timeout,
        deadline=arrived + backend.settings.request_timeout,
    )


def _token(step: Step) -> Token:
    token = step.token
    return Token(id=token.id, text=token.text, logprob=token.logprob, special=token.special)


def _top_tokens(step: Step) -> list[Token] | None:
    if step.top_tokens is None:
        return None
    return [Token(id=t.id, text=t.text, logprob=t.logprob, special=t.special) for t in step.top_tokens]


def _generated_text(body: GenerateRequest, text: str) -> str:
    return body.inputs + text if body.parameters.return_full_text else text


def _failure(backend: Backend, result: GenerationResult, ticket: Ticket) -> tuple[str, ErrorType]:
    """The error message and type for a generation that did not finish."""
    timeout = backend.settings.request_timeout
    if result.status == "queue_timeout":
        return _queue_timeout_message(backend), "overloaded"
    if result.status == "timeout":
        return (
            f"Request failed during generation: request_timeout ({timeout:g}s) reached after "
            f"{result.generated_tokens} tokens",
            "incomplete_generation",
        )
    return f"Request failed during generation: {ticket.cancel_reason or 'cancelled'}", "incomplete_generation"


def _queue_timeout_message(backend: Backend) -> str:
    return f"Model is overloaded: no free slot within queue_timeout ({backend.settings.queue_timeout:g}s)"


async def _await_result(request: Request, ticket: Ticket, queue_deadline: float) -> GenerationResult | None:
    """Wait for a non-streamed generation; None if it never ran (dropped from the queue).

    The client going away cancels the generation: the text-generation client gives up after its timeout,
    and nobody would read the answer. Raises what the generation raised.
    """
    watcher = asyncio.ensure_future(wait_for_disconnect(request.receive))
    try:
        while not ticket.future.done():
            timeout = None if ticket.started.is_set() else max(0.0, queue_deadline - time.monotonic())
            done, _ = await asyncio.wait(
                {ticket.future, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            if ticket.future in done:
                break
            if watcher in done:
                ticket.cancel("client disconnected")
            elif not ticket.started.is_set():
                ticket.expire()
            else:
                continue
            # Within one token (or at once if it was still queued).
            await asyncio.wait({ticket.future})
    finally:
        watcher.cancel()
    if ticket.future.cancelled():
        return None
    return ticket.future.result()


def _install_routes(app: FastAPI) -> None:
    async def generate_once(request: Request, body: GenerateRequest) -> Response | GenerateResponse:
        backend = _backend(request)
        arrived = time.monotonic()
        job = await _prepare(backend, body, stream=False, arrived=arrived)
        ticket = backend.scheduler.submit(job, stream=False)
        try:
            result = await _await_result(request, ticket, job.queue_deadline)
        except Exception as error:
            return error_response(f"Request failed during generation: {error}", "generation")
        if result is None:
            if ticket.expired:
                return error_response(_queue_timeout_message(backend), "overloaded", 503)
            reason = ticket.cancel_reason or "cancelled"
            return error_response(f"Request failed during generation: {reason}", "incomplete_generation")
        if result.summary is None:
            message, error_type = _failure(backend, result, ticket)
            status = 503 if error_type == "overloaded" else None
            return error_response(message, error_type, status)
        params = body.parameters
        details = None
        if params.details:
            prefill: list[InputToken] = []
            if params.decoder_input_details:
                # Prompt logprobs would need logits for every prompt position (n_ctx x vocab floats);
                # the ids and texts are given, the logprobs are null.
                texts = backend.engine.prompt_token_texts(job.prompt_tokens)
                prefill = [InputToken(id=i, text=t) for i, t in zip(job.prompt_tokens, texts, strict=True)]
            top = [_top_tokens(step) or [] for step in result.steps] if job.top_n_tokens else None
            details = Details(
                finish_reason=result.summary.finish_reason,
                generated_tokens=result.summary.generated_tokens,
                seed=result.summary.seed,
                prefill=prefill,
                tokens=[_token(step) for step in result.steps],
                top_tokens=top,
            )
        return GenerateResponse(
            generated_text=_generated_text(body, result.summary.generated_text), details=details
        )

    def _dump(response: GenerateResponse) -> dict[str, Any]:
        # TGI leaves "details" out when it was not asked for.
        return response.model_dump(exclude_none=response.details is None)

    async def events(backend: Backend, body: GenerateRequest, ticket: Ticket) -> AsyncIterator[bytes]:
        steps = ticket.steps
        assert steps is not None
        index = 0
        while True:
            waiting = not ticket.started.is_set() and not ticket.is_cancelled()
            timeout = max(0.0, ticket.job.queue_deadline - time.monotonic()) if waiting else None
            try:
                step = await asyncio.wait_for(steps.get(), timeout)
            except TimeoutError:
                if not ticket.started.is_set():
                    # Ends the ticket at once; its end marker then reaches this loop.
                    ticket.expire()
                continue
            if step is None:
                break
            index += 1
            summary = step.summary
            yield sse_data(
                StreamResponse(
                    index=index,
                    token=_token(step),
                    top_tokens=_top_tokens(step),
                    generated_text=_generated_text(body, summary.generated_text) if summary else None,
                    details=(
                        StreamDetails(
                            finish_reason=summary.finish_reason,
                            generated_tokens=summary.generated_tokens,
                            seed=summary.seed,
                        )
                        if summary
                        else None
                    ),
                ).model_dump_json()
            )
        future = ticket.future
        if future.cancelled():
            if ticket.expired:
                yield sse_error(_queue_timeout_message(backend), "overloaded")
            else:
                reason = ticket.cancel_reason or "cancelled"
                yield sse_error(f"Request failed during generation: {reason}", "incomplete_generation")
            return
        error = future.exception()
        if error is not None:
            yield sse_error(f"Request failed during generation: {error}", "generation")
            return
        result = future.result()
        if result.summary is None:
            message, error_type = _failure(backend, result, ticket)
            yield sse_error(message, error_type)

    async def stream_response(request: Request, body: GenerateRequest) -> Response:
        backend = _backend(request)
        job = await _prepare(backend, body, stream=True, arrived=time.monotonic())
        ticket = backend.scheduler.submit(job, stream=True)

        def on_disconnect() -> None:
            if not ticket.future.done():
                ticket.cancel("client disconnected")

        return EventStreamResponse(events(backend, body, ticket), on_disconnect)

    @app.post("/", summary="TGI compatible: generate (a JSON list) or stream (server-sent events)")
    async def compat(request: Request) -> Response:
        body = await _parse_body(request, GenerateRequest)
        if body.stream:
            return await stream_response(request, body)
        result = await generate_once(request, body)
        if isinstance(result, Response):
            return result
        return JSONResponse([_dump(result)])

    @app.post("/generate", summary="Generate text (one JSON object)")
    async def generate(request: Request) -> Response:
        body = await _parse_body(request, GenerateRequest)
        result = await generate_once(request, body)
        if isinstance(result, Response):
            return result
        return JSONResponse(_dump(result))

    @app.post("/generate_stream", summary="Generate text as server-sent events, one per token")
    async def generate_stream(request: Request) -> Response:
        body = await _parse_body(request, GenerateRequest)
        return await stream_response(request, body)

    @app.get("/info", summary="Model and limits, plus chat_template, bos_token and eos_token")
    async def info(request: Request) -> Info:
        return _backend(request).info

    @app.get("/health", summary="200 once the model is loaded")
    async def health(request: Request) -> Response:
        backend = getattr(request.app.state, "backend", None)
        if backend is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok", "model_id": backend.settings.model_id})

    @app.post("/tokenize", summary="Tokens of the input with their character offsets")
    async def tokenize(request: Request) -> list[SimpleToken]:
        backend = _backend(request)
        body = await _parse_body(request, TokenizeRequest)
        return await asyncio.to_thread(_tokenize, backend.engine, body.inputs)

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics(request: Request) -> Response:
        return Response(_backend(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


def _tokenize(engine: ModelEngine, text: str) -> list[SimpleToken]:
    """Tokens with [start, stop) character offsets into text (a token may cover part of a character)."""
    boundaries = [0]
    for char in text:
        boundaries.append(boundaries[-1] + len(char.encode("utf-8")))
    tokens: list[SimpleToken] = []
    position = 0
    for token_id in engine.tokenize(text):
        piece = engine.token_bytes(token_id)
        begin, position = position, position + len(piece)
        start = min(bisect.bisect_right(boundaries, begin) - 1, len(text))
        stop = min(bisect.bisect_left(boundaries, position), len(text))
        tokens.append(SimpleToken(id=token_id, text=text[start:stop], start=start, stop=stop))
    return tokens
