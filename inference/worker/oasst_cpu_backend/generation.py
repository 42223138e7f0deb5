"""Generations over HTTP: a request body to an engine request, the scheduler's ticket to a TGI answer (one
JSON document, or server-sent events, one per token), and the error a generation that did not finish
ends with."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import Response

from oasst_cpu_backend.grammar import request_grammar
from oasst_cpu_backend.records import EngineRequest, EngineResult, Step, TokenOut
from oasst_cpu_backend.responses import (
    EventStreamResponse,
    error_response,
    sse_data,
    sse_error,
    wait_for_disconnect,
)
from oasst_cpu_backend.scheduler import Ticket
from oasst_cpu_backend.schemas import (
    Details,
    ErrorType,
    GenerateRequest,
    GenerateResponse,
    InputToken,
    StreamDetails,
    StreamResponse,
    Token,
)
from oasst_cpu_backend.state import ServingState, serving_state
from oasst_cpu_backend.validation import InvalidRequest, build_request, check_parameters
from oasst_shared.protocol import ANSWER_START_HEADER


async def _prepare(
    serving: ServingState, body: GenerateRequest, request: Request, *, stream: bool, arrived: float
) -> EngineRequest:
    params = body.parameters
    check_parameters(params, serving.limits, stream=stream)
    if not body.inputs:
        raise InvalidRequest("`inputs` cannot be empty")
    answer_chars = _answer_start(request, body.inputs)
    gbnf = await request_grammar(params, serving.engine.vocab, serving.settings.grammar_timeout)
    # Off the event loop: a long input takes a noticeable time to tokenize.
    tokens = await asyncio.to_thread(serving.engine.tokenize, body.inputs)
    answer_start = None
    if answer_chars is not None:
        head = await asyncio.to_thread(serving.engine.tokenize, body.inputs[:answer_chars])
        # Only where the tokens of the text before the answer are those the whole input starts with.
        answer_start = len(head) if tokens[: len(head)] == head else None
    return build_request(
        params,
        tokens,
        serving.limits,
        answer_start=answer_start,
        answer_text=body.inputs[answer_chars:] if answer_start is not None else "",
        gbnf=gbnf,
        enqueued_at=arrived,
        queue_deadline=arrived + serving.settings.queue_timeout,
        deadline=arrived + serving.settings.request_timeout,
    )


def _answer_start(request: Request, inputs: str) -> int | None:
    """The character index of a continued answer's start in ``inputs`` (an extension TGI does not have:
    those tokens are evaluated as generated tokens were, so a greedy answer continues exactly)."""
    raw = request.headers.get(ANSWER_START_HEADER)
    if raw is None:
        return None
    if len(raw) > 12 or not (raw.isascii() and raw.isdigit()) or not 0 < int(raw) < len(inputs):
        raise InvalidRequest(f"`{ANSWER_START_HEADER}` must be a character index inside `inputs`")
    return int(raw)


def _tgi_token(token: TokenOut) -> Token:
    return Token(id=token.id, text=token.text, logprob=token.logprob, special=token.special)


def _token(step: Step) -> Token:
    return _tgi_token(step.token)


def _top_tokens(step: Step) -> list[Token] | None:
    return None if step.top_tokens is None else [_tgi_token(t) for t in step.top_tokens]


def _generated_text(body: GenerateRequest, text: str) -> str:
    return body.inputs + text if body.parameters.return_full_text else text


def _failure(serving: ServingState, result: EngineResult, ticket: Ticket) -> tuple[str, ErrorType]:
    """The error message and type for a generation that did not finish."""
    timeout = serving.settings.request_timeout
    if result.status == "queue_timeout":
        return _queue_timeout_message(serving), "overloaded"
    if result.status == "timeout":
        return (
            f"Request failed during generation: request_timeout ({timeout:g}s) reached after "
            f"{result.generated_tokens} tokens",
            "incomplete_generation",
        )
    return f"Request failed during generation: {ticket.cancel_reason or 'cancelled'}", "incomplete_generation"


def _queue_timeout_message(serving: ServingState) -> str:
    return f"Model is overloaded: no free slot within queue_timeout ({serving.settings.queue_timeout:g}s)"


async def _await_result(request: Request, ticket: Ticket, queue_deadline: float) -> EngineResult | None:
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


async def generate_once(request: Request, body: GenerateRequest) -> Response | GenerateResponse:
    serving = serving_state(request)
    arrived = time.monotonic()
    job = await _prepare(serving, body, request, stream=False, arrived=arrived)
    ticket = serving.scheduler.submit(job, stream=False)
    try:
        result = await _await_result(request, ticket, job.queue_deadline)
    except Exception as error:
        return error_response(f"Request failed during generation: {error}", "generation")
    if result is None:
        if ticket.expired:
            return error_response(_queue_timeout_message(serving), "overloaded", 503)
        reason = ticket.cancel_reason or "cancelled"
        return error_response(f"Request failed during generation: {reason}", "incomplete_generation")
    if result.summary is None:
        message, error_type = _failure(serving, result, ticket)
        status = 503 if error_type == "overloaded" else None
        return error_response(message, error_type, status)
    params = body.parameters
    details = None
    if params.details:
        prefill: list[InputToken] = []
        if params.decoder_input_details:
            # Prompt logprobs would need logits for every prompt position (n_ctx x vocab floats);
            # the ids and texts are given, the logprobs are null.
            texts = serving.engine.prompt_token_texts(job.prompt_tokens)
            prefill = [InputToken(id=i, text=t) for i, t in zip(job.prompt_tokens, texts, strict=True)]
        top = [_top_tokens(step) or [] for step in result.steps] if job.top_n_tokens else None
        details = Details(
            finish_reason=result.summary.finish_reason,
            generated_tokens=result.summary.generated_tokens,
            seed=result.summary.seed,
            prefill=prefill,
            cached_tokens=result.summary.cached_tokens,
            tokens=[_token(step) for step in result.steps],
            top_tokens=top,
        )
    return GenerateResponse(
        generated_text=_generated_text(body, result.summary.generated_text), details=details
    )


async def _events(serving: ServingState, body: GenerateRequest, ticket: Ticket) -> AsyncIterator[bytes]:
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
                        cached_tokens=summary.cached_tokens,
                    )
                    if summary
                    else None
                ),
            ).model_dump_json()
        )
    future = ticket.future
    if future.cancelled():
        if ticket.expired:
            yield sse_error(_queue_timeout_message(serving), "overloaded")
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
        message, error_type = _failure(serving, result, ticket)
        yield sse_error(message, error_type)


async def stream_response(request: Request, body: GenerateRequest) -> Response:
    serving = serving_state(request)
    job = await _prepare(serving, body, request, stream=True, arrived=time.monotonic())
    ticket = serving.scheduler.submit(job, stream=True)

    def on_disconnect() -> None:
        if not ticket.future.done():
            ticket.cancel("client disconnected")

    return EventStreamResponse(_events(serving, body, ticket), on_disconnect)
