"""The worker counts and tokenizes for the server with its backend's tokenizer (protocol 4), and cuts a
newest turn too long for the model from the left when its work asks: against the real CPU backend
(SmolLM2, its chat template from the GGUF file), through the worker's TGI adapter."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from oasst_shared.chat_template import ChatTemplateError
from oasst_shared.model_configs import SMOLLM2_135M
from oasst_shared.protocol import (
    ChatTurn,
    Detokenize,
    Detokenized,
    PromptConversation,
    Tokenize,
    Tokenized,
    TokenizeInput,
    Work,
)
from oasst_shared.token_bounds import ADDED_TOKENS, utf8_bytes
from oasst_worker.backends.tgi import TgiBackend
from oasst_worker.connection.handshake import worker_info
from oasst_worker.prompting import PromptBuilder
from oasst_worker.settings import WorkerSettings
from oasst_worker.tokenizing import PromptTokenizer
from tests.support.stacks import BackendProcess

pytestmark = pytest.mark.slow

LIMIT = SMOLLM2_135M.max_input_length
# An English text of about a token per 4.5 bytes: 12,000 characters are far over SmolLM2's 1,536 tokens.
PARAGRAPH = (
    "The committee met on Tuesday to discuss the budget for the coming year, and after a long debate "
    "about the library, the bridge and the school, it agreed to postpone the decision until spring. "
)
LONG_MESSAGE = (PARAGRAPH * 80)[:12_000]


@pytest_asyncio.fixture
async def backend(cpu_backend: BackendProcess) -> AsyncIterator[TgiBackend]:
    tgi = TgiBackend(cpu_backend.url, token_timeout=30, generation_timeout=60)
    yield tgi
    await tgi.close()


@pytest_asyncio.fixture
async def prompts(backend: TgiBackend) -> PromptBuilder:
    builder = PromptBuilder(SMOLLM2_135M, backend)
    await builder.prepare()  # the template of the GGUF file
    return builder


async def backend_ids(url: str, text: str) -> list[int]:
    async with httpx.AsyncClient(base_url=url) as http:
        response = await http.post("/tokenize", json={"inputs": text})
        response.raise_for_status()
        return [token["id"] for token in response.json()]


def work(thread: list[ChatTurn], system_prompt: str | None = None, *, cut: bool = False) -> Work:
    return Work(
        message_id="m",
        model_config_name=SMOLLM2_135M.name,
        thread=thread,
        system_prompt=system_prompt,
        cut_newest_turn=cut,
    )


async def test_counts_are_the_backends_and_a_conversation_is_counted_as_its_prompt(
    prompts: PromptBuilder, backend: TgiBackend, cpu_backend: BackendProcess
) -> None:
    tokenizer = PromptTokenizer(prompts, backend)
    thread = [ChatTurn(role="user", content="What is the capital of France?")]
    conversation = PromptConversation(thread=thread, system_prompt="Answer in one word.")
    answer = await tokenizer.answer(
        Tokenize(
            request_id="q1",
            inputs=[TokenizeInput(text="Once upon a time"), TokenizeInput(conversation=conversation)],
        )
    )
    assert isinstance(answer, Tokenized) and answer.error is None
    built = await prompts.counted(await prompts.build(work(thread, "Answer in one word.")))
    # The conversation is the prompt a work frame of it would get, counted by the backend.
    assert answer.counts == [len(await backend_ids(cpu_backend.url, "Once upon a time")), built.tokens]
    assert answer.prompt_bytes == [len("Once upon a time"), utf8_bytes(built.text)]
    assert answer.token_ids is None  # counts only, by default

    with_ids = await tokenizer.answer(
        Tokenize(request_id="q2", inputs=[TokenizeInput(text="héllo wörld")], counts_only=False)
    )
    assert isinstance(with_ids, Tokenized)
    assert with_ids.token_ids == [await backend_ids(cpu_backend.url, "héllo wörld")]
    assert with_ids.counts == [len(with_ids.token_ids[0])]
    # The CPU backend detokenizes at /detokenize (TGI has none: the same adapter then answers with an error).
    texts = await tokenizer.answer(Detokenize(request_id="q3", token_ids=with_ids.token_ids))
    assert isinstance(texts, Detokenized) and texts.error is None
    assert texts.texts[0].endswith("héllo wörld")
    # Ids outside the vocabulary: the backend refuses them, an answer that says so.
    refused = await tokenizer.answer(Detokenize(request_id="q4", token_ids=[[1, 10_000_000]]))
    assert isinstance(refused, Detokenized) and refused.error == "the backend cannot detokenize"


async def test_an_unreachable_backend_is_an_error_answer_not_an_exception(prompts: PromptBuilder) -> None:
    gone = TgiBackend("http://127.0.0.1:9", token_timeout=1, generation_timeout=1)
    try:
        answer = await PromptTokenizer(prompts, gone).answer(
            Tokenize(request_id="q", inputs=[TokenizeInput(text="hi")])
        )
    finally:
        await gone.close()
    assert isinstance(answer, Tokenized) and answer.counts == []
    assert answer.error == "the backend cannot count tokens"


async def test_the_reported_template_overhead_bounds_every_prompt_of_a_system_prompt_and_a_turn(
    prompts: PromptBuilder, backend: TgiBackend
) -> None:
    """What the server relies on to skip counting: text bytes + overhead + 8 >= the tokens."""
    overhead = PromptTokenizer(prompts, backend).prompt_overhead()
    assert overhead is not None and 0 < overhead < 1000
    settings = WorkerSettings(api_key="k" * 20)
    capabilities = worker_info(
        settings, SMOLLM2_135M, tokenizer=PromptTokenizer(prompts, backend)
    ).capabilities
    assert capabilities.tokenize and capabilities.prompt_overhead_bytes == overhead
    off = settings.model_copy(update={"answer_tokenize": False})
    assert not worker_info(
        off, SMOLLM2_135M, tokenizer=PromptTokenizer(prompts, backend)
    ).capabilities.tokenize
    for system_prompt in (None, "Be brief.", "Ünïcödé sÿstem ✓"):
        for role in ("user", "assistant"):
            for content in ("", "Hi", "naïve café " * 20):
                conversation = PromptConversation(
                    thread=[ChatTurn(role=role, content=content)], system_prompt=system_prompt
                )
                text = prompts.render_whole(conversation)
                text_bytes = utf8_bytes(system_prompt or "") + utf8_bytes(content)
                assert utf8_bytes(text) <= text_bytes + overhead
                tokens = await backend.count_tokens(text)
                assert tokens is not None and tokens <= text_bytes + overhead + ADDED_TOKENS


async def test_a_newest_turn_too_long_is_cut_from_the_left_when_the_work_asks(prompts: PromptBuilder) -> None:
    thread = [
        ChatTurn(role="user", content="An old question"),
        ChatTurn(role="assistant", content="An old answer"),
        ChatTurn(role="user", content=LONG_MESSAGE),
    ]
    with pytest.raises(
        ChatTemplateError, match=rf"need \d+ tokens, more than the model's input limit of {LIMIT}"
    ):
        await prompts.build(work(thread, "Be brief."))
    prompt = await prompts.counted(await prompts.build(work(thread, "Be brief.", cut=True)))
    assert prompt.tokens <= LIMIT
    assert prompt.tokens > LIMIT - 40  # little more than needed is cut
    kept = prompt.text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
    assert LONG_MESSAGE.endswith(kept) and 0 < len(kept) < len(LONG_MESSAGE)  # its end, its start cut
    assert "An old question" not in prompt.text and "Be brief." in prompt.text
    # A system prompt too long for the model is an error even so: nothing could be cut to fit.
    with pytest.raises(ChatTemplateError, match="the system prompt needs"):
        await prompts.build(work(thread, LONG_MESSAGE, cut=True))
