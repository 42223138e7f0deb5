from __future__ import annotations

import pytest

from oasst_shared.chat_template import (
    CHATML_TEMPLATE,
    ChatTemplateError,
    render,
    render_truncated,
)
from oasst_shared.protocol import ChatTurn

# The shape of a Hugging Face template that uses raise_exception and special tokens.
STRICT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'assistant' and loop.first %}{{ raise_exception('must start with user') }}{% endif %}"
    "[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


def turns(*pairs: tuple[str, str]) -> list[ChatTurn]:
    return [ChatTurn(role=r, content=c) for r, c in pairs]  # type: ignore[arg-type]


def word_count(text: str) -> int:
    return len(text.split())


def test_chatml_rendering():
    text = render(CHATML_TEMPLATE, turns(("user", "hi")), system_prompt="sys")
    assert (
        text == "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_special_tokens_and_generation_prompt():
    text = render(STRICT_TEMPLATE, turns(("user", "a")), bos_token="<s>", eos_token="</s>")
    assert text == "<s>[user]a</s>[assistant]"
    no_prompt = render(STRICT_TEMPLATE, turns(("user", "a")), add_generation_prompt=False)
    assert not no_prompt.endswith("[assistant]")


def test_template_exceptions_become_chat_template_errors():
    with pytest.raises(ChatTemplateError, match="must start with user"):
        render(STRICT_TEMPLATE, turns(("assistant", "a")))
    with pytest.raises(ChatTemplateError):
        render("{% for %}", turns(("user", "a")))


def test_sandbox_blocks_attribute_escapes():
    with pytest.raises(ChatTemplateError):
        render("{{ messages.__class__.__mro__[1].__subclasses__() }}", turns(("user", "a")))


async def test_truncation_keeps_everything_when_it_fits():
    conversation = turns(("user", "one"), ("assistant", "two"), ("user", "three"))
    result = await render_truncated(
        CHATML_TEMPLATE, conversation, max_input_tokens=1000, count_tokens=word_count
    )
    assert result.dropped_turns == 0
    assert "one" in result.text and "three" in result.text
    assert result.prompt_tokens == word_count(result.text)


async def test_truncation_drops_oldest_turns_and_keeps_system_prompt():
    conversation = turns(
        ("user", "old " * 50),
        ("assistant", "older answer " * 20),
        ("user", "middle question"),
        ("assistant", "middle answer"),
        ("user", "newest question"),
    )
    result = await render_truncated(
        CHATML_TEMPLATE, conversation, max_input_tokens=20, count_tokens=word_count, system_prompt="be brief"
    )
    assert "be brief" in result.text
    assert "newest question" in result.text
    assert "old old" not in result.text
    assert result.prompt_tokens <= 20
    # What is kept starts with a user turn, never a dangling assistant answer.
    first_turn = result.text.split("<|im_start|>")[2]
    assert first_turn.startswith("user")


async def test_leading_system_turn_is_kept_like_a_system_prompt():
    conversation = turns(
        ("system", "SYSTEM RULES"), ("user", "x " * 100), ("assistant", "y"), ("user", "last")
    )
    result = await render_truncated(
        CHATML_TEMPLATE, conversation, max_input_tokens=15, count_tokens=word_count
    )
    assert "SYSTEM RULES" in result.text and "last" in result.text and "x x" not in result.text


async def test_async_token_counter():
    async def count(text: str) -> int:
        return word_count(text)

    result = await render_truncated(
        CHATML_TEMPLATE, turns(("user", "hi")), max_input_tokens=50, count_tokens=count
    )
    assert result.prompt_tokens == word_count(result.text)


async def test_newest_turn_too_long_is_an_error():
    with pytest.raises(ChatTemplateError, match="input limit"):
        await render_truncated(
            CHATML_TEMPLATE, turns(("user", "word " * 100)), max_input_tokens=10, count_tokens=word_count
        )


async def test_no_turns_is_an_error():
    with pytest.raises(ChatTemplateError):
        await render_truncated(CHATML_TEMPLATE, [], max_input_tokens=10)


def test_cut_to_budget_keeps_the_system_turn_and_the_newest_turns() -> None:
    from oasst_shared.chat_template import MAX_CHARS_PER_TOKEN, cut_to_budget
    from oasst_shared.protocol import ChatTurn

    big = "x" * (10 * MAX_CHARS_PER_TOKEN)  # a turn that needs a tenth of a 100-token budget
    turns = [ChatTurn(role="system", content="be brief")]
    turns += [ChatTurn(role="user" if i % 2 == 0 else "assistant", content=f"{i}{big}") for i in range(30)]
    kept = cut_to_budget(turns, max_input_tokens=100, system_prompt="s" * 50)
    assert kept[0] == turns[0] and kept[-1] == turns[-1]
    assert 1 < len(kept) - 1 < 10  # the newest that fit, oldest dropped
    assert kept[1:] == turns[-(len(kept) - 1) :]
    assert sum(len(t.content) for t in kept) + 50 <= 100 * MAX_CHARS_PER_TOKEN + len(turns[-1].content)
    # The newest turn stays whatever its size (the worker's exact cut decides if it fits at all).
    huge = [ChatTurn(role="user", content="y" * 10_000_000)]
    assert cut_to_budget(huge, max_input_tokens=100) == huge
    assert cut_to_budget(turns[:3], max_input_tokens=100_000) == turns[:3]


async def test_a_newest_turn_too_long_is_cut_from_the_left_when_asked() -> None:
    """The fewest characters are cut from its start, so that the system prompt and the rest fit."""
    message = " ".join(f"w{i}" for i in range(100))
    probes: list[int] = []

    def counting(text: str) -> int:
        probes.append(1)
        return word_count(text)

    result = await render_truncated(
        CHATML_TEMPLATE,
        turns(("user", "an old question"), ("assistant", "an old answer"), ("user", message)),
        max_input_tokens=30,
        count_tokens=counting,
        system_prompt="be brief",
        cut_newest=True,
    )
    kept = message[result.cut_characters :]
    assert result.dropped_turns == 2 and result.cut_characters > 0
    assert result.text == render(CHATML_TEMPLATE, turns(("user", kept)), system_prompt="be brief")
    assert result.prompt_tokens == word_count(result.text) <= 30
    one_more = message[result.cut_characters - 1 :]  # keeping one character more would not fit
    assert word_count(render(CHATML_TEMPLATE, turns(("user", one_more)), system_prompt="be brief")) > 30
    assert kept.endswith("w99")  # the newest words are kept
    assert len(probes) <= 2 * len(message).bit_length() + 3  # interpolation, at worst bisection


async def test_a_cut_cannot_help_a_system_prompt_over_the_limit() -> None:
    with pytest.raises(ChatTemplateError, match="the system prompt needs 25 tokens with an empty message"):
        await render_truncated(
            CHATML_TEMPLATE,
            turns(("user", "hello")),
            max_input_tokens=10,
            count_tokens=word_count,
            system_prompt="word " * 20,
            cut_newest=True,
        )
    # Without the cut, a newest turn too long is an error, as before.
    with pytest.raises(ChatTemplateError, match="need 103 tokens, more than the model's input limit of 10"):
        await render_truncated(
            CHATML_TEMPLATE, turns(("user", "word " * 100)), max_input_tokens=10, count_tokens=word_count
        )
