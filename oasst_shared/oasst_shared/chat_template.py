"""Render a conversation into a prompt with a Jinja chat template (the Hugging Face convention).

Templates see ``messages`` (a list of ``{"role", "content"}``, with ``tool_calls`` and ``tool_call_id``
where a turn has them), ``add_generation_prompt``, ``bos_token``, ``eos_token``, ``raise_exception``
and, when tools are offered, ``tools`` (OpenAI's tool definitions), exactly as ``transformers``
provides them, so the template stored in a model's GGUF metadata or ``tokenizer_config.json`` works
unchanged. :func:`template_takes_tools` tells whether a template renders ``tools`` itself.

:func:`render_truncated` fits the prompt into a token budget: it always keeps the system prompt and
the newest turn and drops the oldest turns first; asked to, it cuts the start of the newest turn too,
when the system prompt and that turn alone do not fit (the original Open-Assistant server cut prompts
from the left).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from oasst_shared.protocol import ChatTurn

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

TokenCounter = Callable[[str], int] | Callable[[str], Awaitable[int]]


class ChatTemplateError(ValueError):
    """The template is invalid, raised an exception, or the conversation cannot fit."""


def approximate_token_count(text: str) -> int:
    """A conservative estimate (about 3 characters a token) for when no tokenizer is at hand."""
    return len(text) // 3 + 1


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


@lru_cache(maxsize=32)
def _compile(template: str) -> Any:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise ChatTemplateError(f"invalid chat template: {exc}") from None


def template_takes_tools(template: str) -> bool:
    """True when the template renders the ``tools`` variable (most recent models' templates do)."""
    return "tools" in template


def _message(turn: ChatTurn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": turn.role, "content": turn.content}
    if turn.tool_calls:
        # Templates read the arguments as a mapping (``arguments | tojson``), as transformers passes them.
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": _arguments(call.function.arguments)},
            }
            for call in turn.tool_calls
        ]
    if turn.tool_call_id is not None:
        message["tool_call_id"] = turn.tool_call_id
    return message


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def render(
    template: str,
    turns: Sequence[ChatTurn],
    *,
    system_prompt: str | None = None,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """Render ``turns`` (after an optional system prompt) with ``template``."""
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.extend(_message(t) for t in turns)
    context: dict[str, Any] = {"tools": tools} if tools else {}
    try:
        return str(
            _compile(template).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                **context,
            )
        )
    except TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from None


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    prompt_tokens: int
    dropped_turns: int
    # Characters cut from the start of the newest turn (``cut_newest``): 0 when it was kept whole.
    cut_characters: int = 0


def merge_system_turn(
    turns: Sequence[ChatTurn], system_prompt: str | None
) -> tuple[list[ChatTurn], str | None]:
    """A leading ``system`` turn merged into the system prompt, as every rendering of a work's prompt
    treats it: (the other turns, the system prompt)."""
    rest = list(turns)
    if rest and rest[0].role == "system":
        leading = rest.pop(0).content
        system_prompt = f"{system_prompt}\n\n{leading}" if system_prompt else leading
    return rest, system_prompt


