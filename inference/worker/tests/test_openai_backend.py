"""The worker's OpenAI adapter against a real third-party OpenAI-compatible server: llama-cpp-python's own
``python -m llama_cpp.server`` on the SmolLM2 file. A scripted fake server is used for faults only
(status codes, stalls, broken streams), which a healthy real server does not produce on demand.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ChatTurn, Work
from oasst_shared.sampling import SamplingParameters
from oasst_worker.backends.openai import (
    OpenAiBackend,
    _logprob_entries,
    _ToolCallAssembler,
    finish_reason,
    openai_parameters,
    status_error,
)
from oasst_worker.backends.openai_wire import (
    ChunkChoice,
    ChunkLogprobs,
    CompletionChunk,
    ServedModel,
    ServedModelList,
    ToolCallDelta,
)
from oasst_worker.backends.records import BackendError, GenerationResult, StreamedToken
from oasst_worker.prompting import PromptBuilder
from tests.support.llama_server import ALIAS, LlamaServer, start_llama_server
from tests.support.processes import free_port

CHAT_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
COUNTING_PROMPT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
GREEDY = SamplingParameters(do_sample=False)
TIMEOUTS = {"token_timeout": 60.0, "generation_timeout": 300.0}


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    server = start_llama_server(tmp_path_factory.mktemp("llama-cpp-server"))
    yield server
    server.process.stop()


@pytest.fixture
async def backend(llama: LlamaServer) -> AsyncIterator[OpenAiBackend]:
    """The adapter on the real server, in completions mode."""
    adapter = backend_for(llama.url)
    yield adapter
    await adapter.close()


def backend_for(url: str, **kwargs: Any) -> OpenAiBackend:
    return OpenAiBackend(url, **{"model": ALIAS, **TIMEOUTS, **kwargs})


async def collect(
    stream: Any,
) -> tuple[list[StreamedToken], GenerationResult]:
    tokens: list[StreamedToken] = []
    async with aclosing(stream) as items:
        async for item in items:
            if isinstance(item, GenerationResult):
                return tokens, item
            tokens.append(item)
    raise AssertionError("the stream ended without a GenerationResult")


# ---------------------------------------------------------------- pure mapping


def test_sampling_parameters_map_onto_the_openai_fields() -> None:
    assert openai_parameters(GREEDY, 7) == {"max_tokens": 7, "temperature": 0.0}
    assert openai_parameters(SamplingParameters(temperature=0.0, top_k=5), 3)["temperature"] == 0.0
    body = openai_parameters(
        SamplingParameters(
            temperature=0.7, top_p=0.9, top_k=40, repetition_penalty=1.2, seed=3, stop=["\n\n"], typical_p=0.5
        ),
        64,
    )
    assert body == {
        "max_tokens": 64,
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 40,
        "typical_p": 0.5,
        "repetition_penalty": 1.2,
        "repeat_penalty": 1.2,
        "seed": 3,
        "stop": ["\n\n"],
    }
    # top_p 1 means "off"; unset fields stay unset (the server's defaults apply).
    assert openai_parameters(SamplingParameters(top_p=1.0), 5) == {"max_tokens": 5}


def test_structured_output_logprobs_and_penalties_are_passed_through() -> None:
    params = SamplingParameters(
        logprobs=True,
        top_logprobs=3,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    )
    chat = openai_parameters(params, 8, chat=True)
    assert chat["logprobs"] is True and chat["top_logprobs"] == 3
    assert chat["presence_penalty"] == 0.5 and chat["frequency_penalty"] == 0.25
    assert chat["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}},
    }
    llama = openai_parameters(params, 8, chat=True, response_format_style="llama-cpp-python")
    assert llama["response_format"] == {"type": "json_object", "schema": {"type": "object"}}
    completions = openai_parameters(params, 8)
    assert completions["logprobs"] == 3 and "response_format" not in completions


def test_streamed_tool_call_fragments_and_logprobs_are_read() -> None:
    assembler = _ToolCallAssembler()
    for delta in (
        {
            "index": 0,
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": ""},
        },
        {"index": 0, "function": {"arguments": '{"city": '}},
        {"index": 0, "function": {"arguments": '"Oslo"}'}},
    ):
        assembler.add([ToolCallDelta.model_validate(delta)])
    (call,) = assembler.result() or []
    assert (call.id, call.function.name, call.function.arguments) == (
        "call_1",
        "get_weather",
        '{"city": "Oslo"}',
    )
    assert _ToolCallAssembler().result() is None
    chat = ChunkLogprobs.model_validate(
        {
            "content": [
                {
                    "token": "Hi",
                    "logprob": -0.5,
                    "bytes": None,
                    "top_logprobs": [{"token": "Hi", "logprob": -0.5}],
                }
            ]
        }
    )
    (entry,) = _logprob_entries(chat)
    assert entry.bytes == [72, 105] and entry.top_logprobs[0].token == "Hi"
    legacy = ChunkLogprobs.model_validate(
        {
            "tokens": ["a", "b"],
            "token_logprobs": [-1.0, -2.0],
            "top_logprobs": [{"a": -1.0}, {"b": -2.0, "c": -3.0}],
        }
    )
    assert [(e.token, e.logprob, len(e.top_logprobs)) for e in _logprob_entries(legacy)] == [
        ("a", -1.0, 1),
        ("b", -2.0, 2),
    ]


@pytest.mark.parametrize(
    ("choice", "stops_sent", "expected"),
    [
        ({"finish_reason": "length"}, True, "length"),
        ({"finish_reason": "stop", "stop_reason": None}, True, "eos_token"),  # vLLM: EOS
        ({"finish_reason": "stop", "stop_reason": 2}, True, "eos_token"),  # vLLM: a stop token id
        ({"finish_reason": "stop", "stop_reason": "\n\n"}, False, "stop_sequence"),  # vLLM: a stop string
        ({"finish_reason": "stop", "matched_stop": "END"}, False, "stop_sequence"),  # SGLang
        ({"finish_reason": "eos_token"}, True, "eos_token"),  # TGI's Messages API
        ({"finish_reason": "stop_sequence"}, False, "stop_sequence"),
        ({"finish_reason": "stop"}, False, "eos_token"),  # llama.cpp: no hint, no stops asked
        ({"finish_reason": "stop"}, True, "stop_sequence"),  # llama.cpp: no hint, stops asked
    ],
)
def test_finish_reasons(choice: dict[str, Any], stops_sent: bool, expected: str) -> None:
    assert finish_reason(ChunkChoice.model_validate(choice), stops_sent) == expected


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"error": {"message": "bad prompt", "type": "invalid_request_error", "code": 400}}, "bad prompt"),
        ({"error": "plain text"}, "plain text"),
        ({"detail": "Not Found"}, "Not Found"),  # FastAPI-style servers
        ({"object": "error", "message": "top level", "code": 400}, "top level"),  # vLLM
    ],
)
def test_error_bodies_of_every_shape_give_their_message(body: dict[str, Any], detail: str) -> None:
    error = status_error(httpx.Response(400, json=body))
    assert str(error) == f"the backend answered HTTP 400: {detail}" and not error.retryable
    assert error.refused  # the request's fault: the server answers its caller 400, not 500


@pytest.mark.parametrize(
    ("status", "refused"), [(400, True), (413, True), (422, True), (404, False), (503, False)]
)
def test_only_a_request_error_status_marks_the_request_refused(status: int, refused: bool) -> None:
    error = status_error(httpx.Response(status, json={"error": "x"}))
    assert error.refused is refused
    assert error.retryable is not refused


def test_fields_of_an_unexpected_type_read_as_absent() -> None:
    chunk = CompletionChunk.model_validate(
        {"choices": [{"text": 5, "delta": "x", "finish_reason": None}], "usage": "n/a"}
    )
    assert chunk.usage is None and not chunk.is_error
    assert (
        chunk.choices is not None
        and chunk.choices[0].content(chat=False) == chunk.choices[0].content(chat=True) == ""
    )
    models = ServedModelList.model_validate({"data": [{"id": "m", "max_model_len": "big"}, "junk"]})
    assert models.models == [ServedModel(id="m")]


# ---------------------------------------------------------------- the real server

slow = pytest.mark.slow


@slow
async def test_info_health_and_token_count(llama: LlamaServer) -> None:
    backend = backend_for(f"{llama.url}/v1")  # the SDK-style base URL works too
    try:
        assert await backend.healthy()
        info = await backend.info()
        assert info.model_id == ALIAS and info.chat_template is None
        # llama-cpp-python counts with /extras/tokenize/count; the template's markers are single tokens.
        count = await backend.count_tokens(CHAT_PROMPT)
        assert count is not None and 10 <= count <= 20
        assert await backend.count_tokens(CHAT_PROMPT + " Paris") == count + 1
    finally:
        await backend.close()


@slow
async def test_token_ids_and_detokenize(llama: LlamaServer, backend: OpenAiBackend) -> None:
    """llama-cpp-python lists ids at /extras/tokenize and detokenizes at /extras/detokenize (vLLM and the
    llama.cpp server at /tokenize and /detokenize, tried first)."""
    ids = await backend.token_ids(CHAT_PROMPT + " Paris")
    assert ids is not None and len(ids) == await backend.count_tokens(CHAT_PROMPT + " Paris")
    assert all(isinstance(i, int) for i in ids)
    text = await backend.detokenize(ids)
    assert text is not None and text.endswith("assistant\n Paris")
    assert await backend.token_ids("again") == await backend.token_ids("again")  # the probe is kept


@slow
async def test_a_chat_prompt_streams_and_ends_with_eos(backend: OpenAiBackend) -> None:
    tokens, result = await collect(backend.generate_stream(CHAT_PROMPT, GREEDY, 48))
    assert tokens and all(t.text for t in tokens)
    assert result.text == "".join(t.text for t in tokens) and "Paris" in result.text
    assert result.finish_reason == "eos_token"
    assert result.generated_tokens == len(tokens) < 48
    # Greedy decoding repeats within one build of the server.
    _, again = await collect(backend.generate_stream(CHAT_PROMPT, GREEDY, 48))
    assert again.text == result.text


@slow
async def test_max_tokens_ends_with_length(backend: OpenAiBackend) -> None:
    tokens, result = await collect(backend.generate_stream(COUNTING_PROMPT, GREEDY, 5))
    assert result.finish_reason == "length" and result.generated_tokens == len(tokens) == 5


@slow
async def test_stop_sequences_are_sent_to_the_server(backend: OpenAiBackend) -> None:
    _, free = await collect(backend.generate_stream(COUNTING_PROMPT, GREEDY, 20))
    assert " 15," in free.text  # the model counts on
    params = SamplingParameters(do_sample=False, stop=[" 15"])
    tokens, result = await collect(backend.generate_stream(COUNTING_PROMPT, params, 20))
    assert result.finish_reason == "stop_sequence"
    assert result.text == free.text[: free.text.index(" 15")]
    assert "".join(t.text for t in tokens) == result.text


@slow
async def test_sampling_parameters_are_accepted(llama: LlamaServer, backend: OpenAiBackend) -> None:
    # The non-OpenAI fields (top_k, repetition_penalty/repeat_penalty) must not make a real server refuse.
    # (llama-cpp-python's server does not repeat sampled text for a seed, so that is not checked here.)
    params = SamplingParameters(temperature=1.0, top_p=0.95, top_k=50, repetition_penalty=1.1, seed=1234)
    tokens, result = await collect(backend.generate_stream(COUNTING_PROMPT, params, 6))
    assert result.finish_reason == "length" and result.generated_tokens == len(tokens) == 6


@slow
async def test_chat_mode_sends_the_conversation(llama: LlamaServer) -> None:
    backend = backend_for(llama.url, mode="chat")
    assert backend.takes_messages
    messages = [
        ChatTurn(role="system", content="You are a helpful assistant."),
        ChatTurn(role="user", content="What is the capital of France?"),
    ]
    try:
        tokens, result = await collect(backend.generate_chat_stream(messages, GREEDY, 64))
        assert tokens and result.text.strip() and result.text == "".join(t.text for t in tokens)
        assert result.finish_reason in ("eos_token", "length")
        assert "<|im_" not in result.text  # the server applied the template and stopped at its end marker
        _, short = await collect(backend.generate_chat_stream(messages, GREEDY, 3))
        assert short.finish_reason == "length" and short.generated_tokens == 3
    finally:
        await backend.close()


async def _wait_for(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def assert_generation_stopped(llama: LlamaServer, backend: OpenAiBackend, disconnects: int) -> None:
    # The server noticed the closed connection and stopped decoding...
    await _wait_for(lambda: llama.log().count("Disconnected from client") > disconnects)
    # ...so the next request is served at once, not after 1500 tokens.
    _, result = await collect(backend.generate_stream(COUNTING_PROMPT, GREEDY, 4))
    assert result.generated_tokens == 4
    assert max(llama.eval_runs()) < 1000


@slow
async def test_closing_the_stream_stops_the_generation(llama: LlamaServer, backend: OpenAiBackend) -> None:
    disconnects = llama.log().count("Disconnected from client")
    async with aclosing(backend.generate_stream(COUNTING_PROMPT, GREEDY, 1500)) as stream:
        received = 0
        async for _ in stream:
            received += 1
            if received == 3:
                break
    await assert_generation_stopped(llama, backend, disconnects)


@slow
async def test_cancelling_the_consumer_closes_the_stream(llama: LlamaServer, backend: OpenAiBackend) -> None:
    disconnects = llama.log().count("Disconnected from client")
    got_tokens = asyncio.Event()

    async def consume() -> None:
        async with aclosing(backend.generate_stream(COUNTING_PROMPT, GREEDY, 1500)) as stream:
            async for _ in stream:
                got_tokens.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_tokens.wait(), 60)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_generation_stopped(llama, backend, disconnects)


@slow
async def test_a_refused_api_key_is_a_retryable_error(tmp_path: Path) -> None:
    server = start_llama_server(tmp_path, API_KEY="right-key")
    wrong = backend_for(server.url, api_key="wrong-key")
    right = backend_for(server.url, api_key="right-key")
    try:
        assert not await wrong.healthy()
        with pytest.raises(BackendError, match="401") as refused:
            await collect(wrong.generate_stream(CHAT_PROMPT, GREEDY, 4))
        # Another worker, with the right key, may serve it.
        assert refused.value.retryable
        assert await right.healthy()
        _, result = await collect(right.generate_stream(CHAT_PROMPT, GREEDY, 4))
        assert result.generated_tokens == 4
    finally:
        await wrong.close()
        await right.close()
        server.process.stop()


async def test_an_unreachable_server_is_a_retryable_error() -> None:
    backend = backend_for(f"http://127.0.0.1:{free_port()}")
    try:
        assert not await backend.healthy()
        assert await backend.count_tokens("hello") is None
        with pytest.raises(BackendError, match="connection") as failed:
            await collect(backend.generate_stream(CHAT_PROMPT, GREEDY, 4))
        assert failed.value.retryable
    finally:
        await backend.close()


# ---------------------------------------------------------------- faults, from a scripted server

Script = Callable[["Exchange"], Awaitable[None]]


@dataclass
class Exchange:
    """One request to the scripted server and the means to answer it."""

    path: str
    body: Any
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    client_closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def respond(self, status: int, body: Any) -> None:
        payload = json.dumps(body).encode()
        self.writer.write(
            f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
            "Connection: close\r\n\r\n".encode()
            + payload
        )
        await self.writer.drain()

    async def start_stream(self) -> None:
        self.writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        await self.writer.drain()

    async def send(self, line: str) -> None:
        try:
            self.writer.write(line.encode())
            await self.writer.drain()
        except ConnectionError:
            self.client_closed.set()
            raise

    async def event(self, data: Any) -> None:
        await self.send(f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n")

    async def token(self, text: str, finish: str | None = None, **extra: Any) -> None:
        await self.event({"choices": [{"index": 0, "text": text, "finish_reason": finish, **extra}]})

    async def hold(self, seconds: float = 30.0) -> None:
        """Send nothing more; notice when the client closes the connection."""
        try:
            data = await asyncio.wait_for(self.reader.read(), seconds)
        except asyncio.TimeoutError:
            return
        except ConnectionError:
            data = b""
        if data == b"":
            self.client_closed.set()


@asynccontextmanager
async def scripted_server(script: Script) -> AsyncIterator[tuple[str, list[Exchange]]]:
    exchanges: list[Exchange] = []
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            path = head.split(" ", 2)[1]
            declared = re.search(r"content-length:\s*(\d+)", head, re.IGNORECASE)
            length = int(declared.group(1)) if declared else 0
            raw = await reader.readexactly(length) if length else b""
            exchange = Exchange(path, json.loads(raw) if raw else None, reader, writer)
            exchanges.append(exchange)
            await script(exchange)
        except ConnectionError:
            pass  # the client went away: what some tests wait for
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", exchanges
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)


def fast_backend(url: str, **kwargs: Any) -> OpenAiBackend:
    return OpenAiBackend(url, **{"model": "m", "token_timeout": 0.5, "generation_timeout": 30.0, **kwargs})


@pytest.mark.parametrize(
    ("status", "retryable"),
    [
        (400, False),
        (413, False),
        (422, False),
        (401, True),
        (404, True),
        (429, True),
        (500, True),
        (503, True),
    ],
)
async def test_http_errors_map_onto_retryable(status: int, retryable: bool) -> None:
    async def script(exchange: Exchange) -> None:
        error = {"message": f"scripted failure {status}", "type": "x", "param": None, "code": status}
        await exchange.respond(status, {"error": error})

    async with scripted_server(script) as (url, _):
        backend = fast_backend(url)
        with pytest.raises(BackendError, match=f"HTTP {status}: scripted failure") as failed:
            await collect(backend.generate_stream("hi", GREEDY, 4))
        assert failed.value.retryable is retryable
        await backend.close()


async def test_a_stall_between_tokens_is_a_retryable_timeout_and_closes_the_connection() -> None:
    async def script(exchange: Exchange) -> None:
        await exchange.start_stream()
        await exchange.token("Hello")
        for _ in range(10):  # keep-alive comments are not tokens
            await exchange.send(": ping\n\n")
            await asyncio.sleep(0.1)
        await exchange.hold()

    async with scripted_server(script) as (url, exchanges):
        backend = fast_backend(url)
        received: list[str] = []
        started = time.monotonic()
        with pytest.raises(BackendError, match="no token for") as stalled:
            async for item in backend.generate_stream("hi", GREEDY, 10):
                assert isinstance(item, StreamedToken)
                received.append(item.text)
        assert stalled.value.retryable and received == ["Hello"]
        assert time.monotonic() - started < 10
        await asyncio.wait_for(exchanges[0].client_closed.wait(), 5)
        await backend.close()


async def test_the_whole_generation_is_bounded() -> None:
    async def script(exchange: Exchange) -> None:
        await exchange.start_stream()
        for i in range(200):
            await exchange.token(f" {i}")
            await asyncio.sleep(0.05)
        await exchange.hold()

    async with scripted_server(script) as (url, exchanges):
        backend = fast_backend(url, token_timeout=5.0, generation_timeout=1.0)
        with pytest.raises(BackendError, match="longer than 1s") as overran:
            await collect(backend.generate_stream("hi", GREEDY, 500))
        assert overran.value.retryable
        await asyncio.wait_for(exchanges[0].client_closed.wait(), 5)
        await backend.close()


@pytest.mark.parametrize(
    ("events", "message", "retryable"),
    [
        (["data: {not json\n\n"], "malformed JSON", True),
        (['data: {"error": {"message": "boom", "code": 500}}\n\n'], "boom", True),
        (['data: {"object": "error", "message": "bad prompt", "code": 400}\n\n'], "bad prompt", False),
        ([], "without a finish reason", True),  # the connection just ends
        (["data: [DONE]\n\n"], "without a finish reason", True),
    ],
)
async def test_broken_streams(events: list[str], message: str, retryable: bool) -> None:
    async def script(exchange: Exchange) -> None:
        await exchange.start_stream()
        await exchange.token("Hi")
        for line in events:
            await exchange.send(line)

    async with scripted_server(script) as (url, _):
        backend = fast_backend(url)
        with pytest.raises(BackendError, match=message) as failed:
            await collect(backend.generate_stream("hi", GREEDY, 10))
        assert failed.value.retryable is retryable
        await backend.close()


async def test_vllm_style_usage_and_stop_reason() -> None:
    async def script(exchange: Exchange) -> None:
        await exchange.start_stream()
        await exchange.token("Hello")
        await exchange.token(" world")
        await exchange.token("", finish="stop", stop_reason="END")
        await exchange.event({"choices": [], "usage": {"prompt_tokens": 17, "completion_tokens": 3}})
        await exchange.event("[DONE]")

    async with scripted_server(script) as (url, exchanges):
        backend = fast_backend(url, api_key="secret", model="served-name")
        params = SamplingParameters(temperature=0.5, top_k=10, seed=7, stop=["END"])
        tokens, result = await collect(backend.generate_stream("the prompt", params, 12))
        assert [t.text for t in tokens] == ["Hello", " world"]
        assert result == GenerationResult(
            text="Hello world", finish_reason="stop_sequence", generated_tokens=3, prompt_tokens=17
        )
        request = exchanges[0]
        assert request.path == "/v1/completions"
        assert request.body == {
            "model": "served-name",
            "prompt": "the prompt",
            "max_tokens": 12,
            "temperature": 0.5,
            "top_k": 10,
            "seed": 7,
            "stop": ["END"],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        await backend.close()


async def test_a_missing_usage_chunk_after_the_finish_is_not_an_error() -> None:
    async def script(exchange: Exchange) -> None:
        await exchange.start_stream()
        await exchange.token("Hi", finish="length")
        await exchange.hold()  # neither usage nor [DONE]

    async with scripted_server(script) as (url, _):
        backend = fast_backend(url)
        _, result = await collect(backend.generate_stream("x", GREEDY, 1))
        assert result.finish_reason == "length" and result.text == "Hi" and result.generated_tokens == 1
        await backend.close()


async def test_chat_mode_reads_deltas() -> None:
    async def script(exchange: Exchange) -> None:
        await exchange.start_stream()
        delta = {"index": 0, "finish_reason": None}
        await exchange.event({"choices": [{**delta, "delta": {"role": "assistant", "content": ""}}]})
        await exchange.event({"choices": [{**delta, "delta": {"content": "Bonjour"}}]})
        await exchange.event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        await exchange.event({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}})
        await exchange.event("[DONE]")

    async with scripted_server(script) as (url, exchanges):
        backend = fast_backend(url, mode="chat")
        messages = [ChatTurn(role="system", content="Be French."), ChatTurn(role="user", content="Hi")]
        tokens, result = await collect(backend.generate_chat_stream(messages, GREEDY, 5))
        assert [t.text for t in tokens] == ["Bonjour"]
        assert (result.finish_reason, result.generated_tokens, result.prompt_tokens) == ("eos_token", 2, 9)
        assert exchanges[0].path == "/v1/chat/completions"
        assert exchanges[0].body["messages"] == [
            {"role": "system", "content": "Be French."},
            {"role": "user", "content": "Hi"},
        ]
        await backend.close()


async def test_health_falls_back_to_the_model_list_and_tokenize_probes_are_remembered() -> None:
    async def script(exchange: Exchange) -> None:
        if exchange.path == "/v1/models":
            await exchange.respond(200, {"data": [{"id": "m", "max_model_len": 4096}]})
        elif exchange.path == "/tokenize" and "content" in exchange.body:  # the llama.cpp server
            await exchange.respond(200, {"tokens": [1, 2, 3]})
        else:
            await exchange.respond(404, {"detail": "Not Found"})

    async with scripted_server(script) as (url, exchanges):
        backend = fast_backend(url)
        assert await backend.healthy()
        assert (await backend.info()).max_total_tokens == 4096
        assert await backend.count_tokens("abc") == 3
        before = len(exchanges)
        assert await backend.count_tokens("abc") == 3
        assert [e.path for e in exchanges[before:]] == ["/tokenize"]  # straight to the one that works
        await backend.close()


# ---------------------------------------------------------------- chat mode: what the job sends


async def test_chat_mode_prompts_keep_the_system_prompt_and_the_newest_turns_that_fit() -> None:
    config = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml", "max_input_length": 60})
    backend = fast_backend("http://127.0.0.1:9", mode="chat")  # never contacted: no tokenizer, estimates
    backend._tokenize_unsupported = True
    thread = [
        ChatTurn(role="system", content="Be brief."),
        ChatTurn(role="user", content="An old question that is long enough to be dropped " * 2),
        ChatTurn(role="assistant", content="An old answer."),
        ChatTurn(role="user", content="What is the capital of France?"),
    ]
    work = Work(message_id="m", model_config_name=config.name, thread=thread, system_prompt="You are kind.")
    builder = PromptBuilder(config, backend)
    await builder.prepare()
    prompt = await builder.build(work)
    assert prompt.messages == [
        ChatTurn(role="system", content="You are kind.\n\nBe brief."),
        ChatTurn(role="user", content="What is the capital of France?"),
    ]
    assert prompt.tokens <= 60
    # A rendered-prompt backend gets no messages, only the text.
    plain = PromptBuilder(config, fast_backend("http://127.0.0.1:9"))
    assert (await plain.build(work)).messages is None
    await backend.close()
