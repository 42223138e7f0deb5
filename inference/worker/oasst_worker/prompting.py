"""Turn a job's conversation into the prompt text the backend completes.

Tools: a chat template that renders ``tools`` gets them (and the turns' ``tool_calls``) as they are;
with any other template the tools are described in the system prompt, a call in the history is
written as the JSON the model is asked to answer with, and a tool's result becomes a user turn.

A prompt too long for the model's input limit loses its oldest turns; when the system prompt and the
newest turn alone are too long, the work's ``cut_newest_turn`` (the chat API) drops the start of that
turn, and without it the job fails with the numbers. :meth:`PromptBuilder.render_whole` renders a
conversation the same way without dropping anything, for the server's counts (``tokenize`` frames).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from loguru import logger

from oasst_shared.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplateError,
    approximate_token_count,
    merge_system_turn,
    render,
    render_truncated,
    template_takes_tools,
)
from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import ChatTurn, PromptConversation, Work
from oasst_shared.token_bounds import token_bound, utf8_bytes
from oasst_shared.tool_calls import ToolDefinition
from oasst_worker.backends.protocols import GenerationBackend


@dataclass(frozen=True)
class Prompt:
    text: str
    # The exact count, or (``exact`` False) an upper bound: enough to know the prompt fits.
    tokens: int
    # For backends that apply the chat template themselves: the conversation the text was rendered from.
    messages: list[ChatTurn] | None = None
    exact: bool = True


class PromptBuilder:
    def __init__(self, model_config: ModelConfig, backend: GenerationBackend):
        self._config = model_config
        self._backend = backend
        self.template = model_config.chat_template or CHATML_TEMPLATE
        self.bos_token = model_config.bos_token
        self.eos_token = model_config.eos_token

    async def prepare(self) -> None:
        """Resolve the chat template (from the model config or the backend) once per connection."""
        source = self._config.chat_template_source
        if source == "inline":
            return
        if self._backend.takes_messages:
            # The backend applies its own template; ours (ChatML unless inline) only sizes the truncation.
            return
        if source == "chatml":
            self.template = CHATML_TEMPLATE
            return
        info = await self._backend.info()
        if info.chat_template:
            self.template = info.chat_template
            self.bos_token = info.bos_token or self.bos_token
            self.eos_token = info.eos_token or self.eos_token
            logger.info("using the chat template of the backend's model")
        else:
            logger.warning("the backend reports no chat template: falling back to ChatML")

    async def count_tokens(self, text: str) -> int:
        counted = await self._backend.count_tokens(text)
        return counted if counted is not None else approximate_token_count(text)

    async def counted(self, prompt: Prompt) -> Prompt:
        """``prompt`` with its exact token count."""
        if prompt.exact:
            return prompt
        return replace(prompt, tokens=await self.count_tokens(prompt.text), exact=True)

    async def _size(self, text: str, limit: int | None = None) -> int:
        """A candidate prompt's size for truncation: its bound when that fits the input limit (``limit``,
        the model's by default: it then fits, whatever the exact count), else the exact count."""
        bound = token_bound(text)
        if bound <= (self._config.max_input_length if limit is None else limit):
            return bound
        return await self.count_tokens(text)

    def _assemble(
        self, conversation: Work | PromptConversation
    ) -> tuple[list[ChatTurn], str | None, list[dict[str, Any]] | None]:
        """What the template renders: (the turns, the system prompt, the tools it is given)."""
        thread, system_prompt, tools = list(conversation.thread), conversation.system_prompt, None
        offered = conversation.tools if conversation.tools and conversation.tool_choice != "none" else None
        if self._backend.takes_messages:
            pass  # the backend renders the tools itself; the ChatML rendering only sizes the prompt
        elif offered and template_takes_tools(self.template):
            tools = [t.model_dump(mode="json", exclude_none=True) for t in offered]
        elif offered or any(t.role == "tool" or t.tool_calls for t in thread):
            thread = [_as_text(t) for t in thread]
            if offered:
                listing = tools_prompt(offered)
                system_prompt = f"{system_prompt}\n\n{listing}" if system_prompt else listing
        return thread, system_prompt, tools

    def template_overhead(self) -> int | None:
        """The most UTF-8 bytes the template adds to the text of a system prompt and one turn (a user's
        or an assistant's, with a system prompt or without): the server bounds a short prompt's tokens
        with it instead of asking for a count. None if the template renders none of them."""
        placeholder = "x"
        added: list[int] = []
        for system_prompt in (None, placeholder):
            for role in ("user", "assistant"):
                turn = ChatTurn(role=role, content=placeholder)
                try:
                    text = render(
                        self.template,
                        [turn],
                        system_prompt=system_prompt,
                        bos_token=self.bos_token,
                        eos_token=self.eos_token,
                    )
                except ChatTemplateError:
                    continue  # a template may refuse a conversation that starts with the assistant
                contents = len(placeholder) * (2 if system_prompt else 1)
                added.append(utf8_bytes(text) - contents)
        # Beyond the template: a leading system turn joins the system prompt with a blank line.
        return max(added) + len("\n\n") if added else None

    def render_whole(self, conversation: PromptConversation) -> str:
        """The prompt :meth:`build` would render from ``conversation`` if nothing had to be dropped."""
        thread, system_prompt, tools = self._assemble(conversation)
        turns, system_prompt = merge_system_turn(thread, system_prompt)
        return render(
            self.template,
            turns,
            system_prompt=system_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            tools=tools,
        )

    async def build(self, work: Work, reserve: int = 0) -> Prompt:
        """The prompt; its ``tokens`` may be only an upper bound (``exact`` False): see :meth:`counted`.
        ``reserve``: input tokens that go after it (a continued answer's start), which it leaves room for."""
        if work.raw_prompt is not None:
            return Prompt(work.raw_prompt, token_bound(work.raw_prompt), exact=False)
        thread, system_prompt, tools = self._assemble(work)
        limit = max(1, self._config.max_input_length - reserve)

        async def size(text: str) -> int:
            return await self._size(text, limit)

        rendered = await render_truncated(
            self.template,
            thread,
            max_input_tokens=limit,
            count_tokens=size,
            system_prompt=system_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
            tools=tools,
            cut_newest=work.cut_newest_turn,
        )
        if rendered.dropped_turns:
            logger.info("message {}: dropped {} old turns to fit", work.message_id, rendered.dropped_turns)
        if rendered.cut_characters:
            logger.info(
                "message {}: cut {} characters from the start of the newest turn to fit",
                work.message_id,
                rendered.cut_characters,
            )
        messages = (
            _kept_messages(work, rendered.dropped_turns, rendered.cut_characters)
            if self._backend.takes_messages
            else None
        )
        bounded = token_bound(rendered.text) <= limit  # as size decided
        return Prompt(rendered.text, rendered.prompt_tokens, messages, exact=not bounded)


