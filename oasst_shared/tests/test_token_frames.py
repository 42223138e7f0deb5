"""The token frames' codec writes what the protocol models write and refuses what they refuse."""

from __future__ import annotations

import json

import pytest

from oasst_shared.logprobs import TokenLogprob, TopLogprob
from oasst_shared.protocol import (
    Drain,
    GeneratedText,
    Pong,
    ProtocolError,
    Token,
    TokenBatch,
    WorkerError,
    dump_frame,
    parse_worker_frame,
)
from oasst_shared.token_frames import (
    TokenFrame,
    TokenFrames,
    UnsendableText,
    decode_worker_frame,
    encode_tokens,
)

LOGPROBS = [
    TokenLogprob(
        token=" Par",
        logprob=-0.25,
        bytes=[32, 80, 97, 114],
        top_logprobs=[TopLogprob(token=" Lon", logprob=-2.5, bytes=[32, 76, 111, 110])],
    )
]
TEXTS = [
    " Paris",
    "",
    "é",
    "日本語",
    "🙂 hi",
    'quote " and \\ backslash',
    "tab\tnew\nline\r",
    "\x1f\x7f",
    "\u2028",
]


def model_of(token: TokenFrame) -> Token:
    logprobs = [TokenLogprob.model_validate(e) for e in token.logprobs] if token.logprobs else None
    return Token(
        message_id=token.message_id,
        text=token.text,
        token_id=token.token_id,
        logprob=token.logprob,
        logprobs=logprobs,
    )


# ---------------------------------------------------------------- the same wire format


@pytest.mark.parametrize("text", TEXTS)
def test_a_token_is_written_byte_for_byte_as_the_protocol_model_writes_it(text: str) -> None:
    token = TokenFrame("m1", text)
    assert encode_tokens([token]) == dump_frame(model_of(token))


def test_every_field_and_logprobs_are_written_as_the_model_writes_them() -> None:
    entries = [e.model_dump(mode="json") for e in LOGPROBS]
    token = TokenFrame("m1", " Par", token_id=7, logprob=-0.25, logprobs=entries)
    assert encode_tokens([token]) == dump_frame(model_of(token))
    for logprob in (-0.1, -1e-7, -12.5, 0.0, -3.0):
        token = TokenFrame("m1", "x", logprob=logprob)
        assert encode_tokens([token]) == dump_frame(model_of(token))


def test_several_tokens_are_one_batch_frame_as_the_model_writes_it() -> None:
    tokens = [TokenFrame("m1", t) for t in TEXTS] + [TokenFrame("m2", " other", token_id=3)]
    expected = TokenBatch(tokens=[model_of(t) for t in tokens])
    assert encode_tokens(tokens) == dump_frame(expected)
    assert parse_worker_frame(encode_tokens(tokens)) == expected


def test_what_is_written_reads_back_as_the_same_tokens() -> None:
    entries = [e.model_dump(mode="json") for e in LOGPROBS]
    tokens = [
        TokenFrame("m1", " Par", token_id=7, logprob=-0.25, logprobs=entries),
        TokenFrame("m1", "is"),
        TokenFrame("m2", "日本"),
    ]
    assert decode_worker_frame(encode_tokens(tokens)) == TokenFrames(tokens)
    assert decode_worker_frame(encode_tokens(tokens[:1])) == TokenFrames(tokens[:1])


def test_frames_written_by_the_protocol_models_read_as_tokens() -> None:
    # What older workers send: the pydantic models' JSON, optional fields left out too.
    assert decode_worker_frame(dump_frame(Token(message_id="m", text="a", logprobs=LOGPROBS))) == TokenFrames(
        [TokenFrame("m", "a", logprobs=[e.model_dump(mode="json") for e in LOGPROBS])]
    )
    assert decode_worker_frame('{"type":"token","message_id":"m","text":"x"}') == TokenFrames(
        [TokenFrame("m", "x")]
    )
    batch = '{"type":"token_batch","tokens":[{"message_id":"m","text":"a"},{"type":"token","message_id":"n","text":"b","logprob":-1}]}'
    assert decode_worker_frame(batch) == TokenFrames(
        [TokenFrame("m", "a"), TokenFrame("n", "b", logprob=-1.0)]
    )


