from __future__ import annotations

import json

import pytest

from oasst_shared.model_configs import SMOLLM2_135M, ModelConfig
from oasst_shared.protocol import (
    MAX_EMBEDDING_DIMENSION,
    MAX_FRAME_BYTES,
    MAX_TOKENIZE_INPUTS,
    PROTOCOL_VERSION,
    Cancel,
    ChatTurn,
    Detokenize,
    Detokenized,
    Drain,
    Embeddings,
    EmbeddingsPart,
    GeneratedText,
    Ping,
    Pong,
    PromptConversation,
    ProtocolError,
    Token,
    TokenBatch,
    Tokenize,
    Tokenized,
    TokenizeInput,
    UpgradeRequired,
    Work,
    WorkerCapabilities,
    WorkerError,
    WorkerInfo,
    dump_frame,
    dump_work,
    embeddings_frames,
    frame_bytes,
    parse_server_frame,
    parse_worker_frame,
    top_level_strings,
)
from oasst_shared.sampling import SamplingParameters
from oasst_shared.tool_calls import ToolDefinition

WORKER_FRAMES = [
    WorkerInfo(model_config=SMOLLM2_135M, max_parallel_requests=4, backend_kind="tgi", worker_version="1"),
    Pong(ping_id="p1", free_slots=2, backend_healthy=False, backend_queue_length=3, kv_cache_free_tokens=100),
    Token(message_id="m", text="hé", token_id=5, logprob=-0.5),
    TokenBatch(tokens=[Token(message_id="m", text="a"), Token(message_id="n", text="b", token_id=7)]),
    GeneratedText(
        message_id="m", text="hello", finish_reason="eos_token", generated_tokens=3, prompt_tokens=9
    ),
    WorkerError(message_id="m", error="boom", retryable=True),
    WorkerError(error="backend down"),
    WorkerError(message_id="m", error="the backend died", retryable=True, backend_died=True),
    WorkerError(message_id="m", error="HTTP 422: invalid JSON schema", request_refused=True),
    Embeddings(message_id="m", embeddings=[[0.5, -1.0]], prompt_tokens=4),
    EmbeddingsPart(message_id="m", start=0, embeddings=[[0.25, 1e-300]]),
    Drain(),
    Tokenized(request_id="q1", counts=[3, 9], prompt_bytes=[10, 40]),
    Tokenized(request_id="q2", counts=[2], prompt_bytes=[5], token_ids=[[1, 42]]),
    Tokenized(request_id="q3", error="the backend cannot count tokens"),
    Detokenized(request_id="q4", texts=["hello", ""]),
    Detokenized(request_id="q5", error="the backend cannot detokenize"),
]
SERVER_FRAMES = [
    Work(
        message_id="m",
        chat_id="c",
        model_config_name="x",
        thread=[ChatTurn(role="user", content="hi")],
        system_prompt="be nice",
        sampling_parameters=SamplingParameters(temperature=0.5, stop=["\n\n"], seed=1),
        attempt=2,
    ),
    Cancel(message_id="m"),
    Ping(ping_id="p"),
    UpgradeRequired(server_protocol_version=2, min_supported_version=2, detail="upgrade"),
    Tokenize(
        request_id="q1",
        inputs=[
            TokenizeInput(text="Once upon a time"),
            TokenizeInput(
                conversation=PromptConversation(
                    thread=[ChatTurn(role="user", content="hi")],
                    system_prompt="be brief",
                    tools=[ToolDefinition.model_validate({"type": "function", "function": {"name": "f"}})],
                    tool_choice="auto",
                )
            ),
        ],
    ),
    Tokenize(request_id="q2", inputs=[TokenizeInput(text="ids please")], counts_only=False),
    Detokenize(request_id="q3", token_ids=[[1, 2, 3], []]),
]


@pytest.mark.parametrize("frame", WORKER_FRAMES, ids=lambda f: f.type)
def test_worker_frames_round_trip(frame):
    assert parse_worker_frame(dump_frame(frame)) == frame


@pytest.mark.parametrize("frame", SERVER_FRAMES, ids=lambda f: f.type)
def test_server_frames_round_trip(frame):
    assert parse_server_frame(dump_frame(frame)) == frame