def _kept_messages(work: Work, dropped_turns: int, cut_characters: int = 0) -> list[ChatTurn]:
    """The system prompt and the turns that fit, as render_truncated kept them (it counts from the first
    non-system turn and merges a leading system turn into the system prompt), the newest cut as it was."""
    turns, system = merge_system_turn(work.thread, work.system_prompt)
    head = [ChatTurn(role="system", content=system)] if system else []
    kept = turns[dropped_turns:]
    if cut_characters:
        kept[-1] = kept[-1].model_copy(update={"content": kept[-1].content[cut_characters:]})
    return head + kept


def tools_prompt(tools: list[ToolDefinition]) -> str:
    """The tools, described for a model whose chat template does not render them."""
    listing = "\n".join(json.dumps(t.model_dump(mode="json", exclude_none=True)) for t in tools)
    return (
        "You can call the following tools. To call one, answer with only a JSON object "
        '{"name": <the tool name>, "arguments": <the arguments as a JSON object>}.\n'
        f"<tools>\n{listing}\n</tools>"
    )


def _as_text(turn: ChatTurn) -> ChatTurn:
    """A tool turn, or an assistant turn that called tools, as plain text for a template without tools."""
    if turn.role == "tool":
        return ChatTurn(role="user", content=f"<tool_response>\n{turn.content}\n</tool_response>")
    if turn.tool_calls:
        calls = "\n".join(
            f'{{"name": {json.dumps(c.function.name)}, "arguments": {c.function.arguments or "{}"}}}'
            for c in turn.tool_calls
        )
        return ChatTurn(role=turn.role, content=f"{turn.content}\n{calls}".strip())
    return turn
