"""The generation job: builds the prompt, streams from the backend, sends tokens and the result.

Tools on a backend that takes rendered prompts: the prompt lists the tools (see prompting), and

* ``tool_choice`` "required" or a named function: the answer is constrained (the backend's grammar) to
  a call ``{"name", "arguments"}`` of an allowed tool, held back, and sent as ``tool_calls``;
* "auto": an answer that begins like a call (``{`` or ``<tool_call>``) is held back; if it parses as a
  call of a known tool it is sent as ``tool_calls``, otherwise as text.

Logprobs (``params.logprobs``): each token frame carries the entries of the backend tokens whose text
it releases; text held back (stop sequences) keeps its entries until it is released.

Continuation (``work.answer_prefix``, the text a lost worker streamed): the prefix goes after the rendered
prompt, with no end-of-turn, and counts against the input limit (older turns may be dropped for it) and
the token budget; the job streams and returns only what follows, with the prefix's token count
(``prefix_tokens``), and the server joins the two.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing

from loguru import logger
from pydantic import ValidationError

from oasst_shared.chat_template import ChatTemplateError
from oasst_shared.logprobs import TokenLogprob
from oasst_shared.model_configs import ModelConfig
from oasst_shared.model_files import ModelFacts, with_model_facts
from oasst_shared.protocol import EmbedWork, FinishReason, GeneratedText, Work, WorkerError, text_problem
from oasst_shared.sampling import JsonSchemaFormat, ResponseFormat, SamplingParameters
from oasst_shared.stop_sequences import StopSequenceFilter
from oasst_shared.token_frames import TokenFrame, UnsendableText
from oasst_shared.tool_calls import (
    NamedToolChoice,
    ToolCall,
    called_tools,
    looks_like_tool_call,
    parse_tool_call,
    tool_call_schema,
)
from oasst_worker import metrics
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.backends.records import BackendError, BackendInfo, GenerationResult
from oasst_worker.jobs.base import Send, WrongKindOfWork, backend_died, backend_failure
from oasst_worker.prompt_tokens import PromptCount
from oasst_worker.prompting import PromptBuilder
from oasst_worker.tokenizing import PromptTokenizer

_CANCELLED_COUNT_WAIT = 1.0  # seconds


class GenerationJobFactory:
    """Generation jobs for one model config, sharing one prompt builder."""

    def __init__(self, backend: GenerationBackend, model_config: ModelConfig):
        self.backend = backend
        self.model_config = model_config
        self._prompts = PromptBuilder(model_config, backend)
        self.backend_info: BackendInfo | None = None
        self.tokenizer: PromptTokenizer | None = PromptTokenizer(self._prompts, backend)

    async def prepare(self) -> None:
        try:
            self.backend_info = await self.backend.info()
        except BackendError as exc:  # identity is for the operator and checks; the worker serves anyway
            logger.warning("the backend does not describe its model: {}", exc)
            self.backend_info = None
        if self.backend_info is not None:
            # What the config leaves out, the running backend says (its context length, template, tokens).
            resolved = with_model_facts(self.model_config, _facts(self.backend_info))
            if resolved is not self.model_config:
                self.model_config = resolved
                self._prompts = PromptBuilder(resolved, self.backend)
                # Counts must render as the jobs do: with the builder the jobs get.
                self.tokenizer = PromptTokenizer(self._prompts, self.backend)
        await self._prompts.prepare()

    def create(self, work: Work | EmbedWork) -> GenerationJob:
        if not isinstance(work, Work):
            raise WrongKindOfWork(self.model_config, work)
        return GenerationJob(
            work, backend=self.backend, prompts=self._prompts, model_config=self.model_config
        )


class GenerationJob:
    def __init__(
        self, work: Work, *, backend: GenerationBackend, prompts: PromptBuilder, model_config: ModelConfig
    ):
        self.work = work
        self._backend = backend
        self._prompts = prompts
        self._config = model_config
        self.cancel_requested = False
        self._text: list[str] = []
        self._generated = 0
        self._streamed = 0  # backend tokens read (the tokens metric, counted once per job)
        self._prompt_count: PromptCount | None = None  # set once the prompt is built
        self._started = time.monotonic()
        self._first_token_at: float | None = None
        self._logprobs: list[TokenLogprob] = []  # of tokens whose text is not sent yet
        self._tool_calls: list[ToolCall] | None = None
        self._prefix_tokens: int | None = None  # a continuation's prefix, counted
        self._cached_tokens: int | None = None  # prompt tokens the backend's cache served

    async def run(self, send: Send) -> None:
        logger.info("message {}: generating (attempt {})", self.work.message_id, self.work.attempt)
        metrics.IN_FLIGHT.inc()
        try:
            outcome = await self._run(send)
        finally:
            metrics.IN_FLIGHT.dec()
            metrics.TOKENS.inc(self._streamed)
        metrics.JOBS.labels(outcome).inc()
        if self._first_token_at is not None and self._generated > 1:
            elapsed = time.monotonic() - self._first_token_at
            if elapsed > 0:
                metrics.TOKENS_PER_SECOND.observe((self._generated - 1) / elapsed)

    async def _run(self, send: Send) -> str:
        message_id = self.work.message_id
        try:
            result = await self._generate(send)
        except asyncio.CancelledError:
            if not self.cancel_requested:
                raise
            logger.info("message {} cancelled after {} tokens", message_id, self._generated)
            result = GeneratedText(
                message_id=message_id,
                text="".join(self._text),
                finish_reason="cancelled",
                generated_tokens=self._generated,
                # A cancel may be for a backend that stopped answering: its count is not waited for long.
                prompt_tokens=await self._prompt_tokens(wait=_CANCELLED_COUNT_WAIT),
                tool_calls=self._tool_calls,
                prefix_tokens=self._prefix_tokens,
            )
        except BackendError as exc:
            try:
                died = await backend_died(self._backend, exc)
            except asyncio.CancelledError:
                if not self.cancel_requested:
                    raise
                died = False  # cancelled while the backend was asked: the failure is still answered
            if died:
                logger.error("message {}: the backend died while it ran it: {}", message_id, exc)
            else:
                logger.warning("message {} failed at the backend: {}", message_id, exc)
            await send(backend_failure(message_id, exc, died=died))
            if died:
                return "backend_died"
            return "backend_unavailable" if exc.unavailable else "backend_error"
        except (UnsendableText, ValidationError) as exc:
            # The backend produced text no frame may carry (NUL, a lone surrogate): this message's
            # answer cannot be delivered, and another try would likely produce it again.
            why = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            logger.warning("message {}: the backend's text cannot be sent: {}", message_id, why)
            error = WorkerError(
                message_id=message_id,
                error=f"the backend produced text that cannot be sent: {why}",
                retryable=False,
            )
            await send(error)
            return "invalid_text"
        except ChatTemplateError as exc:
            # A prompt the model cannot take: the request's fault, as a backend's 4xx would be.
            await send(WorkerError(message_id=message_id, error=str(exc), request_refused=True))
            return "prompt_error"
        await send(result)
        return "cancelled" if result.finish_reason == "cancelled" else "complete"

    async def _generate(self, send: Send) -> GeneratedText:
        work = self.work
        prefix = work.answer_prefix or ""
        if prefix and self._backend.takes_messages:
            raise ChatTemplateError("this worker's backend cannot continue an answer")
        prefix_tokens = self._prefix_tokens = await self._prompts.count_tokens(prefix) if prefix else None
        prompt = await self._prompts.build(work, reserve=prefix_tokens or 0)
        params = work.sampling_parameters
        budget = params.max_new_tokens - (prefix_tokens or 0)
        if budget <= 0:  # the lost worker had used the whole budget
            return await self._result("length")
        max_new_tokens = self._config.cap_max_new_tokens(budget, prompt.tokens + (prefix_tokens or 0))
        if not prompt.exact and max_new_tokens < budget:
            # The bound would cut the answer short: the exact count decides how short.
            prompt = await self._prompts.counted(prompt)
            max_new_tokens = self._config.cap_max_new_tokens(budget, prompt.tokens + (prefix_tokens or 0))
        prompt_count = self._prompt_count = PromptCount(
            prompt.text, prompt.tokens if prompt.exact else None, self._prompts.count_tokens
        )
        stops = StopSequenceFilter([*params.stop, *self._config.stop_sequences])
        finish_reason: FinishReason = "length"
        tools = called_tools(work.tools or [], work.tool_choice) if work.tools else []
        # Tool calls on a backend without native tools: held back (constrained when forced).
        rendered = prompt.messages is None
        forced = (
            rendered
            and bool(tools)
            and (work.tool_choice == "required" or isinstance(work.tool_choice, NamedToolChoice))
        )
        # A continued answer was text when its first part was streamed.
        detect = rendered and bool(tools) and not forced and not prefix
        if prompt.messages is not None:
            backend_stream = self._backend.generate_chat_stream(
                prompt.messages, params, max_new_tokens, tools=work.tools, tool_choice=work.tool_choice
            )
        else:
            if forced:
                params = _constrained(params, tool_call_schema(tools))
            backend_stream = (
                self._backend.continue_stream(prompt.text, prefix, params, max_new_tokens)
                if prefix
                else self._backend.generate_stream(prompt.text, params, max_new_tokens)
            )
        held: list[str] | None = [] if forced or detect else None
        # aclosing: leaving the loop early closes the backend's HTTP stream at once, not at GC time.
        async with aclosing(backend_stream) as stream:
            async for item in stream:
                if self.cancel_requested:
                    # A cancel that lands while the job is not awaiting (or one requested before
                    # the job's task began) is not lost: the flag ends the job at the next token.
                    raise asyncio.CancelledError
                if isinstance(item, GenerationResult):
                    if held is None:
                        await self._emit(send, stops.flush())
                    else:
                        held.append(stops.flush())
                    finish_reason = item.finish_reason
                    self._generated = max(self._generated, item.generated_tokens)
                    if item.prompt_tokens is not None:
                        prompt_count.reported(max(0, item.prompt_tokens - (prefix_tokens or 0)))
                    self._tool_calls = item.tool_calls
                    self._cached_tokens = item.cached_tokens
                    break
                self._generated += 1
                self._streamed += 1
                if self._first_token_at is None:
                    self._first_token_at = time.monotonic()
                    metrics.TIME_TO_FIRST_TOKEN.observe(self._first_token_at - self._started)
                if item.logprobs is not None:
                    self._logprobs.append(item.logprobs)
                released = stops.push(item.text)
                if held is not None:
                    held.append(released)
                    if detect and looks_like_tool_call("".join(held)) is False:
                        await self._emit(send, "".join(held))  # plain text: stream it from now on
                        held = None
                else:
                    await self._emit(send, released)
                if stops.stopped:
                    finish_reason = "stop_sequence"
                    break
        if held is not None:
            text = "".join(held)
            call = parse_tool_call(text, tools)
            if call is not None:
                self._tool_calls = [call]
                self._logprobs.clear()  # a call's tokens have no place in the content's logprobs
            else:
                await self._emit(send, text)
        return await self._result(finish_reason)

    async def _result(self, finish_reason: FinishReason) -> GeneratedText:
        prompt_tokens = await self._prompt_tokens()  # counted now, if it must be: the stream has ended
        cached = self._cached_tokens
        if cached is not None and prompt_tokens is not None:
            cached = min(cached, prompt_tokens)  # a continuation's cache may cover its prefix too
        return GeneratedText(
            message_id=self.work.message_id,
            text="".join(self._text),
            finish_reason=finish_reason,
            generated_tokens=self._generated,
            prompt_tokens=prompt_tokens,
            tool_calls=self._tool_calls,
            prefix_tokens=self._prefix_tokens,
            cached_tokens=cached,
        )

    async def _prompt_tokens(self, wait: float | None = None) -> int | None:
        return await self._prompt_count.result(wait) if self._prompt_count is not None else None

    async def _emit(self, send: Send, text: str) -> None:
        if text:
            problem = text_problem(text)
            if problem is not None:
                raise UnsendableText(problem)
            self._text.append(text)
            logprobs = None
            if self._logprobs:
                logprobs = [entry.model_dump(mode="json") for entry in self._logprobs]
                self._logprobs = []
            await send(TokenFrame(message_id=self.work.message_id, text=text, logprobs=logprobs))


def _facts(info: BackendInfo) -> ModelFacts:
    return ModelFacts(
        context_length=info.max_total_tokens,
        max_input_length=info.max_input_length,
        chat_template=info.chat_template,
        bos_token=info.bos_token,
        eos_token=info.eos_token,
    )


def _constrained(params: SamplingParameters, schema: dict[str, object]) -> SamplingParameters:
    """``params`` with the answer constrained to ``schema`` (the backend's grammar)."""
    output = ResponseFormat(type="json_schema", json_schema=JsonSchemaFormat(name="tool_call", schema=schema))
    return params.model_copy(update={"response_format": output})
