"""The word-list check: words and phrases matched as whole words, case-insensitively, and a few regular
expressions of a safe subset, each matched against single words.

Safe by construction, whatever the list holds: the text is split into words once (one linear scan), a
phrase is a lookup of a tuple of words in a set, and a regular expression only ever sees one word of at
most :data:`MAX_WORD` characters, so no pattern can take time that grows with the text (the catastrophic
backtracking of a pattern such as ``(a+)+$`` on a long text). The subset refuses what could still blow up
on one word: back-references, look-arounds, a repeat of anything but one character or class, more than two repeats.
"""

from __future__ import annotations

import re
import re._constants as sre_constants
import re._parser as sre_parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_WORD = 64  # characters of a word a regular expression sees
MAX_REGEXES = 50  # entries starting with "re:", over all categories
MAX_PHRASE_WORDS = 8
_WORD = re.compile(r"\w+")
REGEX_PREFIX = "re:"

_FORBIDDEN = {
    sre_constants.GROUPREF,
    sre_constants.GROUPREF_EXISTS,
    sre_constants.ASSERT,
    sre_constants.ASSERT_NOT,
}
_ONE_CHARACTER = {
    sre_constants.LITERAL,
    sre_constants.NOT_LITERAL,
    sre_constants.IN,
    sre_constants.ANY,
    sre_constants.CATEGORY,
}
_ATOMIC_GROUP = getattr(sre_constants, "ATOMIC_GROUP", object())
_REPEATS = {
    sre_constants.MAX_REPEAT,
    sre_constants.MIN_REPEAT,
    getattr(sre_constants, "POSSESSIVE_REPEAT", None),
}


class UnsafePattern(ValueError):
    """A word-list entry outside the safe subset (the message says why)."""


@dataclass(frozen=True)
class WordHit:
    category: str
    entry: str  # the list's entry that matched
    start: int  # where in the scanned text the match starts


def _check_tree(pattern: Any, inside_repeat: bool, repeats: list[int], entry: str) -> None:
    for op, arg in pattern:
        if op in _FORBIDDEN:
            raise UnsafePattern(f"{entry!r}: back-references and look-arounds are not allowed")
        if op in _REPEATS:
            body = list(arg[2])
            if inside_repeat or len(body) != 1 or body[0][0] not in _ONE_CHARACTER:
                raise UnsafePattern(f"{entry!r}: only a single character or class may be repeated")
            repeats.append(1)
        elif op == sre_constants.SUBPATTERN:
            _check_tree(arg[-1], inside_repeat, repeats, entry)
        elif op == sre_constants.BRANCH:
            for branch in arg[1]:
                _check_tree(branch, inside_repeat, repeats, entry)
        elif op == _ATOMIC_GROUP:
            _check_tree(arg, inside_repeat, repeats, entry)
    if len(repeats) > 2:
        raise UnsafePattern(f"{entry!r}: at most two repeats (*, +, ?, {{m,n}}) in one expression")


def compile_regex(entry: str) -> re.Pattern[str]:
    """An ``re:`` entry's expression, checked against the safe subset (``UnsafePattern`` if outside)."""
    source = entry[len(REGEX_PREFIX) :]
    try:
        tree = sre_parse.parse(source, re.IGNORECASE)
    except re.error as exc:
        raise UnsafePattern(f"{entry!r}: not a regular expression ({exc})") from None
    _check_tree(tree, False, [], entry)
    return re.compile(source, re.IGNORECASE)


class WordList:
    """The compiled lists of ``moderation_word_lists``: category -> entries."""

    def __init__(self, lists: Mapping[str, Sequence[str]]) -> None:
        self._phrases: dict[tuple[str, ...], tuple[str, str]] = {}  # words -> (category, entry)
        self._regexes: list[tuple[re.Pattern[str], str, str]] = []
        lengths: set[int] = set()
        for category, entries in lists.items():
            for entry in entries:
                if entry.startswith(REGEX_PREFIX):
                    self._regexes.append((compile_regex(entry), category, entry))
                    continue
                words = tuple(w.casefold() for w in _WORD.findall(entry))
                if not words or len(words) > MAX_PHRASE_WORDS:
                    raise UnsafePattern(f"{entry!r}: a word list entry is 1 to {MAX_PHRASE_WORDS} words")
                self._phrases.setdefault(words, (category, entry))
                lengths.add(len(words))
        if len(self._regexes) > MAX_REGEXES:
            raise UnsafePattern(f"at most {MAX_REGEXES} regular expressions (re: entries) in the word lists")
        self._lengths = sorted(lengths)

    def __bool__(self) -> bool:
        return bool(self._phrases or self._regexes)

    def scan(self, text: str) -> list[WordHit]:
        """Every entry found in ``text`` (the first hit of each category, in order of position)."""
        matches = list(_WORD.finditer(text))
        words = [m.group().casefold() for m in matches]
        hits: dict[str, WordHit] = {}
        regex_cache: dict[str, tuple[str, str] | None] = {}
        for index, match in enumerate(matches):
            for length in self._lengths:
                found = self._phrases.get(tuple(words[index : index + length]))
                if found is not None and found[0] not in hits:
                    hits[found[0]] = WordHit(found[0], found[1], match.start())
            if self._regexes:
                word = words[index][:MAX_WORD]
                if word not in regex_cache:
                    regex_cache[word] = next(
                        (
                            (category, entry)
                            for regex, category, entry in self._regexes
                            if regex.fullmatch(word)
                        ),
                        None,
                    )
                found = regex_cache[word]
                if found is not None and found[0] not in hits:
                    hits[found[0]] = WordHit(found[0], found[1], match.start())
        return sorted(hits.values(), key=lambda h: h.start)
