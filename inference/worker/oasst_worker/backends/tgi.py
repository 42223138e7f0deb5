"""Hugging Face text-generation-inference through its own client's request and error models
(``text_generation``); the stream is read by the worker's own pooled client (:mod:`.tgi_stream`).

Works with TGI and with the bundled CPU backend, which speaks the same HTTP API.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import httpx
from aiohttp import ClientResponse, ClientTimeout
from pydantic import BaseModel, ConfigDict, ValidationError
from text_generation import errors as tgi_errors
from text_generation.types import Grammar, GrammarType

from oasst_shared.logprobs import TokenLogprob, TopLogprob, token_bytes
from oasst_shared.protocol import ANSWER_START_HEADER
from oasst_shared.sampling import SamplingParameters
from oasst_worker.backends.deadlines import StepDeadline
from oasst_worker.backends.pooled_session import PooledSession, finish
from oasst_worker.backends.protocols import GenerationBackend, GenerationStream
from oasst_worker.backends.records import BackendError, BackendInfo, GenerationResult, StreamedToken
from oasst_worker.backends.tgi_stream import (
    SseLines,
    TgiToken,
    answer_error,
    cached_tokens,
    decode_event,
    request_body,
)

# The backend has no room or is not up yet: not the message's fault.
_UNAVAILABLE = (tgi_errors.OverloadedError, tgi_errors.ShardNotReadyError, tgi_errors.RateLimitExceededError)
# Errors another worker, or the same backend later, may not repeat.
_RETRYABLE = (
    tgi_errors.OverloadedError,
    tgi_errors.ShardNotReadyError,
    tgi_errors.ShardTimeoutError,
    tgi_errors.RateLimitExceededError,
    tgi_errors.IncompleteGenerationError,
    tgi_errors.UnknownError,
)
_TOKENIZER_TIMEOUT = 10.0  # seconds, for /tokenize and /detokenize
_FINISH_REASONS = {"length": "length", "eos_token": "eos_token", "stop_sequence": "stop_sequence"}


def tgi_parameters(params: SamplingParameters, max_new_tokens: int) -> dict[str, object]:
    """Translate our sampling parameters into the keyword arguments TGI's client accepts.

    TGI refuses temperature <= 0 and top_p/typical_p >= 1: those mean "greedy" and "off" here.
    Structured output is TGI's ``grammar`` (a JSON schema); logprobs come with every token, their
    alternatives with ``top_n_tokens``.
    """
    greedy = params.is_greedy
    extra: dict[str, object] = {}
    schema = params.output_schema
    if schema is not None:
        extra["grammar"] = Grammar(type=GrammarType.Json, value=schema)
    if params.logprobs and params.top_logprobs:
        extra["top_n_tokens"] = params.top_logprobs
    if params.frequency_penalty:
        if params.frequency_penalty < 0:
            raise BackendError("TGI takes only a positive frequency_penalty", retryable=False)
        extra["frequency_penalty"] = params.frequency_penalty
    if params.presence_penalty:
        raise BackendError("TGI has no presence_penalty", retryable=False)
    return {
        **extra,
        "do_sample": not greedy and params.do_sample is not False,
        "max_new_tokens": max_new_tokens,
        "repetition_penalty": params.repetition_penalty,
        "seed": params.seed,
        "stop_sequences": list(params.stop),
        "temperature": None if greedy or not params.temperature else params.temperature,
        "top_k": None if greedy else params.top_k,
        "top_p": None if greedy or params.top_p is None or params.top_p >= 1.0 else params.top_p,
        "typical_p": None
        if greedy or params.typical_p is None or params.typical_p >= 1.0
        else params.typical_p,
    }


class TgiInfo(BaseModel):
    """The fields of TGI's ``GET /info`` the worker reads (the bundled CPU backend sends them too)."""

    model_config = ConfigDict(extra="ignore", protected_namespaces=())

    model_id: str | None = None
    chat_template: str | None = None
    bos_token: str | None = None
    eos_token: str | None = None
    max_input_length: int | None = None
    max_input_tokens: int | None = None  # what newer TGI releases call max_input_length
    max_total_tokens: int | None = None
    model_sha: str | None = None
    version: str | None = None
    sha: str | None = None  # the TGI build's commit
    llama_cpp_version: str | None = None  # the bundled CPU backend's engine

    def to_backend_info(self) -> BackendInfo:
        parts = (("version", self.version), ("sha", self.sha), ("llama.cpp", self.llama_cpp_version))
        build = [f"{name} {value}" for name, value in parts if value]
        return BackendInfo(
            model_id=self.model_id,
            chat_template=self.chat_template,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            max_input_length=self.max_input_length or self.max_input_tokens,
            max_total_tokens=self.max_total_tokens,
            model_revision=self.model_sha,
            backend_version=", ".join(build) or None,
        )


