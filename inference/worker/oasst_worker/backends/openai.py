"""Any OpenAI-compatible server: vLLM, SGLang, the llama.cpp server, llama-cpp-python, TGI's Messages API.

Two modes. ``completions`` streams ``POST /v1/completions`` with the prompt the worker rendered from the
model config's chat template. ``chat`` streams ``POST /v1/chat/completions`` with the conversation and lets
the server apply its own template, for servers that offer only the Messages API.

These servers do not expose their chat template, so in ``completions`` mode a model config should set
``chat_template_source`` to ``"chatml"`` or ``"inline"``; with ``"backend"`` the worker falls back to ChatML.

Sampling fields outside the OpenAI API (``top_k``, ``repetition_penalty``, ``repeat_penalty``,
``typical_p``) are sent only when the request sets them: vLLM, SGLang and the llama.cpp servers read them.

Errors: a refused request (400, 413, 422) is not retryable, since another worker would refuse it too;
everything else (401/403/404: this worker's key or model name, 408, 409, 429, 5xx, connection errors,
stalls, a stream that ends without a finish reason) is.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import aiohttp
import httpx
from loguru import logger
from pydantic import ValidationError

from oasst_shared.logprobs import TokenLogprob, TopLogprob, token_bytes
from oasst_shared.protocol import ChatTurn, FinishReason
from oasst_shared.sampling import SamplingParameters
from oasst_shared.tool_calls import ToolCall, ToolCallFunction, ToolChoice, ToolDefinition, new_tool_call_id
from oasst_worker.backends.deadlines import StepDeadline
from oasst_worker.backends.openai_wire import (
    ChunkChoice,
    ChunkLogprobs,
    ChunkUsage,
    CompletionChunk,
    DetokenizeAnswer,
    ErrorBody,
    ServedModelList,
    TokenizeAnswer,
    ToolCallDelta,
)
from oasst_worker.backends.pooled_session import PooledSession, finish
from oasst_worker.backends.protocols import GenerationBackend, GenerationStream
from oasst_worker.backends.records import BackendError, BackendInfo, GenerationResult, StreamedToken
from oasst_worker.backends.tgi_stream import SseLines

OpenAiMode = Literal["completions", "chat"]
ResponseFormatStyle = Literal["openai", "llama-cpp-python"]

# The request itself is bad: every worker's backend would refuse it.
_NOT_RETRYABLE_STATUS = frozenset({400, 413, 422})
_UNAVAILABLE_STATUS = frozenset({429, 500, 502, 503, 504})
# The streams' connect and header bounds, as httpx's 10 s timeout bounded them (stalls and overruns of a
# generation are timed by us, between tokens, not bytes: servers send keep-alive comments).
_STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=10.0, sock_read=None)
# The servers' tokenizer endpoints, tried in this order; the first that answers is kept.
_TOKENIZE_PROBES: tuple[tuple[str, str], ...] = (
    ("/tokenize", "prompt"),  # vLLM -> {"count", "tokens"}
    ("/tokenize", "content"),  # llama.cpp server -> {"tokens"}
    ("/extras/tokenize/count", "input"),  # llama-cpp-python -> {"count"}
    ("/extras/tokenize", "input"),  # older llama-cpp-python -> {"tokens"}
)
# The endpoints that list the token ids (llama-cpp-python's count endpoint does not).
_TOKEN_IDS_PROBES = tuple(probe for probe in _TOKENIZE_PROBES if probe[0] != "/extras/tokenize/count")
_DETOKENIZE_PROBES: tuple[str, ...] = (
    "/detokenize",  # vLLM -> {"prompt"}, the llama.cpp server -> {"content"}
    "/extras/detokenize",  # llama-cpp-python -> {"text"}
)

T = TypeVar("T")
V = TypeVar("V")
R = TypeVar("R", TokenizeAnswer, DetokenizeAnswer)


def openai_parameters(
    params: SamplingParameters,
    max_new_tokens: int,
    *,
    chat: bool = False,
    response_format_style: ResponseFormatStyle = "openai",
) -> dict[str, Any]:
    """The request fields for our sampling parameters; greedy is ``temperature: 0`` in this API.

    Penalties, ``response_format`` (chat only) and logprobs are passed through: ``logprobs`` with
    ``top_logprobs`` in the chat API, ``logprobs: N`` (the number of alternatives) in completions.
    """
    body: dict[str, Any] = {"max_tokens": max_new_tokens}
    if params.frequency_penalty is not None:
        body["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty is not None:
        body["presence_penalty"] = params.presence_penalty
    if params.logprobs:
        if chat:
            body["logprobs"] = True
            body["top_logprobs"] = params.top_logprobs or 0
        else:
            body["logprobs"] = params.top_logprobs or 0
    schema = params.output_schema
    if chat and params.response_format is not None and schema is not None:
        if response_format_style == "llama-cpp-python":
            body["response_format"] = {"type": "json_object", "schema": schema}
        else:
            body["response_format"] = params.response_format.model_dump(
                mode="json", by_alias=True, exclude_none=True
            )
    if params.is_greedy:
        body["temperature"] = 0.0
    else:
        if params.temperature is not None:
            body["temperature"] = params.temperature
        if params.top_p is not None and params.top_p < 1.0:
            body["top_p"] = params.top_p
        if params.top_k is not None:
            body["top_k"] = params.top_k
        if params.typical_p is not None and params.typical_p < 1.0:
            body["typical_p"] = params.typical_p
    if params.repetition_penalty is not None:
        # vLLM and SGLang call it repetition_penalty, the llama.cpp servers repeat_penalty.
        body["repetition_penalty"] = params.repetition_penalty
        body["repeat_penalty"] = params.repetition_penalty
    if params.seed is not None:
        body["seed"] = params.seed
    if params.stop:
        body["stop"] = list(params.stop)
    return body


_OWN_FINISH_REASONS: dict[str, FinishReason] = {
    "length": "length",
    "eos_token": "eos_token",
    "stop_sequence": "stop_sequence",
}


def finish_reason(choice: ChunkChoice, stops_sent: bool) -> FinishReason:
    """Map an OpenAI ``finish_reason`` ("stop" or "length") onto ours.

    "stop" is ambiguous: vLLM says what stopped it in ``stop_reason`` (a string: a stop sequence; a token
    id or null: end of sequence), SGLang in ``matched_stop``, TGI uses its own reasons. Servers that say
    nothing (the llama.cpp servers) get "stop_sequence" when the request had stop sequences.
    """
    own = _OWN_FINISH_REASONS.get(choice.finish_reason or "")
    if own is not None:
        return own
    sent = choice.model_fields_set
    if "stop_reason" in sent:
        return "stop_sequence" if isinstance(choice.stop_reason, str) else "eos_token"
    if "matched_stop" in sent:
        return "stop_sequence" if isinstance(choice.matched_stop, str) else "eos_token"
    return "stop_sequence" if stops_sent else "eos_token"


def _base_url(url: str) -> str:
    # Accept the server root and the SDK-style ".../v1" alike.
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def _error_detail(response: httpx.Response) -> str:
    try:
        cause = ErrorBody.model_validate_json(response.content).cause
    except ValidationError:  # not JSON, or not an object
        return response.text[:300] or response.reason_phrase
    return (cause if isinstance(cause, str) else cause.describe())[:300]


def status_error(response: httpx.Response) -> BackendError:
    status = response.status_code
    return BackendError(
        f"the backend answered HTTP {status}: {_error_detail(response)}",
        retryable=status not in _NOT_RETRYABLE_STATUS,
        refused=status in _NOT_RETRYABLE_STATUS,
        # No free slot or a server error before the stream began: the backend's state, not the message's.
        unavailable=status in _UNAVAILABLE_STATUS,
    )


def _stream_error(chunk: CompletionChunk) -> BackendError:
    # vLLM and others report a failure inside an already started stream as a data event.
    cause = chunk.cause
    if isinstance(cause, str):
        return BackendError(f"the backend failed mid-stream: {cause}", retryable=True)
    bad_request = (isinstance(cause.code, int) and cause.code in _NOT_RETRYABLE_STATUS) or cause.type in (
        "invalid_request_error",
        "BadRequestError",
    )
    return BackendError(
        f"the backend failed mid-stream: {cause.describe()}", retryable=not bad_request, refused=bad_request
    )


def _chunks(lines: SseLines, data: bytes) -> tuple[list[CompletionChunk], bool]:
    """The chunks of one network read of a server-sent event stream, and whether ``data: [DONE]`` came
    (what follows it is not read)."""
    chunks: list[CompletionChunk] = []
    for line in lines.feed(data):
        payload = line.strip()
        if payload == b"[DONE]":
            return chunks, True
        if not payload:
            continue
        try:
            chunks.append(CompletionChunk.model_validate_json(payload))
        except ValidationError as exc:
            text = payload[:200].decode(errors="replace")
            if exc.errors()[0]["type"] == "json_invalid":
                raise BackendError(f"the backend sent malformed JSON: {text}", retryable=True) from None
            # not an object, or choices that are not
            raise BackendError(f"the backend sent an unexpected event: {text}", retryable=True) from None
    return chunks, False


class OpenAiBackend(GenerationBackend):
    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api_key: str | None = None,
        mode: OpenAiMode = "completions",
        response_format_style: ResponseFormatStyle = "openai",
        token_timeout: float,
        generation_timeout: float,
    ):
        self._base_url = _base_url(base_url)
        self._model = model
        self._mode = mode
        self._response_format_style = response_format_style
        self.takes_messages = mode == "chat"
        self._token_timeout = token_timeout
        self._generation_timeout = generation_timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # Stalls and overruns of a generation are timed by us (between tokens, not bytes: servers send
        # keep-alive comments); httpx bounds only the short requests and the connect.
        self._http = httpx.AsyncClient(base_url=self._base_url, headers=headers, timeout=httpx.Timeout(10.0))
        # The streams: one pooled aiohttp session (httpx's per-read cost was most of a token's).
        self._streams = PooledSession(self._base_url, headers)
        self._health_path: str | None = None
        self._tokenize_probe: int | None = None
        self._tokenize_unsupported = False
        # Per kind ("ids", "detokenize"): which of its probes answered (-1: none does).
        self._probes: dict[str, int] = {}
        self._warned_auth = False

    # ------------------------------------------------------------ metadata
    async def info(self) -> BackendInfo:
        try:
            response = await self._http.get("/v1/models")
        except httpx.HTTPError as exc:
            raise BackendError(f"backend /v1/models failed: {exc}", retryable=True) from None
        if response.status_code != 200:
            raise status_error(response)
        try:
            models = ServedModelList.model_validate_json(response.content).models
        except ValidationError:
            raise BackendError("backend /v1/models sent no model list", retryable=True) from None
        entry = next((m for m in models if m.id == self._model), None)
        if entry is None and models:
            logger.warning(
                "the backend serves {} but the worker asks for {!r} (set OASST_WORKER_BACKEND_MODEL)",
                [m.id for m in models],
                self._model,
            )
            entry = models[0] if len(models) == 1 else None
        # No OpenAI-compatible server exposes its chat template: see the module docstring.
        if entry is None:
            return BackendInfo(model_id=self._model)
        return BackendInfo(model_id=entry.id, max_total_tokens=entry.max_model_len)

    async def healthy(self) -> bool:
        paths = [self._health_path] if self._health_path else ["/health", "/v1/models"]
        for path in paths:
            try:
                response = await self._http.get(path, timeout=5.0)
            except httpx.HTTPError:
                return False
            if response.status_code == 200:
                self._health_path = path
                return True
            if response.status_code in (401, 403) and not self._warned_auth:
                self._warned_auth = True
                logger.warning("the backend refused the API key (HTTP {}) at {}", response.status_code, path)
            if response.status_code not in (404, 405):
                return False
        return False

    async def count_tokens(self, text: str) -> int | None:
        if self._tokenize_unsupported:
            return None
        probes = [self._tokenize_probe] if self._tokenize_probe is not None else range(len(_TOKENIZE_PROBES))
        for index in probes:
            path, field = _TOKENIZE_PROBES[index]
            try:
                response = await self._http.post(path, json={"model": self._model, field: text})
            except httpx.HTTPError:
                return None
            count = _token_count(response)
            if count is not None:
                if self._tokenize_probe is None:
                    logger.info("counting tokens with the backend's {} ({})", path, field)
                self._tokenize_probe = index
                return count
        if self._tokenize_probe is None:
            logger.info("the backend has no tokenize endpoint: prompt lengths are estimated")
            self._tokenize_unsupported = True
        return None

    async def token_ids(self, text: str) -> list[int] | None:
        requests = [(path, {"model": self._model, field: text}) for path, field in _TOKEN_IDS_PROBES]
        return await self._probed("ids", requests, _ids_of)

    async def detokenize(self, token_ids: list[int]) -> str | None:
        requests = [(path, {"model": self._model, "tokens": token_ids}) for path in _DETOKENIZE_PROBES]
        return await self._probed("detokenize", requests, _text_of)

    async def _probed(
        self,
        kind: str,
        requests: list[tuple[str, dict[str, Any]]],
        read: Callable[[httpx.Response], V | None],
    ) -> V | None:
        """What ``read`` finds in the answer to the first of ``requests`` (path, body) that has it,
        trying the one that answered before first; none is tried again once none answered."""
        known = self._probes.get(kind)
        if known == -1:
            return None
        for index in [known] if known is not None else range(len(requests)):
            path, body = requests[index]
            try:
                response = await self._http.post(path, json=body)
            except httpx.HTTPError:
                return None
            value = read(response)
            if value is not None:
                self._probes[kind] = index
                return value
        if known is None:
            self._probes[kind] = -1
        return None

    # ------------------------------------------------------------ generation
    def generate_stream(
        self, prompt: str, params: SamplingParameters, max_new_tokens: int
    ) -> GenerationStream:
        body = {"model": self._model, "prompt": prompt, **openai_parameters(params, max_new_tokens)}
        return self._stream("/v1/completions", body, chat=False, logprobs=params.logprobs)

    def generate_chat_stream(
        self,
        messages: list[ChatTurn],
        params: SamplingParameters,
        max_new_tokens: int,
        *,
        tools: list[ToolDefinition] | None = None,
        tool_choice: ToolChoice | None = None,
    ) -> GenerationStream:
        body = {
            "model": self._model,
            "messages": [_message(m) for m in messages],
            **openai_parameters(
                params, max_new_tokens, chat=True, response_format_style=self._response_format_style
            ),
        }
        if tools:
            body["tools"] = [t.model_dump(mode="json", exclude_none=True) for t in tools]
            if tool_choice is not None:
                body["tool_choice"] = (
                    tool_choice if isinstance(tool_choice, str) else tool_choice.model_dump(mode="json")
                )
        return self._stream("/v1/chat/completions", body, chat=True, logprobs=params.logprobs)

    async def _stream(
        self, path: str, body: dict[str, Any], *, chat: bool, logprobs: bool = False
    ) -> GenerationStream:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        deadline = StepDeadline(stall=self._token_timeout, total=self._generation_timeout)
        stops_sent = bool(body.get("stop"))
        response: aiohttp.ClientResponse | None = None
        texts: list[str] = []
        final: ChunkChoice | None = None
        usage = ChunkUsage()
        calls = _ToolCallAssembler()
        try:
            response = opened = await self._within(
                self._streams.post(path, json.dumps(body).encode(), headers=None, timeout=_STREAM_TIMEOUT),
                deadline,
            )
            if opened.status != 200:
                content = await self._within(opened.read(), deadline)
                raise status_error(httpx.Response(opened.status, content=content))
            reader = opened.content
            lines = SseLines()
            done = False
            while not done:
                try:
                    data = await self._within(reader.readany(), deadline)
                    if not data:
                        break
                    chunks, done = _chunks(lines, data)
                except BackendError:
                    if final is not None:
                        break  # the answer is complete; only the usage or [DONE] did not come
                    raise
                for chunk in chunks:
                    if chunk.is_error:
                        raise _stream_error(chunk)
                    if chunk.usage is not None:
                        usage = chunk.usage
                    for choice in chunk.choices or []:
                        text = choice.content(chat)
                        entries = _logprob_entries(choice.logprobs) if logprobs else []
                        if text or entries:
                            texts.append(text)
                            # One entry per streamed piece: the first carries them all, the rest none.
                            for i, entry in enumerate(entries or [None]):
                                yield StreamedToken(text=text if i == 0 else "", logprobs=entry)
                        if choice.delta is not None and choice.delta.tool_calls:
                            calls.add(choice.delta.tool_calls)
                        if choice.finish_reason:
                            final = choice
        except aiohttp.ClientConnectorError as exc:
            # Refused before a byte was read: the backend is down, the message did nothing wrong.
            raise BackendError(
                f"backend connection failed: {type(exc).__name__}: {exc}", retryable=True, unavailable=True
            ) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, OSError) as exc:
            # Reset or closed after the request was sent: the backend may have died of it.
            raise BackendError(
                f"backend connection failed: {type(exc).__name__}: {exc}",
                retryable=True,
                connection_lost=True,
            ) from None
        except aiohttp.ClientError as exc:
            raise BackendError(
                f"backend connection failed: {type(exc).__name__}: {exc}", retryable=True
            ) from None
        finally:
            # A stream left early is closed, so the server stops generating.
            if response is not None:
                finish(response)
        if final is None:
            raise BackendError("the backend stream ended without a finish reason", retryable=True)
        completion_tokens = usage.completion_tokens
        yield GenerationResult(
            text="".join(texts),
            finish_reason=finish_reason(final, stops_sent),
            # Without usage, one streamed chunk per token is what these servers send.
            generated_tokens=completion_tokens if completion_tokens is not None else len(texts),
            prompt_tokens=usage.prompt_tokens,
            tool_calls=calls.result(),
        )

    async def _within(self, awaitable: Awaitable[T], deadline: StepDeadline) -> T:
        """Await one step of a generation: the next token within the stall timeout, all before the deadline."""
        try:
            return await deadline.step(awaitable)
        except asyncio.TimeoutError:
            if deadline.overran:
                raise BackendError(
                    f"the generation took longer than {self._generation_timeout:.0f}s", retryable=True
                ) from None
            raise BackendError(
                f"the backend sent no token for {self._token_timeout:.0f}s", retryable=True
            ) from None

    async def close(self) -> None:
        await self._streams.close()
        await self._http.aclose()


def _token_count(response: httpx.Response) -> int | None:
    answer = _answer(response, TokenizeAnswer)
    return answer.token_count if answer is not None else None


def _ids_of(response: httpx.Response) -> list[int] | None:
    answer = _answer(response, TokenizeAnswer)
    return answer.ids if answer is not None else None


def _text_of(response: httpx.Response) -> str | None:
    answer = _answer(response, DetokenizeAnswer)
    return answer.detokenized if answer is not None else None


def _answer(response: httpx.Response, reader: type[R]) -> R | None:
    """A 200's body as ``reader`` reads it; None for any other answer."""
    if response.status_code != 200:
        return None
    try:
        return reader.model_validate_json(response.content)
    except ValidationError:  # not JSON, or not an object
        return None


