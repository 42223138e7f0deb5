"""A work frame with an ``answer_prefix`` (the text a lost worker streamed): the prefix goes after the
rendered prompt, with no end-of-turn; the token budget and the input limit count it; the job sends only
what follows, with the prefix's token count."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from oasst_shared.chat_template import CHATML_TEMPLATE, render
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import ChatTurn, GeneratedText, Work
from oasst_shared.sampling import SamplingParameters
from oasst_shared.token_frames import TokenFrame
from oasst_worker.backends.protocols import GenerationBackend
from oasst_worker.backends.records import BackendInfo, GenerationResult, StreamedToken
from tests.support.worker_jobs import run_generation

CONFIG = SMOLLM2_135M.model_copy(update={"chat_template_source": "chatml"})
STORY = [ChatTurn(role="user", content="tell me a story")]


def words(text: str) -> int:
    """The fake tokenizer: one token a word."""
    return len(text.split())


class Recording(GenerationBackend):
    """Generates " in a land", reporting the prompt's count as a backend does (the prefix included)."""

    def __init__(self) -> None:
        self.prompts: list[tuple[str, int]] = []

    async def info(self) -> BackendInfo:
        return BackendInfo()

    async def healthy(self) -> bool:
        return True

    async def count_tokens(self, text: str) -> int | None:
        return words(text)

    async def generate_stream(self, prompt: str, params: Any, max_new_tokens: int) -> AsyncIterator[Any]:
        self.prompts.append((prompt, max_new_tokens))
        for piece in (" in", " a", " land"):
            yield StreamedToken(piece)
        yield GenerationResult(" in a land", "length", 3, prompt_tokens=words(prompt))


def continued(prefix: str | None, thread: list[ChatTurn] = STORY, max_new_tokens: int = 100) -> Work:
    return Work(
        message_id="m1",
        model_config_name=CONFIG.name,
        thread=thread,
        sampling_parameters=SamplingParameters(max_new_tokens=max_new_tokens),
        answer_prefix=prefix,
    )


async def run(backend: Recording, job_work: Work, config=CONFIG) -> tuple[list[str], GeneratedText]:
    frames = await run_generation(backend, job_work, config)
    result = frames.sent[-1]
    assert isinstance(result, GeneratedText)
    return [f.text for f in frames.sent if isinstance(f, TokenFrame)], result


async def test_the_prefix_follows_the_prompt_and_only_what_follows_is_sent() -> None:
    backend = Recording()
    tokens, result = await run(backend, continued("Once upon a time"))
    ((prompt, max_new_tokens),) = backend.prompts
    rendered = render(CHATML_TEMPLATE, STORY)
    assert prompt == rendered + "Once upon a time"  # no end-of-turn between them
    assert max_new_tokens == 100 - 4  # the budget less the prefix's tokens
    assert tokens == [" in", " a", " land"]
    assert result.text == " in a land" and result.generated_tokens == 3 and result.prefix_tokens == 4
    assert result.prompt_tokens == words(rendered)  # the prefix is not part of the prompt's count


async def test_without_a_prefix_nothing_changes() -> None:
    backend = Recording()
    _, result = await run(backend, continued(None))
    ((prompt, max_new_tokens),) = backend.prompts
    assert prompt == render(CHATML_TEMPLATE, STORY) and max_new_tokens == 100
    assert result.prefix_tokens is None and "prefix_tokens" not in result.model_dump_json(exclude_none=True)


async def test_a_prefix_that_used_the_whole_budget_ends_at_once() -> None:
    backend = Recording()
    tokens, result = await run(backend, continued("one two three four", max_new_tokens=4))
    assert backend.prompts == [] and tokens == []
    assert result.finish_reason == "length" and result.text == "" and result.prefix_tokens == 4


async def test_the_prefix_counts_against_the_input_limit() -> None:
    thread = [
        ChatTurn(role="user" if i % 2 == 0 else "assistant", content=f"turn {i} " * 3) for i in range(7)
    ]
    config = CONFIG.model_copy(update={"max_input_length": 60})
    alone = Recording()
    await run(alone, continued(None, thread), config)
    assert "turn 0" in alone.prompts[0][0]  # without a prefix every turn fits
    backend = Recording()
    await run(backend, continued("a b c d e f g h i j k l m n o p q r s t", thread), config)
    ((prompt, _),) = backend.prompts
    assert words(prompt) <= 60  # older turns made room for the prefix
    assert prompt.endswith("a b c d e f g h i j k l m n o p q r s t")
    assert "turn 0" not in prompt