def test_worker_info_carries_the_model_config_under_its_wire_name():
    data = json.loads(dump_frame(WORKER_FRAMES[0]))
    assert data["model_config"]["name"] == SMOLLM2_135M.name
    assert isinstance(parse_worker_frame(json.dumps(data)), WorkerInfo)


@pytest.mark.parametrize(
    "raw",
    [
        "not json",
        "[]",
        "{}",
        '{"type": "teleport"}',
        '{"type": "token", "message_id": "m"}',
        '{"type": "pong", "ping_id": "p", "free_slots": -1}',
        '{"type": "token", "message_id": "m", "text": "x", "surprise": 1}',
        '{"type": "token_batch", "tokens": []}',
        '{"type": "token_batch", "tokens": [{"type": "pong", "ping_id": "p", "free_slots": 1}]}',
        '{"type": "generated_text", "message_id": "m", "text": "", "finish_reason": "bored", "generated_tokens": 1}',
    ],
)
def test_malformed_worker_frames_raise_protocol_error(raw):
    with pytest.raises(ProtocolError):
        parse_worker_frame(raw)


def test_server_frames_are_not_worker_frames():
    with pytest.raises(ProtocolError):
        parse_worker_frame(dump_frame(Ping(ping_id="p")))


def test_work_needs_a_thread():
    with pytest.raises(ProtocolError):
        parse_server_frame('{"type": "work", "message_id": "m", "model_config_name": "x", "thread": []}')


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": -0.1},
        {"top_p": 0},
        {"top_p": 1.5},
        {"top_k": 0},
        {"typical_p": 0},
        {"repetition_penalty": 0},
        {"max_new_tokens": 0},
        {"seed": -1},
        {"stop": [""]},
        {"stop": ["a"] * 5},
    ],
)
def test_invalid_sampling_parameters(params):
    with pytest.raises(ValueError):
        SamplingParameters.model_validate(params)


def test_greedy_detection():
    assert SamplingParameters(temperature=0).is_greedy
    assert SamplingParameters(do_sample=False, temperature=0.7).is_greedy
    assert not SamplingParameters(temperature=0.7).is_greedy
    assert not SamplingParameters().is_greedy


def test_model_config_checks_lengths_and_template():
    with pytest.raises(ValueError):
        ModelConfig(name="m", model_id="m", max_input_length=100, max_total_length=100)
    with pytest.raises(ValueError):
        ModelConfig(name="m", model_id="m", chat_template_source="inline")
    with pytest.raises(ValueError):
        ModelConfig(name="bad name!", model_id="m")


def test_cap_max_new_tokens():
    config = ModelConfig(name="m", model_id="m", max_input_length=100, max_total_length=200)
    assert config.cap_max_new_tokens(50, prompt_tokens=100) == 50
    assert config.cap_max_new_tokens(500, prompt_tokens=100) == 100
    assert config.cap_max_new_tokens(500, prompt_tokens=199) == 1


# ---------------------------------------------------------------- frame limit and text


def test_text_no_frame_may_carry_is_refused_in_worker_frames() -> None:
    import pytest

    from oasst_shared.protocol import ProtocolError, parse_worker_frame

    for text in ('"a\\u0000b"', '"a\\ud800b"', '"\\udfff"'):
        with pytest.raises(ProtocolError):
            parse_worker_frame('{"type": "token", "message_id": "m", "text": ' + text + "}")
        with pytest.raises(ProtocolError):
            parse_worker_frame(
                '{"type": "generated_text", "message_id": "m", "finish_reason": "length", '
                '"generated_tokens": 1, "text": ' + text + "}"
            )
    assert parse_worker_frame('{"type": "token", "message_id": "m", "text": "caf\\u00e9 \\ud83d\\ude00"}')


def test_work_with_text_no_frame_may_carry_cannot_be_built() -> None:
    import pytest
    from pydantic import ValidationError

    from oasst_shared.protocol import ChatTurn, Work

    with pytest.raises(ValidationError, match="NUL"):
        Work(message_id="m", model_config_name="x", thread=[ChatTurn(role="user", content="a\x00")])
    with pytest.raises(ValidationError, match="surrogate"):
        Work(
            message_id="m",
            model_config_name="x",
            thread=[ChatTurn(role="user", content="hi")],
            system_prompt="\ud800",
        )