class TgiBackend(GenerationBackend):
    def __init__(self, base_url: str, *, token_timeout: float, generation_timeout: float):
        self._base_url = base_url.rstrip("/")
        # The client's timeout bounds a whole generation; the stall timeout between tokens is ours.
        self._generation_timeout = ClientTimeout(int(max(1, generation_timeout)))
        self._token_timeout = token_timeout
        self._http = httpx.AsyncClient(base_url=self._base_url, timeout=httpx.Timeout(10.0))
        self._session = PooledSession(self._base_url)  # the streams' pooled connections

    async def info(self) -> BackendInfo:
        try:
            response = await self._http.get("/info")
            response.raise_for_status()
            return TgiInfo.model_validate_json(response.content).to_backend_info()
        except (httpx.HTTPError, ValidationError) as exc:
            raise BackendError(f"backend /info failed: {exc}", retryable=True) from None

    async def healthy(self) -> bool:
        try:
            response = await self._http.get("/health", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code == 200

    async def count_tokens(self, text: str) -> int | None:
        tokens = await self._tokenize(text)
        return len(tokens) if tokens is not None else None

    async def token_ids(self, text: str) -> list[int] | None:
        tokens = await self._tokenize(text)
        if tokens is None:
            return None
        ids: list[int] = []
        for token in tokens:
            token_id = token.get("id") if isinstance(token, dict) else None
            if not isinstance(token_id, int) or isinstance(token_id, bool):
                return None
            ids.append(token_id)
        return ids

    async def detokenize(self, token_ids: list[int]) -> str | None:
        """``/detokenize``'s text: TGI has none (None), the bundled CPU backend has (vLLM's shape)."""
        answer = await self._session.post_for_json(
            "/detokenize", {"tokens": token_ids}, timeout=_TOKENIZER_TIMEOUT
        )
        text = answer.get("prompt") if isinstance(answer, dict) else None
        return text if isinstance(text, str) else None

    async def _tokenize(self, text: str) -> list[object] | None:
        """``/tokenize``'s tokens (``{"id", "text", "start", "stop"}`` each), through the streams' pooled
        session (a count follows most answers)."""
        tokens = await self._session.post_for_json("/tokenize", {"inputs": text}, timeout=_TOKENIZER_TIMEOUT)
        return tokens if isinstance(tokens, list) else None

    def generate_stream(
        self, prompt: str, params: SamplingParameters, max_new_tokens: int
    ) -> GenerationStream:
        return self._stream(None, prompt, params, max_new_tokens)

    def continue_stream(
        self, prompt: str, answer_prefix: str, params: SamplingParameters, max_new_tokens: int
    ) -> GenerationStream:
        """The two as one prompt, with the header that tells the bundled CPU backend where the answer's
        start begins (it then continues a greedy answer exactly; TGI ignores it)."""
        headers = {ANSWER_START_HEADER: str(len(prompt))}
        return self._stream(headers, prompt + answer_prefix, params, max_new_tokens)

    async def _stream(
        self, headers: dict[str, str] | None, prompt: str, params: SamplingParameters, max_new_tokens: int
    ) -> GenerationStream:
        generated = 0
        logprobs_wanted = params.logprobs
        response: ClientResponse | None = None
        try:
            body = request_body(prompt, **tgi_parameters(params, max_new_tokens))
            deadline = StepDeadline(stall=self._token_timeout)
            response = await deadline.step(
                self._session.post(
                    "/generate_stream", body, headers=headers, timeout=self._generation_timeout
                )
            )
            status = response.status
            if status != 200:
                body = await deadline.step(response.read())
                try:
                    payload: object = json.loads(body)
                except ValueError:  # not JSON: a proxy's page
                    payload = body.decode(errors="replace")
                raise answer_error(status, payload)
            content = response.content
            lines = SseLines()
            while True:
                # One step per network read: the stall timeout bounds the wait for the next data.
                chunk = await deadline.step(content.readany())
                if not chunk:
                    break
                for data in lines.feed(chunk):
                    event = decode_event(data, status)
                    token = event.token
                    if not token.special:
                        yield StreamedToken(
                            text=token.text,
                            token_id=token.id,
                            logprob=token.logprob,
                            logprobs=_logprobs(token, event.top_tokens) if logprobs_wanted else None,
                        )
                    generated += 1
                    details = event.details
                    if details is not None:
                        yield GenerationResult(
                            text=event.generated_text or "",
                            finish_reason=_FINISH_REASONS.get(details.finish_reason, "length"),
                            generated_tokens=details.generated_tokens or generated,
                            cached_tokens=cached_tokens(details),
                        )
                        return
        except tgi_errors.ValidationError as exc:
            raise BackendError(
                f"the backend refused the request: {exc}", retryable=False, refused=True
            ) from None
        except _UNAVAILABLE as exc:
            raise BackendError(
                f"backend unavailable: {exc}", retryable=True, unavailable=generated == 0
            ) from None
        except _RETRYABLE as exc:
            raise BackendError(f"backend error: {exc}", retryable=True) from None
        except tgi_errors.BadRequestError as exc:
            raise BackendError(
                f"the backend refused the request: {exc}", retryable=False, refused=True
            ) from None
        except (tgi_errors.GenerationError, tgi_errors.NotFoundError) as exc:
            raise BackendError(f"backend error: {exc}", retryable=False) from None
        except json.JSONDecodeError as exc:
            raise BackendError(f"the backend sent malformed JSON: {exc}", retryable=True) from None
        except asyncio.TimeoutError:
            raise BackendError(
                f"the backend sent no token for {self._token_timeout:.0f}s", retryable=True
            ) from None
        except aiohttp.ClientConnectorError as exc:
            # The backend refused the connection (it is down, or restarting): the request never left.
            raise BackendError(
                f"backend connection failed: {exc}", retryable=True, unavailable=generated == 0
            ) from None
        except OSError as exc:
            # The connection broke after the request was sent (reset): nothing generated yet is still
            # the backend's state, not the message's, unless the backend died of it (the job asks).
            raise BackendError(
                f"backend connection lost: {exc}",
                retryable=True,
                unavailable=generated == 0,
                connection_lost=True,
            ) from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            # Closed without an answer, or the stream cut short: the backend may have died mid-request.
            raise BackendError(
                f"backend connection lost: {type(exc).__name__}: {exc}", retryable=True, connection_lost=True
            ) from None
        except aiohttp.ClientError as exc:  # aiohttp's other errors (a malformed response...)
            raise BackendError(f"backend connection failed: {exc}", retryable=True) from None
        finally:
            if response is not None:
                finish(response)  # a stream left early is closed, so the backend stops generating
        raise BackendError("the backend stream ended without a final result", retryable=True)

    async def close(self) -> None:
        await self._session.close()
        await self._http.aclose()


def _logprobs(token: TgiToken, top_tokens: list[TgiToken] | None) -> TokenLogprob:
    return TokenLogprob(
        token=token.text,
        logprob=token.logprob if token.logprob is not None else 0.0,
        bytes=token_bytes(token.text),
        top_logprobs=[
            TopLogprob(
                token=t.text, logprob=t.logprob if t.logprob is not None else 0.0, bytes=token_bytes(t.text)
            )
            for t in top_tokens or []
        ],
    )