def _message(turn: ChatTurn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": turn.role, "content": turn.content}
    if turn.tool_calls:
        # Content stays a string, empty beside tool calls: some servers refuse null, some templates
        # need the key.
        message["tool_calls"] = [c.model_dump(mode="json") for c in turn.tool_calls]
    if turn.tool_call_id is not None:
        message["tool_call_id"] = turn.tool_call_id
    return message


def _logprob_entries(logprobs: ChunkLogprobs | None) -> list[TokenLogprob]:
    """The token entries of a chunk's ``logprobs``, chat or legacy completions shape."""
    if logprobs is None:
        return []
    if logprobs.content is not None:
        return [
            TokenLogprob(
                token=e.token or "",
                logprob=e.logprob if e.logprob is not None else 0.0,
                bytes=e.bytes if e.bytes is not None else token_bytes(e.token or ""),
                top_logprobs=[
                    TopLogprob(
                        token=t.token or "",
                        logprob=t.logprob if t.logprob is not None else 0.0,
                        bytes=t.bytes if t.bytes is not None else token_bytes(t.token or ""),
                    )
                    for t in e.top_logprobs or []
                ],
            )
            for e in logprobs.content
        ]
    tokens = logprobs.tokens or []
    values = logprobs.token_logprobs or []
    tops = logprobs.top_logprobs or []
    return [
        TokenLogprob(
            token=token,
            logprob=(values[i] if i < len(values) else None) or 0.0,
            bytes=token_bytes(token),
            top_logprobs=[
                TopLogprob(token=t, logprob=v, bytes=token_bytes(t))
                for t, v in ((tops[i] if i < len(tops) else None) or {}).items()
            ],
        )
        for i, token in enumerate(tokens)
    ]


class _ToolCallAssembler:
    """Tool calls from their streamed fragments (OpenAI's contract: by ``index``, the name first, then
    pieces of the JSON arguments)."""

    def __init__(self) -> None:
        self._calls: dict[int, tuple[str | None, str | None, list[str]]] = {}

    def add(self, deltas: list[ToolCallDelta]) -> None:
        for delta in deltas:
            index = delta.index if delta.index is not None else len(self._calls) - (1 if self._calls else 0)
            call_id, name, arguments = self._calls.get(index, (None, None, []))
            function = delta.function
            if function is not None and function.arguments:
                arguments.append(function.arguments)
            self._calls[index] = (
                call_id or delta.id,
                name or (function.name if function is not None else None),
                arguments,
            )

    def result(self) -> list[ToolCall] | None:
        calls = [
            ToolCall(
                id=call_id or new_tool_call_id(),
                function=ToolCallFunction(name=name or "", arguments="".join(arguments) or "{}"),
            )
            for _, (call_id, name, arguments) in sorted(self._calls.items())
        ]
        return calls or None
