"""The word list and the streaming watch of an answer, on their own (no server)."""

from __future__ import annotations

import time

import pytest

from oasst_inference_server.moderation.answer_watch import AnswerWatch
from oasst_inference_server.moderation.hook import Moderation
from oasst_inference_server.moderation.word_list import UnsafePattern, WordList
from oasst_inference_server.settings import Settings
from oasst_inference_server.settings_sections.moderation import MAX_PATTERN_LENGTH


def test_whole_words_and_phrases_case_insensitively():
    words = WordList({"weapons": ["bomb", "nerve gas"], "spam": ["re:buy\\w{0,3}"]})
    assert [h.category for h in words.scan("How to make a BOMB?")] == ["weapons"]
    assert words.scan("the bombastic speech") == []  # not a whole word
    assert [h.entry for h in words.scan("Nerve,  gas leaks")] == ["nerve gas"]
    assert [h.category for h in words.scan("please BUYNOW")] == ["spam"]
    assert words.scan("nerve endings, gas station") == []


@pytest.mark.parametrize(
    "entry",
    ["re:(a+)+$", "re:(a|aa)*b", "re:(\\w)\\1", "re:(?=a)a", "re:a*b*c*", "re:(", "a b c d e f g h i"],
)
def test_unsafe_or_bad_entries_are_refused(entry: str):
    with pytest.raises(UnsafePattern):
        WordList({"x": [entry]})


def test_a_hostile_text_is_scanned_in_linear_time():
    words = WordList({"x": ["re:a{0,20}b", "aaa aaa aaa aab"]})
    text = "a" * 200_000 + " " + "aaa " * 20_000
    started = time.process_time()
    assert words.scan(text) == []
    # Generous: the scan is one pass (about 0.1 s); the catastrophic case would take hours.
    assert time.process_time() - started < 20


def _moderation(**settings: object) -> Moderation:
    config = Settings(
        moderation_enabled=True,
        moderation_word_lists={"bad": ["kill", "nerve gas"], "meh": ["meh"]},
        moderation_actions={"meh": "flag"},
        **settings,  # type: ignore[arg-type]
    )
    return Moderation(config, None)  # type: ignore[arg-type]


def test_a_flagged_word_is_never_relayed_and_a_longer_word_is_not_taken_for_it():
    watch = AnswerWatch(_moderation(), "m")
    relayed = ""
    for token in ["I will ", "sk", "ill", " you, then ", "ki", "ll", " you"]:
        step = watch.feed(token, None)
        relayed += step.release
        if step.cut is not None:
            break
    assert step.cut is not None and step.cut.categories == ["bad"] and step.cut.action == "refuse"
    assert relayed == "I will skill you, then "
    assert watch.clean_text(step.cut) == relayed


def test_a_phrase_across_tokens_and_a_flag_only_category():
    watch = AnswerWatch(_moderation(), "m")
    flags = []
    step = None
    for token in ["meh", " so", " nerve", " gas", "!"]:
        step = watch.feed(token, None)
        flags.extend(step.flags)
        if step.cut is not None:
            break
    assert [f.categories for f in flags] == [["meh"]]
    assert step is not None and step.cut is not None and step.cut.categories == ["bad"]
    assert "nerve gas" not in watch.relayed


def test_the_held_word_is_checked_at_the_end():
    watch = AnswerWatch(_moderation(), "m")
    assert watch.feed("you will kil", None).release == "you will "
    assert watch.feed("l", None).release == ""
    final = watch.finish()
    assert final.cut is not None and final.release == ""


def test_the_longest_word_an_entry_may_be_is_never_relayed_in_part():
    longest = ("pneumono" * MAX_PATTERN_LENGTH)[:MAX_PATTERN_LENGTH]
    config = Settings(moderation_enabled=True, moderation_word_lists={"bad": [longest]})
    watch = AnswerWatch(Moderation(config, None), "m")  # type: ignore[arg-type]
    relayed = ""
    for token in ["say ", *(longest[i : i + 10] for i in range(0, len(longest), 10)), " ok"]:
        step = watch.feed(token, None)
        relayed += step.release
        if step.cut is not None:
            break
    assert step.cut is not None and step.cut.categories == ["bad"]
    assert relayed == "say "


def test_without_a_word_list_nothing_is_held_back():
    config = Settings(
        moderation_enabled=True,
        moderation_classifier_model="an-embedding-model",
        moderation_classifier_categories={"c": {"examples": ["an example"]}},
    )
    watch = AnswerWatch(Moderation(config, None), "m")  # type: ignore[arg-type]
    assert watch.feed("you will kil", None).release == "you will kil"
    assert watch.feed("l", None).release == "l"
    assert watch.finish().release == ""
