"""An embedding result sent in parts is assembled in order and bounded by the job: one vector per input,
of one dimension, never more (workers/embedding_parts); a refused frame too deep to parse fails the
message it names (workers/worker_frames)."""

from __future__ import annotations

import pytest

from oasst_inference_server.workers.embedding_parts import EmbeddingAssembly, PartRefused
from oasst_inference_server.workers.worker_frames import parse_or_salvage
from oasst_shared.protocol import MAX_EMBEDDING_DIMENSION, Embeddings, EmbeddingsPart, embeddings_frames


def vectors(count: int, dimension: int = 4) -> list[list[float]]:
    return [[float(i)] * dimension for i in range(count)]


def assemble(inputs: int, frames: list[EmbeddingsPart | Embeddings]) -> Embeddings:
    assembly = EmbeddingAssembly(inputs)
    *parts, final = frames
    for part in parts:
        assert isinstance(part, EmbeddingsPart)
        assembly.add(part)
    assert isinstance(final, Embeddings)
    return assembly.result(final)


def test_the_parts_of_a_result_make_it_whole_in_input_order():
    expected = vectors(500, 384)
    frames = embeddings_frames("m", expected, prompt_tokens=1000)
    assert len(frames) > 1
    result = assemble(500, frames)
    assert result.embeddings == expected and result.prompt_tokens == 1000 and result.message_id == "m"


def test_a_result_in_one_frame_is_taken_as_it_is():
    final = Embeddings(message_id="m", embeddings=vectors(3), prompt_tokens=3)
    assert EmbeddingAssembly(3).result(final) is final


def part(start: int, count: int, dimension: int = 4) -> EmbeddingsPart:
    return EmbeddingsPart(message_id="m", start=start, embeddings=vectors(count, dimension))


def final(count: int, dimension: int = 4) -> Embeddings:
    return Embeddings(message_id="m", embeddings=vectors(count, dimension), prompt_tokens=1)


@pytest.mark.parametrize(
    ("inputs", "parts", "last", "why"),
    [
        (10, [part(0, 3), part(4, 3)], 3, "starts at 4, not at 3"),  # a gap
        (10, [part(0, 3), part(0, 3)], 4, "starts at 0, not at 3"),  # a repeat
        (10, [part(0, 10)], 1, "10 vectors before the final frame, for 10 inputs"),  # more than asked
        (10, [part(0, 5)], 6, "11 vectors for 10 inputs"),
        (10, [part(0, 5)], 4, "9 vectors for 10 inputs"),
        (10, [part(0, 5)], None, "several dimensions"),
        (10, [part(0, 5, MAX_EMBEDDING_DIMENSION + 1)], 5, "dimensions"),
    ],
)
def test_parts_that_do_not_make_up_the_result_are_refused(inputs, parts, last, why):
    assembly = EmbeddingAssembly(inputs)
    with pytest.raises(PartRefused, match=why):
        for p in parts:
            assembly.add(p)
        assembly.result(final(last) if last is not None else final(5, dimension=8))
    # Nothing past the job's inputs was ever held.
    assert len(assembly.vectors) < inputs


def test_a_worker_frame_too_deep_to_parse_fails_only_the_message_it_names():
    deep = '{"a":' * 300 + "1" + "}" * 300
    frame, salvaged, error = parse_or_salvage(f'{{"type":"generated_text","message_id":"m-7","text":{deep}}}')
    assert frame is None and error is not None
    assert salvaged is not None and list(salvaged.refused) == ["m-7"]
    # Naming no message, it is held against the connection, as before.
    assert parse_or_salvage(f'{{"type":"pong","x":{deep}}}')[1] is None