def test_frame_size_is_counted_in_utf8_bytes() -> None:
    from oasst_shared.protocol import MAX_FRAME_BYTES, fits_in_frame, frame_bytes

    assert frame_bytes("abc") == 3
    assert fits_in_frame("a" * MAX_FRAME_BYTES) and not fits_in_frame("a" * (MAX_FRAME_BYTES + 1))
    # Four bytes a character: a quarter of the limit in characters already fills it.
    emoji = "\U0001f600" * (MAX_FRAME_BYTES // 4)
    assert fits_in_frame(emoji) and not fits_in_frame(emoji + "x")


# ---------------------------------------------------------------- protocol 4


@pytest.mark.parametrize(
    ("inputs", "dimension"), [(1, 384), (130, 384), (2048, 384), (40, 4096), (7, MAX_EMBEDDING_DIMENSION)]
)
def test_an_embedding_result_is_cut_into_frames_that_each_fit(inputs: int, dimension: int) -> None:
    # The longest float JSON writes: every frame must fit however the vectors come out.
    worst = -2.2250738585072014e-308
    vectors = [[worst + i] * dimension for i in range(inputs)]
    frames = embeddings_frames("m" * 64, vectors, prompt_tokens=inputs)
    texts = [dump_frame(f) for f in frames]
    assert all(frame_bytes(t) <= MAX_FRAME_BYTES for t in texts)
    *parts, final = [parse_worker_frame(t) for t in texts]
    assert all(isinstance(p, EmbeddingsPart) for p in parts) and isinstance(final, Embeddings)
    starts = [p.start for p in parts if isinstance(p, EmbeddingsPart)]
    assert starts == [sum(len(p.embeddings) for p in parts[:i]) for i in range(len(parts))]
    assert [v for f in [*parts, final] for v in f.embeddings] == vectors
    assert final.prompt_tokens == inputs


def test_a_small_embedding_result_is_one_frame_as_before() -> None:
    [frame] = embeddings_frames("m", [[0.1, 0.2], [0.3, 0.4]], prompt_tokens=2)
    assert isinstance(frame, Embeddings) and frame.embeddings == [[0.1, 0.2], [0.3, 0.4]]


def test_a_worker_error_reads_the_same_to_an_older_server_unless_the_backend_died() -> None:
    assert PROTOCOL_VERSION >= 4
    plain = json.loads(dump_frame(WorkerError(message_id="m", error="e", retryable=True)))
    assert "backend_died" not in plain  # a server of protocol 3 forbids unknown fields
    assert "request_refused" not in plain
    died = parse_worker_frame(dump_frame(WorkerError(message_id="m", error="e", backend_died=True)))
    assert isinstance(died, WorkerError) and died.backend_died
    assert "request_refused" not in dump_frame(died)
    refused = parse_worker_frame(dump_frame(WorkerError(message_id="m", error="e", request_refused=True)))
    assert isinstance(refused, WorkerError) and refused.request_refused and not refused.backend_died
    assert "backend_died" not in dump_frame(refused)


def test_a_result_reads_the_same_to_an_older_server_unless_it_continues_or_tells_its_cache() -> None:
    """Protocol 5's result fields only where they say something; its work field only for protocol 5."""
    plain = json.loads(
        dump_frame(GeneratedText(message_id="m", text="t", finish_reason="length", generated_tokens=1))
    )
    assert (
        "prefix_tokens" not in plain and "cached_tokens" not in plain
    )  # a server of protocol 4 forbids them
    told = GeneratedText(
        message_id="m", text="t", finish_reason="length", generated_tokens=1, prefix_tokens=3, cached_tokens=0
    )
    again = parse_worker_frame(dump_frame(told))
    assert isinstance(again, GeneratedText) and again.prefix_tokens == 3 and again.cached_tokens == 0
    work = Work(
        message_id="m",
        model_config_name="x",
        thread=[ChatTurn(role="user", content="hi")],
        answer_prefix="Once",
    )
    assert json.loads(dump_work(work, PROTOCOL_VERSION))["answer_prefix"] == "Once"
    assert "answer_prefix" not in json.loads(dump_work(work, 4))
    assert "cut_newest_turn" not in json.loads(dump_work(work, 3))


def test_the_message_of_a_frame_too_deep_to_parse_is_found() -> None:
    deep = '{"a":' * 300 + "1" + "}" * 300
    text = f'{{"type":"work","schema":{deep},"message_id":"m-1","chat_id":"c"}}'
    with pytest.raises(ProtocolError, match="recursion"):
        parse_server_frame(text)
    assert top_level_strings(text, ("type", "message_id")) == {"type": "work", "message_id": "m-1"}


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ('{"inner": {"message_id": "no"}, "message_id" : "yes\\"q"}', {"message_id": 'yes"q'}),
        ('{"message_id": 5, "x": "not its value"}', {}),
        ('{"message_id": "' + "x" * 65 + '"}', {}),  # longer than any message id
        ('["message_id", "m"]', {}),
        ('{"message_id": "cut', {}),
        (b'{"message_id":"bytes"', {"message_id": "bytes"}),
        ('{"a": "\\u007b", "message_id": "m"}', {"message_id": "m"}),  # braces in strings do not count
        ('{"a": "{[", "message_id": "m"}', {"message_id": "m"}),
    ],
)
def test_top_level_strings_reads_only_the_top_level(text: str | bytes, found: dict[str, str]) -> None:
    assert top_level_strings(text, ("message_id",)) == found


