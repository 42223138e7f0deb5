"""Reading a worker's frames defensively: what a refused frame belongs to, and usage the server trusts.

A frame the protocol refuses (invalid text, over the frame limit, a bad field) is blamed on the
messages it names, when it names any: :func:`salvage` returns the parts that are valid and the message
ids of the parts that are not, so only those messages fail (and an answer to a question of the server,
``tokenized`` or ``detokenized``, fails only its question). Only a frame that names no message
(garbage, a wrong type) is held against the whole connection.

:func:`bounded_usage` caps the token counts a worker reports by what the server itself saw: a worker
cannot bill more tokens than the message allowed, than the text it streamed could hold, or a prompt
larger than the text the server sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TypeAlias

from pydantic import ValidationError

from oasst_shared.protocol import (
    GeneratedText,
    ProtocolError,
    Token,
    Work,
    WorkerFrame,
    top_level_strings,
)
from oasst_shared.token_frames import TokenFrames, decode_worker_frame, from_model

# Slack for tokens that leave no text (a stop sequence cut from the answer, special tokens).
USAGE_SLACK_TOKENS = 64
# Chat-template tokens a turn may add around its text.
TEMPLATE_TOKENS_PER_TURN = 16
TEMPLATE_TOKENS = 256


# Answers to the server's questions (protocol 4): they name a request, not a message.
_ANSWERS = ("tokenized", "detokenized")

# A frame as the connection handles it: tokens as plain tuples (the hot path), the rest as models.
ReceivedFrame: TypeAlias = TokenFrames | WorkerFrame


@dataclass
class Salvaged:
    frames: list[ReceivedFrame] = field(default_factory=list)
    refused: dict[str, str] = field(default_factory=dict)  # message id -> why
    calls: dict[str, str] = field(default_factory=dict)  # request id of a refused answer -> why


def salvage(text: str | bytes, error: str) -> Salvaged | None:
    """The valid parts of a refused frame and the messages of the invalid ones; None if it names none."""
    try:
        data = json.loads(text)
    except RecursionError:  # nesting deeper than the parser goes: its message, if it names one
        message_id = top_level_strings(text, ("message_id",)).get("message_id")
        return Salvaged(refused={message_id: error}) if message_id is not None else None
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    result = Salvaged()
    if data.get("type") == "token_batch" and isinstance(data.get("tokens"), list):
        valid = TokenFrames([])
        for item in data["tokens"]:
            message_id = item.get("message_id") if isinstance(item, dict) else None
            try:
                valid.tokens.append(from_model(Token.model_validate(item)))
            except ValidationError as exc:
                if isinstance(message_id, str):
                    result.refused[message_id] = _first(exc)
        if valid.tokens:
            result.frames.append(valid)
    elif isinstance(data.get("message_id"), str):
        result.refused[data["message_id"]] = error
    elif data.get("type") in _ANSWERS and isinstance(data.get("request_id"), str):
        result.calls[data["request_id"]] = error  # the question it answers fails alone
    return result if result.refused or result.calls else None


def parse_or_salvage(text: str | bytes) -> tuple[ReceivedFrame | None, Salvaged | None, str | None]:
    """(the frame, None, None), or (None, what can be saved, the error) for a refused frame."""
    try:
        return decode_worker_frame(text), None, None
    except ProtocolError as exc:
        return None, salvage(text, str(exc)), str(exc)


def token_cap(work: Work) -> int:
    """The most token frames a worker may send for ``work``: its max_new_tokens, plus the slack of
    tokens that leave no text. Frames past it are dropped, so a worker cannot make the server keep or
    relay an answer longer than it asked for."""
    return work.sampling_parameters.max_new_tokens + USAGE_SLACK_TOKENS


def utf8_size(text: str) -> int:
    """Bytes of ``text`` in UTF-8. Called per relayed token: str.isascii() reads a flag CPython keeps,
    so most tokens are measured without being encoded."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def bounded_usage(result: GeneratedText, work: Work | None, streamed_bytes: int) -> GeneratedText:
    """``result`` with its token counts capped by what the server sent and saw streamed (a continuation's
    prefix by the prefix sent, the cached tokens by the prompt)."""
    text_bytes = utf8_size(result.text)
    # A token carries at least one byte of text, save those a stop sequence cut or specials.
    generated_cap = max(streamed_bytes, text_bytes) + USAGE_SLACK_TOKENS
    if work is not None:
        generated_cap = min(generated_cap, work.sampling_parameters.max_new_tokens)
    generated = min(result.generated_tokens, generated_cap)
    prompt = result.prompt_tokens
    if prompt is not None and work is not None:
        sent = sum(len(t.content.encode("utf-8")) for t in work.thread)
        sent += len((work.system_prompt or "").encode("utf-8")) + len((work.raw_prompt or "").encode("utf-8"))
        prompt = min(prompt, sent + TEMPLATE_TOKENS_PER_TURN * len(work.thread) + TEMPLATE_TOKENS)
    prefix = result.prefix_tokens
    if prefix is not None:
        answer_prefix = work.answer_prefix if work is not None else None
        prefix = min(prefix, utf8_size(answer_prefix) + USAGE_SLACK_TOKENS) if answer_prefix else None
    cached = result.cached_tokens
    if cached is not None:
        cached = min(cached, prompt or 0)
    if (generated, prompt, prefix, cached) == (
        result.generated_tokens,
        result.prompt_tokens,
        result.prefix_tokens,
        result.cached_tokens,
    ):
        return result
    return result.model_copy(
        update={
            "generated_tokens": generated,
            "prompt_tokens": prompt,
            "prefix_tokens": prefix,
            "cached_tokens": cached,
        }
    )


def _first(exc: ValidationError) -> str:
    error = exc.errors(include_url=False, include_input=False)[0]
    return f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
