"""Serving the Anthropic Messages API on the OpenAI-compatible API's machinery.

A request is converted into the internal request (:mod:`.conversion`) and then takes the path of a
``/v1/chat/completions`` request with one choice: the same bounds (``admission.request_bounds``), model
resolution, capability and schema checks, prompt fit, admission (per-user rate and concurrency, queue),
message, queue, worker, usage record and scrub (:class:`OpenAIService`). Counting tokens renders the
conversation as the worker would and counts it with the model's own tokenizer, as prompts are sized at
admission (:mod:`..workers.prompt_sizes`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError
from sqlmodel.ext.asyncio.session import AsyncSession

from oasst_inference_server.admission.request_bounds import check_chat_completion_bounds
from oasst_inference_server.anthropic_api.conversion import to_internal
from oasst_inference_server.anthropic_api.schemas import CountTokensRequest, MessagesRequest
from oasst_inference_server.auth.caller import Caller
from oasst_inference_server.db.models import DbMessage
from oasst_inference_server.domain_errors import InvalidRequest, ServiceUnavailable
from oasst_inference_server.openai_api.openai_service import IsDisconnected, OpenAIService
from oasst_inference_server.openai_api.request_admission import admit
from oasst_inference_server.openai_protocol.generation_requests import ChatCompletionRequest
from oasst_inference_server.scheduling.worker_registry import LiveModel
from oasst_inference_server.workers.prompt_sizes import PromptSizes
from oasst_shared.protocol import PromptConversation, TokenizeInput
from oasst_shared.schemas import MessageRead


@dataclass(frozen=True)
class Submitted:
    """A queued request: its message, the model it runs on, and the request."""

    message: DbMessage
    model: LiveModel
    request: MessagesRequest


_TOOL_SCHEMA = "tools[{i}].input_schema"  # a forced tool's schema, named as this API names it


class AnthropicService:
    def __init__(self, openai: OpenAIService, prompt_sizes: PromptSizes | None) -> None:
        self.openai = openai
        self._sizes = prompt_sizes

    async def _checked(self, request: CountTokensRequest) -> tuple[ChatCompletionRequest, LiveModel]:
        """The internal request, within the deployment's bounds, and its live generation model."""
        internal = to_internal(request)
        check_chat_completion_bounds(self.openai.settings, internal)
        model = await self.openai.resolve_model(internal.model, "generation")
        return internal, model

    async def submit(self, session: AsyncSession, caller: Caller, request: MessagesRequest) -> Submitted:
        """Check and queue the request (one message); the caller's limits count it."""
        internal = to_internal(request)
        admitted = await admit(self.openai, internal, tool_schema_param=_TOOL_SCHEMA)
        system_prompt, thread = internal.to_thread()
        (message,) = await self.openai.submit_chat(
            session,
            caller,
            admitted.model,
            [admitted.sampling],
            system_prompt,
            thread,
            internal.tools or None,
            internal.tool_choice,
        )
        return Submitted(message, admitted.model, request)

    async def wait(self, submitted: Submitted, is_disconnected: IsDisconnected) -> MessageRead:
        """The finished answer (``GenerationFailed`` if it failed, ``ClientGone`` if the client left)."""
        return await self.openai.wait(submitted.message, is_disconnected)

    async def count_tokens(self, caller: Caller, request: CountTokensRequest) -> int:
        """The prompt's tokens as the model's worker renders and tokenizes it (system prompt, turns, tools);
        the caller's limits take it as a request (``OpenAIService.admit_question``)."""
        internal, model = await self._checked(request)
        await self.openai.admit_question(caller, model)
        system_prompt, thread = internal.to_thread()
        offered = internal.tools if internal.tools and internal.tool_choice != "none" else None
        try:
            conversation = PromptConversation(
                thread=thread,
                system_prompt=system_prompt,
                tools=offered,
                tool_choice=internal.tool_choice if offered else None,
            )
        except ValidationError as exc:
            message = str(exc.errors(include_url=False)[0]["msg"]).removeprefix("Value error, ")
            raise InvalidRequest("invalid_request", f"messages: {message}") from None
        size = None
        if self._sizes is not None:
            # A limit below any prompt: the count is always the tokenizer's, never a bound.
            size = await self._sizes.size(
                model.config.name,
                TokenizeInput(conversation=conversation),
                limit=-1,
                reported_overhead=model.capabilities.prompt_overhead_bytes,
            )
        if size is None:
            raise ServiceUnavailable(
                "count_unavailable",
                f"no worker of {model.config.name!r} could count the prompt's tokens right now; retry shortly",
                retry_after=5,
            )
        return size.tokens