async def render_truncated(
    template: str,
    turns: Sequence[ChatTurn],
    *,
    max_input_tokens: int,
    count_tokens: TokenCounter = approximate_token_count,
    system_prompt: str | None = None,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
    cut_newest: bool = False,
) -> RenderedPrompt:
    """Render the newest suffix of ``turns`` that fits in ``max_input_tokens``.

    ``count_tokens`` may be a plain or an async function (e.g. a call to the backend's tokenizer).

    A leading ``system`` turn in ``turns`` is treated like ``system_prompt``: it is always kept.
    Turns are dropped oldest first, and a leading assistant turn left over after dropping is dropped
    too, so the kept conversation starts with the user. When even the system prompt and the newest turn
    do not fit, ``cut_newest`` drops the start of the newest turn's text until they do; otherwise, or
    when the system prompt alone does not fit, raises :class:`ChatTemplateError` with the numbers.
    """
    turns, system_prompt = merge_system_turn(turns, system_prompt)
    if not turns:
        raise ChatTemplateError("the conversation has no turns to answer")

    async def _render(start: int, cut: int = 0) -> tuple[str, int]:
        kept = turns[start:]
        if cut:
            kept[-1] = kept[-1].model_copy(update={"content": kept[-1].content[cut:]})
        text = render(
            template,
            kept,
            system_prompt=system_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=tools,
        )
        count = count_tokens(text)
        if inspect.isawaitable(count):
            count = await count
        return text, int(count)

    # Binary search for the smallest start index that fits: token counts only shrink as start grows.
    lo, hi = 0, len(turns) - 1
    text, tokens = await _render(hi)
    if tokens > max_input_tokens:
        if not cut_newest:
            raise ChatTemplateError(
                f"the newest message and system prompt need {tokens} tokens, more than the model's "
                f"input limit of {max_input_tokens}"
            )
        return await _cut_newest(
            lambda cut: _render(hi, cut), len(turns[-1].content), tokens, max_input_tokens, hi
        )
    best = (hi, text, tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        text, tokens = await _render(mid)
        if tokens <= max_input_tokens:
            best = (mid, text, tokens)
            hi = mid
        else:
            lo = mid + 1
    start, text, tokens = best
    while start < len(turns) - 1 and turns[start].role in ("assistant", "tool"):
        start += 1
        text, tokens = await _render(start)
    return RenderedPrompt(text=text, prompt_tokens=tokens, dropped_turns=start)


async def _cut_newest(
    render_cut: Callable[[int], Awaitable[tuple[str, int]]],
    length: int,
    tokens: int,
    max_input_tokens: int,
    dropped_turns: int,
) -> RenderedPrompt:
    """The prompt with the fewest characters cut from the start of the newest turn (of ``length``
    characters, ``tokens`` whole) that fits. Each probe is a count (a round trip to the backend's
    tokenizer), so the cut is found by interpolation on the counts, with every other step a bisection
    (a few probes where the text is even, never more than twice a bisection's)."""
    text, emptied = await render_cut(length)
    if emptied > max_input_tokens:
        raise ChatTemplateError(
            f"the system prompt needs {emptied} tokens with an empty message, more than the model's "
            f"input limit of {max_input_tokens}"
        )
    # Invariant: cutting ``short`` characters does not fit (``over`` tokens); cutting ``enough`` does.
    short, over = 0, tokens
    enough, best = length, (text, emptied)
    bisect = False
    while enough - short > 1:
        if bisect:
            probe = (short + enough) // 2
        else:
            fitting = best[1]
            share = (over - max_input_tokens) / max(1, over - fitting)
            probe = short + int(share * (enough - short)) + 1
        probe = min(max(probe, short + 1), enough - 1)
        bisect = not bisect
        text, counted = await render_cut(probe)
        if counted <= max_input_tokens:
            enough, best = probe, (text, counted)
        else:
            short, over = probe, counted
    return RenderedPrompt(
        text=best[0], prompt_tokens=best[1], dropped_turns=dropped_turns, cut_characters=enough
    )


# Tokenizers hardly ever make one token of more characters than this: a conversation cut to
# ``max_input_tokens * MAX_CHARS_PER_TOKEN`` characters still holds everything an exact truncation keeps.
MAX_CHARS_PER_TOKEN = 16


def cut_to_budget(
    turns: Sequence[ChatTurn], *, max_input_tokens: int, system_prompt: str | None = None
) -> list[ChatTurn]:
    """The newest turns that can matter for a prompt of ``max_input_tokens`` (the server's cut before it
    sends the work; the worker's :func:`render_truncated` then cuts exactly, with the model's tokenizer).

    Keeps a leading ``system`` turn and the newest turn whatever their size, then as many of the newest
    other turns as fit in a character budget that no tokenizer's real budget exceeds.
    """
    turns = list(turns)
    head = [turns.pop(0)] if turns and turns[0].role == "system" else []
    if not turns:
        return head
    budget = max_input_tokens * MAX_CHARS_PER_TOKEN - len(system_prompt or "")
    budget -= sum(len(t.content) for t in head) + len(turns[-1].content)
    start = len(turns) - 1
    while start > 0 and budget - len(turns[start - 1].content) >= 0:
        budget -= len(turns[start - 1].content)
        start -= 1
    return head + turns[start:]
