"""The worker's own TGI stream client: events split across network reads, error events, and the pooled
connections (kept for the next answer after a clean end, closed when a stream is left early)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web
from text_generation import errors as tgi_errors

from oasst_shared.sampling import SamplingParameters
from oasst_worker.backends import tgi_stream
from oasst_worker.backends.records import BackendError, GenerationResult, StreamedToken
from oasst_worker.backends.tgi import TgiBackend
from oasst_worker.backends.tgi_stream import SseLines, decode_event

GREEDY = SamplingParameters(do_sample=False, max_new_tokens=3)


def _event(i: int, text: str, last: bool = False) -> bytes:
    payload = {
        "index": i,
        "token": {"id": i, "text": text, "logprob": -0.5, "special": False},
        "generated_text": "all" if last else None,
        "details": {"finish_reason": "length", "generated_tokens": i + 1, "cached_tokens": 2}
        if last
        else None,
    }
    return b"data:" + json.dumps(payload).encode() + b"\n\n"


def test_events_split_across_reads_come_out_whole_and_in_order() -> None:
    stream = _event(0, "a") + _event(1, "b") + _event(2, "c", last=True)
    lines = SseLines()
    payloads: list[bytes] = []
    for start in range(0, len(stream), 7):  # reads that cut events anywhere
        payloads += lines.feed(stream[start : start + 7])
    texts = [decode_event(p, 200).token.text for p in payloads]
    assert texts == ["a", "b", "c"]
    last = decode_event(payloads[-1], 200)
    assert last.details is not None and last.details.generated_tokens == 3
    assert tgi_stream.cached_tokens(last.details) == 2


def test_a_line_in_many_reads_comes_out_whole() -> None:
    lines = SseLines()
    line = b"data:" + b"y" * 5000
    payloads: list[bytes] = []
    for start in range(0, len(line), 3):
        payloads += lines.feed(line[start : start + 3])
    assert payloads == []  # not ended yet
    assert lines.feed(b"\n\ndata:next") == [b"y" * 5000]
    assert lines.feed(b"\n") == [b"next"]


def test_a_line_over_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tgi_stream, "MAX_LINE_BYTES", 10)
    with pytest.raises(aiohttp.ClientPayloadError):
        SseLines().feed(b"data:" + b"x" * 20)
    over = SseLines()  # over the limit a little at a time
    with pytest.raises(aiohttp.ClientPayloadError):
        for _ in range(10):
            over.feed(b"data")


def test_error_events_are_the_clients_errors() -> None:
    with pytest.raises(tgi_errors.OverloadedError):
        decode_event(b'{"error": "full", "error_type": "overloaded"}', 200)
    with pytest.raises(tgi_errors.GenerationError):
        decode_event(b'{"error": "boom", "error_type": "generation"}', 200)
    with pytest.raises(ValueError):
        decode_event(b"{not json", 200)
    # JSON that is neither an event nor an error: the client's error for an unknown answer (parse_error
    # itself raised KeyError or TypeError on these).
    for other in (b'{"foo": 1}', b"[1, 2]", b'"text"'):
        with pytest.raises(tgi_errors.UnknownError, match="an unexpected answer"):
            decode_event(other, 200)


@pytest.mark.parametrize(
    ("prompt", "message", "retryable"),
    [
        ("not found", "backend error: an unexpected answer: {'detail': 'Not Found'}", False),
        ("proxy", "backend error: an unexpected answer: <html>502 Bad Gateway</html>", True),
        ("garbled", "the backend sent malformed JSON", True),
        ("foreign", "backend error: an unexpected answer: {'foo': 1}", True),
    ],
)
async def test_answers_that_are_not_tgis_fail_their_message_as_backend_errors(
    prompt: str, message: str, retryable: bool
) -> None:
    async with _backend([]) as url:
        backend = TgiBackend(url, token_timeout=10.0, generation_timeout=60.0)
        try:
            with pytest.raises(BackendError) as failed:
                [i async for i in backend.generate_stream(prompt, GREEDY, 3)]
        finally:
            await backend.close()
    assert str(failed.value).startswith(message) and failed.value.retryable is retryable


@asynccontextmanager
async def _backend(peers: list[object]) -> AsyncIterator[str]:
    """A TGI stand-in that streams three tokens (or, for the prompt "hold", one and then waits), noting
    each request's client address (a new one is a new connection)."""

    async def generate_stream(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        prompt = (await request.json())["inputs"]
        hold = prompt == "hold"
        if prompt == "not found":  # another server's error shape (FastAPI's), not TGI's
            return web.json_response({"detail": "Not Found"}, status=404)
        if prompt == "proxy":  # a proxy's page in front of the backend
            return web.Response(text="<html>502 Bad Gateway</html>", status=502, content_type="text/html")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if prompt in ("garbled", "foreign"):  # one token, then an event that is not one
            await response.write(_event(0, "x"))
            await response.write(b"data:{not json\n\n" if prompt == "garbled" else b'data:{"foo": 1}\n\n')
            await response.write_eof()
            return response
        if hold:  # one token, then nothing until the client goes
            await response.write(_event(0, "x"))
            await asyncio.sleep(2)  # (the test leaves long before)
        for i, text in enumerate(["x", "y", "z"]):
            await response.write(_event(i, text, last=i == 2))
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/generate_stream", generate_stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_finished_streams_connection_serves_the_next_and_a_left_one_is_closed() -> None:
    peers: list[object] = []
    async with _backend(peers) as url:
        backend = TgiBackend(url, token_timeout=10.0, generation_timeout=60.0)
        try:
            items = [item async for item in backend.generate_stream("p", GREEDY, 3)]
            assert [i.text for i in items if isinstance(i, StreamedToken)] == ["x", "y", "z"]
            assert isinstance(items[-1], GenerationResult) and items[-1].cached_tokens == 2
            assert [i async for i in backend.generate_stream("p", GREEDY, 3)][-1] == items[-1]
            assert peers[0] == peers[1]  # the pooled connection was used again

            stream = backend.generate_stream("hold", GREEDY, 3)
            first = await anext(stream)
            assert isinstance(first, StreamedToken)
            await stream.aclose()  # left early: its connection is closed, not pooled
            [i async for i in backend.generate_stream("p", GREEDY, 3)]
            assert len(peers) == 4 and peers[3] not in (peers[0], peers[2])
        finally:
            await backend.close()


async def test_a_closed_backend_opens_no_new_session() -> None:
    """A request after close (a tokenizer's answer still running on a backend switched away from) fails
    as a connection error; it does not open a session that nobody would close."""
    peers: list[object] = []
    async with _backend(peers) as url:
        backend = TgiBackend(url, token_timeout=10.0, generation_timeout=60.0)
        [i async for i in backend.generate_stream("p", GREEDY, 3)]
        await backend.close()
        with pytest.raises(BackendError, match="connection failed") as failed:
            [i async for i in backend.generate_stream("p", GREEDY, 3)]
        assert failed.value.retryable
        assert await backend.detokenize([1, 2]) is None
        assert backend._session._session is None  # nothing left open
        assert len(peers) == 1  # the request after close never left
