"""The HTTP routes: text-generation-inference's API over the engine, plus /tokenize, /detokenize and
/metrics."""

from __future__ import annotations

import asyncio
import bisect
from typing import Any, TypeVar

import pydantic
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.generation import generate_once, stream_response
from oasst_cpu_backend.model_host import ModelHost
from oasst_cpu_backend.schemas import (
    DetokenizeRequest,
    DetokenizeResponse,
    GenerateRequest,
    GenerateResponse,
    Info,
    SimpleToken,
    TokenizeRequest,
)
from oasst_cpu_backend.state import serving_state, serving_state_if_ready
from oasst_cpu_backend.validation import InvalidRequest

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


async def parse_body(request: Request, model: type[ModelT], limit: int | None = None) -> ModelT:
    if limit is None:
        limit = serving_state(request).settings.max_body_bytes
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


def _dump(response: GenerateResponse) -> dict[str, Any]:
    # TGI leaves "details" out when it was not asked for.
    return response.model_dump(exclude_none=response.details is None)


def install_routes(app: FastAPI) -> None:
    @app.post("/", summary="TGI compatible: generate (a JSON list) or stream (server-sent events)")
    async def compat(request: Request) -> Response:
        body = await parse_body(request, GenerateRequest)
        if body.stream:
            return await stream_response(request, body)
        result = await generate_once(request, body)
        if isinstance(result, Response):
            return result
        return JSONResponse([_dump(result)])

    @app.post("/generate", summary="Generate text (one JSON object)")
    async def generate(request: Request) -> Response:
        body = await parse_body(request, GenerateRequest)
        result = await generate_once(request, body)
        if isinstance(result, Response):
            return result
        return JSONResponse(_dump(result))

    @app.post("/generate_stream", summary="Generate text as server-sent events, one per token")
    async def generate_stream(request: Request) -> Response:
        body = await parse_body(request, GenerateRequest)
        return await stream_response(request, body)

    @app.get("/info", summary="Model and limits, plus chat_template, bos_token and eos_token")
    async def info(request: Request) -> Info:
        return serving_state(request).info

    @app.get("/health", summary="200 while a model is served; 503 with what is happening otherwise")
    async def health(request: Request) -> Response:
        serving = serving_state_if_ready(request)
        host: ModelHost | None = getattr(request.app.state, "model_host", None)
        body = host.status.as_json() if host is not None else {"status": "loading"}
        if serving is None:
            return JSONResponse(body, status_code=503)
        scheduler = serving.scheduler
        return JSONResponse(
            {
                **body,
                "model_id": serving.info.model_id,
                "quantization": serving.info.quantization,
                "slots": {"total": scheduler.slots_total, "busy": scheduler.slots_busy},
                "kv_cache_free_tokens": scheduler.kv_free_tokens,
                "kv_budget_tokens": serving.engine.kv_budget_tokens,
            }
        )

    @app.post("/tokenize", summary="Tokens of the input with their character offsets")
    async def tokenize(request: Request) -> list[SimpleToken]:
        engine = serving_state(request).engine
        body = await parse_body(request, TokenizeRequest)
        return await asyncio.to_thread(_tokenize, engine, body.inputs)

    @app.post("/detokenize", summary="The text of token ids (vLLM's shape: tokens -> prompt)")
    async def detokenize(request: Request) -> DetokenizeResponse:
        engine = serving_state(request).engine
        body = await parse_body(request, DetokenizeRequest)
        unknown = next((t for t in body.tokens if not 0 <= t < engine.n_vocab), None)
        if unknown is not None:
            raise InvalidRequest(
                f"Input validation error: token id {unknown} is not in the vocabulary of {engine.n_vocab}"
            )
        return DetokenizeResponse(prompt=await asyncio.to_thread(engine.detokenize, body.tokens))

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics(request: Request) -> Response:
        return Response(serving_state(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


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
