from __future__ import annotations

import random

import pytest

from oasst_shared.stop_sequences import StopSequenceFilter


def feed(stops: list[str], pieces: list[str]) -> tuple[list[str], str, bool]:
    f = StopSequenceFilter(stops)
    shown = [f.push(p) for p in pieces]
    tail = f.flush()
    return shown, "".join(shown) + tail, f.stopped


def test_no_stop_sequences_passes_through():
    shown, text, stopped = feed([], ["a", "b"])
    assert shown == ["a", "b"] and text == "ab" and not stopped


def test_stop_split_across_tokens_is_never_shown():
    shown, text, stopped = feed(["<|im_end|>"], ["Hello", " world", "<|im", "_end", "|>", "more"])
    assert text == "Hello world"
    assert stopped
    assert all("<|" not in s for s in shown)


def test_a_false_start_is_released():
    shown, text, stopped = feed(["STOP"], ["ST", "ART", " now"])
    assert text == "START now" and not stopped
    assert shown[0] == ""  # held back while it could still become STOP


def test_text_before_the_stop_in_the_same_token_is_kept():
    _, text, stopped = feed(["\n\nUser:"], ["answer\n\nUser: more"])
    assert text == "answer" and stopped


def test_earliest_of_several_stops_wins():
    _, text, _ = feed(["bb", "a"], ["xxbbya"])
    assert text == "xx"


@pytest.mark.parametrize("seed", range(20))
def test_random_splits_never_leak_a_stop(seed):
    rng = random.Random(seed)
    full = "The answer is 42.<|im_end|>garbage"
    cuts = sorted(rng.sample(range(1, len(full)), 6))
    pieces = [full[i:j] for i, j in zip([0, *cuts], [*cuts, len(full)], strict=True)]
    shown, text, stopped = feed(["<|im_end|>"], pieces)
    assert text == "The answer is 42." and stopped
    assert "<" not in "".join(shown)