def test_what_the_schema_accepts_msgspec_s_stricter_types_do_not_refuse() -> None:
    # pydantic reads a token id of 5.0 as 5: such a frame is the same tokens, not a refusal.
    raw = '{"type":"token","message_id":"m","text":"a","token_id":5.0}'
    assert decode_worker_frame(raw) == TokenFrames([TokenFrame("m", "a", token_id=5)])
    batch = '{"type":"token_batch","tokens":[{"message_id":"m","text":"a","token_id":"5","logprob":true}]}'
    assert decode_worker_frame(batch) == TokenFrames([TokenFrame("m", "a", token_id=5, logprob=1.0)])


def test_logprob_entries_get_the_schema_s_defaults() -> None:
    raw = '{"type":"token","message_id":"m","text":"a","logprobs":[{"token":"a","logprob":-1}]}'
    (token,) = decode_worker_frame(raw).tokens  # type: ignore[union-attr]
    assert token.logprobs == [{"token": "a", "logprob": -1.0, "bytes": None, "top_logprobs": []}]


@pytest.mark.parametrize(
    "frame",
    [
        Pong(ping_id="p1", free_slots=2),
        GeneratedText(message_id="m", text="hi", finish_reason="length", generated_tokens=2),
        WorkerError(message_id="m", error="boom", retryable=True),
        Drain(),
    ],
    ids=lambda f: f.type,
)
def test_other_frames_are_read_by_the_protocol_models(frame: object) -> None:
    assert decode_worker_frame(dump_frame(frame)) == frame  # type: ignore[arg-type]


# ---------------------------------------------------------------- hostile input


HOSTILE = [
    # not JSON, not an object, unknown or missing type
    "not json",
    "",
    "[]",
    '"token"',
    "{}",
    '{"type": "teleport"}',
    '{"type": "ping", "ping_id": "p"}',
    # wrong or missing fields of a token
    '{"type": "token", "message_id": "m"}',
    '{"type": "token", "text": "x"}',
    '{"type": "token", "message_id": "", "text": "x"}',
    '{"type": "token", "message_id": "' + "m" * 65 + '", "text": "x"}',
    '{"type": "token", "message_id": 5, "text": "x"}',
    '{"type": "token", "message_id": "m", "text": 5}',
    '{"type": "token", "message_id": "m", "text": null}',
    '{"type": "token", "message_id": "m", "text": ["x"]}',
    '{"type": "token", "message_id": "m", "text": "x", "token_id": 1.5}',
    '{"type": "token", "message_id": "m", "text": "x", "logprob": "low"}',
    '{"type": "token", "message_id": "m", "text": "x", "surprise": 1}',
    '{"type": "token", "message_id": "m", "text": "x", "logprobs": "many"}',
    '{"type": "token", "message_id": "m", "text": "x", "logprobs": [{"token": "x"}]}',
    '{"type": "token", "message_id": "m", "text": "x", "logprobs": [{"token": "x", "logprob": "y"}]}',
    # text no frame may carry: NUL, lone surrogates (escaped), invalid JSON escapes
    '{"type": "token", "message_id": "m", "text": "a\\u0000b"}',
    '{"type": "token", "message_id": "m", "text": "a\\ud800b"}',
    '{"type": "token", "message_id": "m", "text": "\\udfff"}',
    '{"type": "token", "message_id": "m", "text": "\\ud83d"}',
    '{"type": "token", "message_id": "m", "text": "\\x41"}',
    # batches
    '{"type": "token_batch", "tokens": []}',
    '{"type": "token_batch"}',
    '{"type": "token_batch", "tokens": {"message_id": "m", "text": "x"}}',
    '{"type": "token_batch", "tokens": ["x"]}',
    '{"type": "token_batch", "tokens": [{"type": "pong", "ping_id": "p", "free_slots": 1}]}',
    '{"type": "token_batch", "tokens": [{"message_id": "m", "text": "ok"}, {"message_id": "m", "text": "\\u0000"}]}',
    '{"type": "token_batch", "tokens": [{"message_id": "m", "text": "x"}], "extra": 1}',
    # nesting deeper than any parser goes
    '{"type": "token", "message_id": "m", "text": "x", "logprobs": ' + "[" * 5000 + "]" * 5000 + "}",
    '{"type": "token", "message_id": "m", "text": "x", "logprobs": ['
    + '{"a":' * 5000
    + "1"
    + "}" * 5000
    + "]}",
    "[" * 100_000 + "]" * 100_000,
]