def test_a_tokenize_input_is_a_text_or_a_conversation_and_carries_no_bad_text() -> None:
    for bad in ({}, {"text": "a", "conversation": {"thread": [{"role": "user", "content": "b"}]}}):
        with pytest.raises(ValueError, match="exactly one"):
            TokenizeInput.model_validate(bad)
    for frame in (
        '{"type":"tokenize","request_id":"q","inputs":[{"text":"a\\u0000b"}]}',
        '{"type":"tokenize","request_id":"q","inputs":[{"conversation":{"thread":'
        '[{"role":"user","content":"a\\u0000"}]}}]}',
        '{"type":"tokenize","request_id":"q","inputs":[]}',
        '{"type":"detokenize","request_id":"","token_ids":[[1]]}',
    ):
        with pytest.raises(ProtocolError):
            parse_server_frame(frame)
    too_many = {"type": "tokenize", "request_id": "q", "inputs": [{"text": "a"}] * (MAX_TOKENIZE_INPUTS + 1)}
    with pytest.raises(ProtocolError, match="inputs"):
        parse_server_frame(json.dumps(too_many))
    with pytest.raises(ProtocolError, match="counts"):
        parse_worker_frame('{"type":"tokenized","request_id":"q","counts":[-1]}')


def test_work_asks_a_worker_to_cut_only_from_protocol_4() -> None:
    work = Work(
        message_id="m",
        model_config_name="x",
        thread=[ChatTurn(role="user", content="hi")],
        tools=[ToolDefinition.model_validate({"type": "function", "function": {"name": "f"}})],
        cut_newest_turn=True,
    )
    assert json.loads(dump_work(work, 4))["cut_newest_turn"] is True
    v3 = json.loads(dump_work(work, 3))
    assert "cut_newest_turn" not in v3 and v3["tools"]  # a protocol 3 worker forbids the field
    v2 = json.loads(dump_work(work, 2))
    assert "cut_newest_turn" not in v2 and "tools" not in v2


def test_the_capabilities_of_a_model_count_only_if_all_its_workers_count() -> None:
    counting = WorkerCapabilities(tokenize=True, prompt_overhead_bytes=80)
    common = WorkerCapabilities.common(
        [counting, WorkerCapabilities(tokenize=True, prompt_overhead_bytes=120)]
    )
    assert common.tokenize and common.prompt_overhead_bytes == 120  # the larger template bounds both
    older = WorkerCapabilities.model_validate({"structured_output": True})  # a protocol 3 worker's
    common = WorkerCapabilities.common([counting, older])
    assert not common.tokenize and common.prompt_overhead_bytes is None
