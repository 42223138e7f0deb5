"""Turn a job's conversation into the prompt text the backend completes."""

from __future__ import annotations

from dataclasses import dataclass

from loguru import logger

from oasst_shared.chat_template import CHATML_TEMPLATE, approximate_token_count, render_truncated
from oasst_shared.model_configs import ModelConfig
from oasst_shared.protocol import ChatTurn, Work
from oasst_worker.backends.protocols import GenerationBackend


@dataclass(frozen=True)
class Prompt:
    text: str
    tokens: int
    # For backends that apply the chat template themselves: the conversation the text was rendered from.
    messages: list[ChatTurn] | None = None


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

    async def build(self, work: Work) -> Prompt:
        if work.raw_prompt is not None:
            return Prompt(work.raw_prompt, await self.count_tokens(work.raw_prompt))
        rendered = await render_truncated(
            self.template,
            work.thread,
            max_input_tokens=self._config.max_input_length,
            count_tokens=self.count_tokens,
            system_prompt=work.system_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )
        if rendered.dropped_turns:
            logger.info("message {}: dropped {} old turns to fit", work.message_id, rendered.dropped_turns)
        messages = _kept_messages(work, rendered.dropped_turns) if self._backend.takes_messages else None
        return Prompt(rendered.text, rendered.prompt_tokens, messages)


def _kept_messages(work: Work, dropped_turns: int) -> list[ChatTurn]:
    """The system prompt and the turns that fit, as render_truncated kept them (it counts from the first
    non-system turn and merges a leading system turn into the system prompt)."""
    turns = list(work.thread)
    system = work.system_prompt
    if turns and turns[0].role == "system":
        leading = turns.pop(0).content
        system = f"{system}\n\n{leading}" if system else leading
    head = [ChatTurn(role="system", content=system)] if system else []
    return head + turns[dropped_turns:]