@pytest.mark.parametrize("raw", HOSTILE)
def test_the_codec_refuses_what_the_protocol_models_refuse(raw: str) -> None:
    with pytest.raises(ProtocolError):
        parse_worker_frame(raw)
    with pytest.raises(ProtocolError):
        decode_worker_frame(raw)


def test_a_frame_that_is_not_utf8_is_refused() -> None:
    with pytest.raises(ProtocolError):
        decode_worker_frame(b'{"type": "token", "message_id": "m", "text": "\xff"}')
    with pytest.raises(ProtocolError):
        decode_worker_frame('{"type": "token", "message_id": "m", "text": "\ud800"}')


def test_a_refusal_names_the_field_at_fault() -> None:
    with pytest.raises(ProtocolError, match=r"tokens\.1\.text: text holds a NUL"):
        decode_worker_frame(
            json.dumps(
                {
                    "type": "token_batch",
                    "tokens": [{"message_id": "m", "text": "a"}, {"message_id": "m", "text": "\x00"}],
                }
            )
        )


def test_text_that_is_not_valid_unicode_is_not_written() -> None:
    with pytest.raises(UnsendableText):
        encode_tokens([TokenFrame("m", "a\ud800")])
    with pytest.raises(ValueError):
        encode_tokens([])


EDGE_CASES = [
    '{"type":"token","message_id":"m","text":"a","message_id":""}',
    '{"type":"token","message_id":"m","text":"a","text":"\\u0000"}',
    '{"type":"token","message_id":"m","text":"a","logprobs":null,"logprobs":[{"token":"x"}]}',
    '{"type":"token","message_id":"m","text":"a","token_id":-5}',
    '{"type":"token","message_id":"m","text":"a","token_id":99999999999999999999999}',
    '{"type":"token","message_id":"m","text":"a","logprobs":[]}',
    '{"type":"token","message_id":"m","text":"a\\u2028"}',
    '{"type":"token_batch","tokens":[{"message_id":"m","text":"a"}],"tokens":[]}',
    ' {"type":"token","message_id":"m","text":"a"}\n',
    '{"message_id":"m","text":"a","type":"token"}',
]


def _tokens_of(frame: object) -> list[tuple[str, str, int | None]]:
    if isinstance(frame, TokenFrames):
        return [(t.message_id, t.text, t.token_id) for t in frame.tokens]
    tokens = frame.tokens if isinstance(frame, TokenBatch) else [frame]  # type: ignore[attr-defined]
    return [(t.message_id, t.text, t.token_id) for t in tokens]


@pytest.mark.parametrize("raw", EDGE_CASES)
def test_on_edge_cases_the_codec_and_the_schema_agree(raw: str) -> None:
    try:
        expected = _tokens_of(parse_worker_frame(raw))
    except ProtocolError:
        with pytest.raises(ProtocolError):
            decode_worker_frame(raw)
        return
    assert _tokens_of(decode_worker_frame(raw)) == expected
