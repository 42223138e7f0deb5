"""The worker socket's hot frames, ``token`` and ``token_batch``, written and read without pydantic.

Every piece of every answer crosses the worker socket in a token frame. Here a token is a
:class:`TokenFrame`, a msgspec struct, which msgspec's JSON codec writes and reads (and checks against
its declared types) in C, several times faster than a pydantic model built, dumped and validated again:

    text = encode_tokens([TokenFrame("m1", " Par"), TokenFrame("m1", "is")])   # one token_batch frame
    frame = decode_worker_frame(text)   # TokenFrames, or the pydantic model of any other frame type

The wire format is the one :class:`~oasst_shared.protocol.Token` and
:class:`~oasst_shared.protocol.TokenBatch` define (they stay the schema and the generated protocol
reference): :func:`encode_tokens` writes byte for byte what ``dump_frame`` writes for the same tokens,
so older peers read it unchanged, and :func:`decode_worker_frame` accepts exactly what
``parse_worker_frame`` accepts (tests hold the two to each other). The struct refuses unknown fields,
a message id that is not 1-64 characters, text that is not a string, a token id that is not an
integer, a log-probability that is not a number, an empty batch; msgspec refuses malformed JSON,
invalid UTF-8 and lone surrogates; a NUL in the text is checked here, and log-probability entries
(only sent when the work asked for them) by the schema's :class:`~oasst_shared.logprobs.TokenLogprob`.
A frame msgspec refuses is read again by the schema, which either refuses it too
(:class:`~oasst_shared.protocol.ProtocolError`) or is another type of frame. The frame size limit is
the reader's to apply before decoding (the server does, on the raw text).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from pydantic import TypeAdapter, ValidationError

from oasst_shared.logprobs import TokenLogprob
from oasst_shared.protocol import (
    MAX_MESSAGE_ID_CHARS,
    ProtocolError,
    Token,
    TokenBatch,
    WorkerFrame,
    parse_worker_frame,
    text_problem,
)

_logprobs_adapter: TypeAdapter[list[TokenLogprob]] = TypeAdapter(list[TokenLogprob])


class TokenFrame(msgspec.Struct, tag_field="type", tag="token", forbid_unknown_fields=True):
    """One streamed piece of an answer: the fields of :class:`~oasst_shared.protocol.Token`, in its order.

    ``logprobs`` holds the entries in their JSON form (:class:`~oasst_shared.logprobs.TokenLogprob`
    dumped with ``mode="json"``): the server relays them as they are.
    """

    message_id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_MESSAGE_ID_CHARS)]
    text: str
    token_id: int | None = None
    logprob: float | None = None
    logprobs: list[dict[str, Any]] | None = None


class _TokenBatchFrame(msgspec.Struct, tag_field="type", tag="token_batch", forbid_unknown_fields=True):
    tokens: Annotated[list[TokenFrame], msgspec.Meta(min_length=1)]


@dataclass(slots=True)
class TokenFrames:
    """The tokens of one received ``token`` or ``token_batch`` frame, in order."""

    tokens: list[TokenFrame]


class UnsendableText(ValueError):
    """Text no frame may carry (a NUL, a lone surrogate): see ``protocol.text_problem``."""


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(TokenFrame | _TokenBatchFrame)


# ---------------------------------------------------------------- encoding


def encode_tokens(tokens: Sequence[TokenFrame]) -> str:
    """One frame for ``tokens``: a ``token`` frame for one, a ``token_batch`` for several.

    Raises :class:`UnsendableText` for text that is not valid Unicode (a lone surrogate); NULs are the
    sender's to check (``protocol.text_problem``) before it queues a token."""
    if not tokens:
        raise ValueError("no tokens to encode")
    try:
        if len(tokens) == 1:
            return _encoder.encode(tokens[0]).decode()
        return _encoder.encode(_TokenBatchFrame(list(tokens))).decode()
    except UnicodeEncodeError as exc:
        raise UnsendableText(f"text is not valid Unicode ({exc.reason})") from None


# ---------------------------------------------------------------- decoding


def decode_worker_frame(data: str | bytes) -> TokenFrames | WorkerFrame:
    """A worker frame: token frames as :class:`TokenFrames`, every other type as its pydantic model.

    Raises :class:`ProtocolError` for anything the protocol refuses."""
    try:
        frame = _decoder.decode(data)
    except (msgspec.DecodeError, RecursionError):
        # Another type of frame (once per ping or per answer), or one the schema refuses too.
        return _from_models(parse_worker_frame(data))
    except UnicodeEncodeError:  # a str holding a lone surrogate (a websocket's text never does)
        raise ProtocolError("<frame>: not valid Unicode (a lone surrogate)") from None
    tokens = [frame] if isinstance(frame, TokenFrame) else frame.tokens
    for i, token in enumerate(tokens):
        problem = text_problem(token.text)
        if problem is not None:
            where = f"tokens.{i}." if len(tokens) > 1 or isinstance(frame, _TokenBatchFrame) else ""
            raise ProtocolError(f"{where}text: {problem}")
        if token.logprobs is not None:
            token.logprobs = checked_logprobs(token.logprobs)
    return TokenFrames(tokens)


def checked_logprobs(value: object) -> list[dict[str, Any]]:
    """Log-probability entries as the schema reads them (with its defaults), in their JSON form."""
    try:
        entries = _logprobs_adapter.validate_python(value)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        location = ".".join(str(p) for p in error["loc"])
        raise ProtocolError(f"logprobs.{location}: {error['msg']}") from None
    return [entry.model_dump(mode="json") for entry in entries]


def from_model(token: Token) -> TokenFrame:
    logprobs = [entry.model_dump(mode="json") for entry in token.logprobs] if token.logprobs else None
    return TokenFrame(token.message_id, token.text, token.token_id, token.logprob, logprobs)


def _from_models(frame: WorkerFrame) -> TokenFrames | WorkerFrame:
    # Token frames msgspec is stricter about than the schema (a token id of 5.0): the same tokens.
    if isinstance(frame, Token):
        return TokenFrames([from_model(frame)])
    if isinstance(frame, TokenBatch):
        return TokenFrames([from_model(token) for token in frame.tokens])
    return frame
