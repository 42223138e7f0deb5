"""Does a prompt fit its model? Known at submission, before anything is queued.

A worker renders a conversation into a prompt and drops its oldest turns to fit the model's input limit
(``max_input_length``); what it cannot drop is the system prompt and the newest turn. When those alone
are over the limit:

* the OpenAI-compatible API refuses the request, as OpenAI does: 400 ``context_length_exceeded`` with the
  prompt's tokens and the limit. A raw prompt (``/v1/completions``) is never cut: it must fit whole;
* the chat API follows the model config's ``chat_prompt_overflow``: ``cut`` (the default) has the worker
  drop the start of the newest message until it fits, as the original Open-Assistant server cut prompts
  from the left; ``refuse`` refuses the answer with the numbers. A system prompt that is over the limit
  with an empty message is refused either way: no cut could make it fit.

Sizes come from :mod:`..workers.prompt_sizes`: a bound for most prompts, the model's own tokenizer (a
worker's backend) for the long ones. When no worker of this process can count a long prompt in time,
the request is admitted unchecked: the worker then cuts it (chat API) or fails it with the numbers, as it
did before this check existed.
"""

from __future__ import annotations

from loguru import logger

from oasst_inference_server.domain_errors import InvalidRequest
from oasst_inference_server.scheduling.worker_registry import LiveModel
from oasst_inference_server.workers.prompt_sizes import PromptSize, PromptSizes
from oasst_shared.protocol import ChatTurn, PromptConversation, TokenizeInput
from oasst_shared.tool_calls import ToolChoice, ToolDefinition

CODE = "context_length_exceeded"  # OpenAI's


class PromptFit:
    def __init__(self, sizes: PromptSizes) -> None:
        self._sizes = sizes

    async def check_chat_completion(
        self,
        model: LiveModel,
        system_prompt: str | None,
        thread: list[ChatTurn],
        tools: list[ToolDefinition] | None = None,
        tool_choice: ToolChoice | None = None,
    ) -> None:
        """``/v1/chat/completions``: the system prompt and the last message (and the tools) must fit."""
        if not thread:
            return
        kept = PromptConversation(
            thread=thread[-1:], system_prompt=system_prompt, tools=tools, tool_choice=tool_choice
        )
        size = await self._size(model, TokenizeInput(conversation=kept))
        if size is not None and size.tokens > model.config.max_input_length:
            raise InvalidRequest(
                CODE,
                f"This model's maximum input length is {model.config.max_input_length} tokens. However, "
                f"your messages resulted in {size.tokens} tokens (the system prompt and the last message, "
                "which are always kept; older messages are dropped to fit). Please reduce the length of "
                "the messages.",
                param="messages",
            )

    async def check_completion(self, model: LiveModel, prompt: str) -> None:
        """``/v1/completions``: the raw prompt must fit whole."""
        size = await self._size(model, TokenizeInput(text=prompt))
        if size is not None and size.tokens > model.config.max_input_length:
            raise InvalidRequest(
                CODE,
                f"This model's maximum input length is {model.config.max_input_length} tokens. However, "
                f"your prompt resulted in {size.tokens} tokens. Please reduce the length of the prompt.",
                param="prompt",
            )

    async def check_chat_answer(self, model: LiveModel, system_prompt: str | None, newest: str) -> None:
        """The chat API's answer to ``newest``: cut on the worker if the model config says so (then only
        the system prompt must fit), else refused here when the two are over the limit."""
        limit = model.config.max_input_length
        cut = model.config.chat_prompt_overflow == "cut"
        kept = PromptConversation(
            thread=[ChatTurn(role="user", content="" if cut else newest)], system_prompt=system_prompt
        )
        size = await self._size(model, TokenizeInput(conversation=kept))
        if size is None or size.tokens <= limit:
            return
        if cut:
            raise InvalidRequest(
                CODE,
                f"the system prompt needs {size.tokens} tokens with an empty message; the model "
                f"{model.config.name!r} takes {limit}: shorten the system prompt",
            )
        raise InvalidRequest(
            CODE,
            f"the message and the system prompt need {size.tokens} tokens; the model "
            f"{model.config.name!r} takes {limit}: shorten the message",
        )

    async def _size(self, model: LiveModel, prompt: TokenizeInput) -> PromptSize | None:
        limit = model.config.max_input_length
        size = await self._sizes.size(
            model.config.name, prompt, limit, model.capabilities.prompt_overhead_bytes
        )
        if size is None:
            logger.info("a prompt for {} could not be counted: admitted unchecked", model.config.name)
        return size
