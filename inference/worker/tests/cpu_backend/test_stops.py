"""Held-back stop sequences, without the model."""

from __future__ import annotations

import random

import pytest

from oasst_cpu_backend.stops import TokenHoldback
from oasst_shared.stop_sequences import StopSequenceFilter


def run(stops: list[str], pieces: list[str]) -> tuple[list[tuple[int, str]], str, bool]:
    holdback: TokenHoldback[int] = TokenHoldback(stops)
    released: list[tuple[int, str]] = []
    for index, piece in enumerate(pieces):
        released += holdback.push(index, piece)
        if holdback.stopped:
            break
    else:
        released += holdback.finish()
    return released, holdback.text, holdback.stopped


def test_without_stops_every_token_is_released_at_once() -> None:
    holdback: TokenHoldback[int] = TokenHoldback([])
    assert holdback.push(0, "Hello") == [(0, "Hello")]
    assert holdback.push(1, " world") == [(1, " world")]
    assert holdback.finish() == []
    assert holdback.text == "Hello world"


def test_stop_spanning_tokens_is_never_released() -> None:
    released, text, stopped = run(["<|user|>"], ["Hi", " there", "<|", "user", "|>", "more"])
    assert stopped
    assert text == "Hi there"
    assert "".join(t for _, t in released) == "Hi there"
    # Every consumed token is reported once, in order, the ones inside the stop sequence with no text.
    assert [i for i, _ in released] == [0, 1, 2, 3, 4]
    assert released[2:] == [(2, ""), (3, ""), (4, "")]


def test_false_start_is_released_when_it_cannot_be_a_stop() -> None:
    holdback: TokenHoldback[int] = TokenHoldback(["STOP"])
    assert holdback.push(0, "ST") == []
    assert holdback.push(1, "ART") == [(0, "ST"), (1, "ART")]
    assert not holdback.stopped


def test_text_before_the_stop_in_the_same_token_is_kept() -> None:
    released, text, stopped = run(["."], ["The sky", " is blue. Then"])
    assert stopped and text == "The sky is blue"
    assert released == [(0, "The sky"), (1, " is blue")]


def test_earliest_of_several_stops_wins() -> None:
    _, text, stopped = run(["world", "lo w"], ["hello", " world"])
    assert stopped and text == "hel"


def test_held_text_is_released_when_generation_ends() -> None:
    released, text, stopped = run(["\n\nUser:"], ["Answer", "\n\n", "Us"])
    assert not stopped
    assert text == "Answer\n\nUs"
    assert released == [(0, "Answer"), (1, "\n\n"), (2, "Us")]


def test_special_tokens_keep_their_place_but_are_not_text() -> None:
    holdback: TokenHoldback[int] = TokenHoldback(["XY"])
    # "X" might start "XY": token 0 waits, and the special token behind it waits too.
    assert holdback.push(0, "aX") == []
    assert holdback.push(1, "<|special|>", is_text=False) == []
    assert holdback.push(2, "b") == [(0, "aX"), (1, "<|special|>"), (2, "b")]
    assert holdback.text == "aXb"


@pytest.mark.parametrize("seed", range(30))
def test_random_splits_agree_with_a_plain_search(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab\n:"
    text = "".join(rng.choice(alphabet) for _ in range(40))
    stops = [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))
    ]
    cuts = sorted(rng.sample(range(1, len(text)), 10))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]

    positions = [p for p in (text.find(s) for s in stops) if p >= 0]
    expected = text[: min(positions)] if positions else text

    released, produced, stopped = run(stops, pieces)
    assert produced == expected
    assert stopped == bool(positions)
    assert "".join(t for _, t in released) == expected
    # Tokens come out in order and none twice.
    indexes = [i for i, _ in released]
    assert indexes == sorted(set(indexes))
    # Nothing released ever contains a stop sequence.
    assert not any(s in produced for s in stops)


def test_filter_flush_returns_the_held_text() -> None:
    stop_filter = StopSequenceFilter(["abc"])
    assert stop_filter.push("xxab") == "xx"
    assert stop_filter.held == "ab"
    assert stop_filter.flush() == "ab"
