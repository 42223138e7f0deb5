"""An instant text-generation backend for benchmarks: it streams tokens as fast as it can.

It speaks enough of two HTTP APIs for the project's worker, the text-generation client, an OpenAI SDK and
the LiteLLM proxy:

* text-generation-inference: ``POST /generate_stream``, ``POST /`` (with ``"stream": true`` or not),
  ``POST /generate``, ``GET /info`` (with a chat template), ``GET /health``, ``POST /tokenize``;
* OpenAI: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (streamed or not), ``GET /v1/models``.

Every token's text differs (a cycling word plus a counter): LiteLLM aborts a stream after 100 identical
chunks. The first token is written on its own so that time to first token is real; later tokens are
written ``--chunk`` at a time (one socket write each) so the backend spends little CPU on a shared
machine. ``--token-delay`` paces the stream instead (seconds between chunks).

``--token-rate R`` paces it the way a batching model does: one token per write, every stream's next token
released at the next tick of one clock shared by all streams (R ticks a second), so the tokens of all
streams arrive at the same moments, one backend event each (bench/paced_relay.py).

This is a benchmark tool, not a test fake: it has no fault injection and checks little.

    python -m bench.instant_backend --port 8011
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import uvicorn

MODEL_ID = "bench/instant"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")
DEFAULT_NEW_TOKENS = 20
MAX_NEW_TOKENS = 100_000

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def token_texts(count: int) -> Iterator[str]:
    """``count`` token texts, each different from the one before (and from any within 10 * count)."""
    for i in range(count):
        yield f" {WORDS[i % len(WORDS)]}{i}"


def approximate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class InstantBackend:
    def __init__(
        self,
        chunk: int = 8,
        token_delay: float = 0.0,
        token_rate: float = 0.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        # Paced by a rate: one token per write, each at a tick of the shared clock (``clock`` and
        # ``sleep``: a test's virtual time).
        self._clock = clock
        self._sleep = sleep
        self.chunk = 1 if token_rate > 0 else max(1, chunk)
        self.token_delay = token_delay
        self.tick = 1 / token_rate if token_rate > 0 else 0.0
        self.info = {
            "model_id": MODEL_ID,
            "model_dtype": "none",
            "model_device_type": "cpu",
            "max_concurrent_requests": 100_000,
            "max_best_of": 1,
            "max_stop_sequences": 4,
            "max_input_length": 4095,
            "max_input_tokens": 4095,
            "max_total_tokens": MAX_NEW_TOKENS + 4096,
            "version": "instant",
            "chat_template": CHAT_TEMPLATE,
            "bos_token": "",
            "eos_token": "<|im_end|>",
        }

    # ------------------------------------------------------------ ASGI plumbing
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        if method == "GET":
            if path == "/health":
                await _json(send, {})
            elif path == "/info":
                await _json(send, self.info)
            elif path == "/v1/models":
                await _json(send, {"object": "list", "data": [{"id": MODEL_ID, "object": "model"}]})
            else:
                await _json(send, {"error": "not found", "error_type": "not_found"}, 404)
            return
        if method != "POST":
            await _json(send, {"error": "method not allowed"}, 405)
            return
        try:
            body = json.loads(await _body(receive) or b"{}")
        except ValueError:
            await _json(send, {"error": "invalid JSON", "error_type": "validation"}, 422)
            return
        if path == "/tokenize":
            text = str(body.get("inputs", ""))
            count = approximate_tokens(text)
            step = max(1, len(text) // count)
            tokens = [
                {"id": i, "text": text[i * step : (i + 1) * step], "start": i * step, "stop": (i + 1) * step}
                for i in range(count)
            ]
            await _json(send, tokens)
        elif path == "/generate_stream" or (path == "/" and body.get("stream")):
            await self._tgi_stream(send, body)
        elif path in ("/", "/generate"):
            await self._tgi_generate(send, body, as_list=path == "/")
        elif path == "/v1/chat/completions":
            await self._openai(send, body, chat=True)
        elif path == "/v1/completions":
            await self._openai(send, body, chat=False)
        else:
            await _json(send, {"error": "not found", "error_type": "not_found"}, 404)

    # ------------------------------------------------------------ text-generation-inference
    @staticmethod
    def _tgi_new_tokens(body: dict[str, Any]) -> int:
        params = body.get("parameters") or {}
        return _clamp(params.get("max_new_tokens"))

    async def _tgi_stream(self, send: Send, body: dict[str, Any]) -> None:
        count = self._tgi_new_tokens(body)
        await _start_sse(send)
        parts: list[str] = []
        lines: list[bytes] = []
        for i, text in enumerate(token_texts(count)):
            parts.append(text)
            event: dict[str, Any] = {
                "index": i,
                "token": {"id": i, "text": text, "logprob": -0.1, "special": False},
                "top_tokens": None,
                "generated_text": None,
                "details": None,
            }
            if i == count - 1:
                event["generated_text"] = "".join(parts)
                event["details"] = {"finish_reason": "length", "generated_tokens": count, "seed": None}
            lines.append(b"data:" + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
            if i == 0 or len(lines) >= self.chunk or i == count - 1:
                await self._write(send, lines, more=i < count - 1)
                lines = []

    async def _tgi_generate(self, send: Send, body: dict[str, Any], *, as_list: bool) -> None:
        count = self._tgi_new_tokens(body)
        texts = list(token_texts(count))
        tokens = [{"id": i, "text": t, "logprob": -0.1, "special": False} for i, t in enumerate(texts)]
        details = {
            "finish_reason": "length",
            "generated_tokens": count,
            "seed": None,
            "prefill": [],
            "tokens": tokens,
        }
        result = {"generated_text": "".join(texts), "details": details}
        await _json(send, [result] if as_list else result)

    # ------------------------------------------------------------ OpenAI
    async def _openai(self, send: Send, body: dict[str, Any], *, chat: bool) -> None:
        count = _clamp(body.get("max_completion_tokens") or body.get("max_tokens"))
        model = str(body.get("model") or MODEL_ID)
        created = int(time.time())
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        prompt_tokens = approximate_tokens(json.dumps(body.get("messages") or body.get("prompt") or ""))
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": count,
            "total_tokens": prompt_tokens + count,
        }
        obj = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            text = "".join(token_texts(count))
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            await _json(
                send,
                {
                    "id": ident,
                    "object": obj,
                    "created": created,
                    "model": model,
                    "choices": [choice],
                    "usage": usage,
                },
            )
            return
        chunk_obj = "chat.completion.chunk" if chat else "text_completion"
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        await _start_sse(send)
        lines: list[bytes] = []
        for i, text in enumerate(itertools.chain(token_texts(count), [None])):
            if text is None:
                delta_choice: dict[str, Any] = {"index": 0, "finish_reason": "length", "logprobs": None}
                if chat:
                    delta_choice["delta"] = {}
                else:
                    delta_choice["text"] = ""
            else:
                delta_choice = {"index": 0, "finish_reason": None, "logprobs": None}
                if chat:
                    delta_choice["delta"] = (
                        {"role": "assistant", "content": text} if i == 0 else {"content": text}
                    )
                else:
                    delta_choice["text"] = text
            event = {
                "id": ident,
                "object": chunk_obj,
                "created": created,
                "model": model,
                "choices": [delta_choice],
            }
            lines.append(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
            if i == 0 or len(lines) >= self.chunk:
                await self._write(send, lines, more=True)
                lines = []
        if include_usage:
            event = {
                "id": ident,
                "object": chunk_obj,
                "created": created,
                "model": model,
                "choices": [],
                "usage": usage,
            }
            lines.append(b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n")
        lines.append(b"data: [DONE]\n\n")
        await self._write(send, lines, more=False)

    async def _write(self, send: Send, lines: list[bytes], *, more: bool) -> None:
        await send({"type": "http.response.body", "body": b"".join(lines), "more_body": more})
        if self.tick > 0 and more:
            # Until the next tick of the clock every stream shares (a batching model's decode step).
            await self._sleep(self.tick - self._clock() % self.tick)
        elif self.token_delay > 0:
            await self._sleep(self.token_delay)
        else:
            await asyncio.sleep(0)  # let other streams run between chunks


def _clamp(value: Any) -> int:
    try:
        count = int(value) if value is not None else DEFAULT_NEW_TOKENS
    except (TypeError, ValueError):
        count = DEFAULT_NEW_TOKENS
    return min(max(1, count), MAX_NEW_TOKENS)


async def _body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _start_sse(send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
        }
    )


async def _json(send: Send, data: Any, status: int = 200) -> None:
    body = json.dumps(data).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--chunk", type=int, default=8, help="tokens per socket write after the first")
    parser.add_argument("--token-delay", type=float, default=0.0, help="seconds to wait after each write")
    parser.add_argument(
        "--token-rate",
        type=float,
        default=0.0,
        help="tokens a second per stream, one a write, on a clock all streams share (overrides the other two)",
    )
    args = parser.parse_args()
    backend = InstantBackend(chunk=args.chunk, token_delay=args.token_delay, token_rate=args.token_rate)
    serve(backend, args.host, args.port)


def serve(app: Any, host: str, port: int) -> None:
    """Run a benchmark's stand-in server: quiet, with room for thousands of connections."""
    uvicorn.run(
        app, host=host, port=port, log_level="warning", access_log=False, backlog=4096, timeout_keep_alive=30
    )


if __name__ == "__main__":
    main()
