"""Watching one answer as it streams: the word list on each new piece of text before it is relayed, and
when the classifier should look again.

A word is matched whole, so the word the answer is in the middle of is held back (at most
:data:`MAX_HELD` characters) until the next token shows where it ends: a listed word is never relayed,
and a word that only starts like one (``skill`` for ``kill``) is not taken for it. Each check scans only
the new text and the end of the text before it (enough for the longest phrase), so a token costs the
same however long the answer grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from oasst_inference_server.moderation.hook import Finding, Moderation, Verdict
from oasst_inference_server.settings_sections.moderation import MAX_PATTERN_LENGTH

# Characters of an unfinished word held back: the longest entry the settings allow, so no listed word is
# relayed in part before it is recognized.
MAX_HELD = MAX_PATTERN_LENGTH
_CONTEXT = 2 * MAX_PATTERN_LENGTH  # characters before the new text a phrase may start in


@dataclass
class Step:
    """What to do with a token: relay ``release`` (and its logprobs); ``cut`` the answer; record ``flags``."""

    release: str = ""
    logprobs: list[Any] | None = None
    cut: Verdict | None = None
    flags: list[Verdict] = field(default_factory=list)
    classify: bool = False


def _unfinished_word(text: str) -> int:
    """Where the word ``text`` ends in starts (``len(text)`` if it ends in no word character)."""
    at = len(text)
    while at > 0 and (text[at - 1].isalnum() or text[at - 1] == "_") and len(text) - at < MAX_HELD:
        at -= 1
    return at


class AnswerWatch:
    def __init__(self, moderation: Moderation, message_id: str) -> None:
        self._moderation = moderation
        self.message_id = message_id
        self._relayed: list[str] = []
        self._relayed_chars = 0
        self._tail = ""  # the last _CONTEXT characters relayed
        self._held = ""
        self._held_logprobs: list[Any] = []
        self._flagged: set[str] = set()  # categories already recorded (action flag)
        self._since_classified = 0
        self.clean_chars = 0  # characters the classifier last found clean
        self.cut: Verdict | None = None
        self.finishing = False
        self.classifying = False
        self.user_id: str | None = None

    @property
    def relayed(self) -> str:
        return "".join(self._relayed)

    def clean_text(self, verdict: Verdict) -> str:
        """The part of the answer that stays after a refusal: what the classifier last found clean, or
        for the word list, what came before the hit."""
        if verdict.check == "word_list":
            return self.relayed
        return self.relayed[: self.clean_chars]

    def _relay(self, text: str) -> None:
        if text:
            self._relayed.append(text)
            self._relayed_chars += len(text)
            self._tail = (self._tail + text)[-_CONTEXT:]

    def _check(self, new: str) -> tuple[Verdict | None, list[Verdict], int]:
        """The word list on ``new`` after the relayed tail: a cutting verdict and where in ``new`` its first
        hit starts; the flag-only verdicts not recorded yet."""
        moderation = self._moderation
        if not moderation.word_list.words:
            return None, [], 0
        window = self._tail + new
        start = 0
        if self._relayed_chars > len(self._tail):  # the window may start inside a word: skip it
            while start < len(self._tail) and (window[start].isalnum() or window[start] == "_"):
                start += 1
        text = window[start:]
        hits = moderation.word_list.words.scan(text)
        cutting = [h for h in hits if moderation.action_of([h.category]) != "flag"]
        if cutting:
            finding = Finding("word_list", [h.category for h in cutting], {}, cutting[0].start)
            hit_in_new = max(0, start + cutting[0].start - len(self._tail))
            return moderation.verdict(finding, text), [], hit_in_new
        fresh = [h for h in hits if h.category not in self._flagged]
        if not fresh:
            return None, [], 0
        self._flagged.update(h.category for h in fresh)
        finding = Finding("word_list", [h.category for h in fresh], {}, fresh[0].start)
        return None, [moderation.verdict(finding, text)], 0

    def feed(self, text: str, logprobs: list[Any] | None) -> Step:
        """A streamed token: what to relay now, and whether the answer is cut."""
        pending = self._held + text
        if logprobs:
            self._held_logprobs.extend(logprobs)
        # Held back only for the word list: the classifier judges text already relayed.
        ready = _unfinished_word(pending) if self._moderation.word_list.words else len(pending)
        new, self._held = pending[:ready], pending[ready:]
        step = self._pass(new)
        if new and step.cut is None:
            self._since_classified += len(new)
            stride = self._moderation.settings.moderation_classifier_stride_chars
            if self._moderation.classifies and not self.classifying and self._since_classified >= stride:
                step.classify = True
        return step

    def finish(self) -> Step:
        """The answer ended: its held-back word, checked as the end of the text."""
        new, self._held = self._held, ""
        return self._pass(new)

    def _pass(self, new: str) -> Step:
        """``new`` (text whose words are complete) through the word list: relayed up to a cutting hit."""
        if not new:
            return Step()
        cut, flags, hit = self._check(new)
        if cut is not None:
            self.cut = cut
            self._relay(new[:hit])
            return Step(release=new[:hit], cut=cut)
        step_logprobs, self._held_logprobs = (self._held_logprobs or None), []
        self._relay(new)
        return Step(release=new, logprobs=step_logprobs, flags=flags)

    def classification_started(self) -> tuple[str, int]:
        """The text to classify (its last ``moderation_max_scan_chars``) and its length."""
        self.classifying = True
        self._since_classified = 0
        text = self.relayed
        return text[-self._moderation.max_scan :], len(text)

    def classified_clean(self, length: int) -> None:
        self.classifying = False
        self.clean_chars = max(self.clean_chars, length)
