"""JSON-schema ``pattern`` regular expressions: parsed (the ECMA-262 subset that is a regular language),
and written as GBNF for a string inside a JSON document.

llama-cpp-python 0.3.36's converter copies a pattern's escapes into the grammar as they are (``\\d``,
``\\.``: llama.cpp refuses the grammar, and the backend died), lets ``.`` and negated classes produce a raw
``"`` or control character (the answer is no longer JSON), and wraps large repetitions in groups llama.cpp
refuses. :func:`pattern_gbnf` writes what the pattern means as JSON text instead: every character the
pattern allows is written as JSON writes it (``"`` as ``\\"``), wildcards and negated classes leave out
the characters JSON must escape, quantified groups become rules of their own, and repetitions are
:func:`oasst_shared.gbnf.repetition`'s. A pattern without ``^``/``$`` matches anywhere in the string, as
JSON Schema says.

Refused (:class:`PatternError`): lookarounds, backreferences, word boundaries, anchors inside the
pattern, unicode property classes, nested groups deeper than :data:`MAX_GROUP_DEPTH`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

from oasst_shared.gbnf import literal, repetition

MAX_GROUP_DEPTH = 32
_MAX_CODE_POINT = 0x10FFFF

Ranges = tuple[tuple[int, int], ...]


class PatternError(ValueError):
    """A pattern this parser does not take; the message says why."""


@dataclass(frozen=True)
class CharSet:
    """Characters given as ranges (both ends included), or every character but those if ``negated``."""

    ranges: Ranges
    negated: bool = False


@dataclass(frozen=True)
class Char:
    char: str


@dataclass(frozen=True)
class Group:
    alternatives: tuple[tuple[Node, ...], ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    min: int
    max: int | None


Node = CharSet | Char | Group | Repeat


@dataclass(frozen=True)
class Pattern:
    body: Group
    anchored_start: bool
    anchored_end: bool

    def repeats(self) -> list[tuple[Repeat, int]]:
        """Every repetition with the product of the bounded counts of those around it (itself included):
        how many ways a string can be split among them at most."""
        found: list[tuple[Repeat, int]] = []

        def walk(node: Node, outer: int) -> None:
            if isinstance(node, Repeat):
                inner = outer * (node.max if node.max is not None else max(node.min, 1))
                found.append((node, inner))
                walk(node.item, inner)
            elif isinstance(node, Group):
                for sequence in node.alternatives:
                    for item in sequence:
                        walk(item, outer)

        walk(self.body, 1)
        return found


_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE: Ranges = (
    (0x09, 0x0D),
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
)
_LINE_BREAKS: Ranges = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
_SHORTHANDS = {"d": _DIGIT, "w": _WORD, "s": _SPACE}
_CONTROL_ESCAPES = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D, "0": 0x00}
_SYNTAX = frozenset("^$\\.*+?()[]{}|/-")


@functools.lru_cache(maxsize=512)
def parse_pattern(pattern: str) -> Pattern:
    """The pattern's tree (immutable, so cached); :class:`PatternError` if it uses what this module
    does not take."""
    parser = _Parser(pattern)
    anchored_start = pattern.startswith("^")
    if anchored_start:
        parser.pos = 1
    end = len(pattern)
    anchored_end = pattern.endswith("$") and not _escaped(pattern, end - 1) and end > int(anchored_start)
    if anchored_end:
        end -= 1
    parser.end = end
    body = parser.alternation(depth=0)
    if parser.pos != end:
        raise PatternError(f"unbalanced ')' at offset {parser.pos}")
    return Pattern(body, anchored_start, anchored_end)


def _escaped(text: str, index: int) -> bool:
    backslashes = 0
    while index - 1 - backslashes >= 0 and text[index - 1 - backslashes] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.end = len(text)

    def _peek(self, offset: int = 0) -> str:
        index = self.pos + offset
        return self.text[index] if index < self.end else ""

    def alternation(self, depth: int) -> Group:
        if depth > MAX_GROUP_DEPTH:
            raise PatternError(f"groups nested deeper than {MAX_GROUP_DEPTH}")
        alternatives = [self.sequence(depth)]
        while self._peek() == "|":
            self.pos += 1
            alternatives.append(self.sequence(depth))
        return Group(tuple(alternatives))

    def sequence(self, depth: int) -> tuple[Node, ...]:
        items: list[Node] = []
        while self.pos < self.end and self._peek() not in "|)":
            atom = self.atom(depth)
            quantified = self.quantifier(atom)
            items.append(quantified)
        return tuple(items)

    def atom(self, depth: int) -> Node:
        c = self._peek()
        if c == "(":
            self.pos += 1
            if self._peek() == "?":
                if self.text.startswith("?:", self.pos):
                    self.pos += 2
                elif self.text.startswith(("?<", "?P<"), self.pos) and self._peek(2) not in "=!":
                    close = self.text.find(">", self.pos)
                    if close < 0 or close >= self.end:
                        raise PatternError("unterminated group name")
                    self.pos = close + 1
                else:
                    raise PatternError("lookarounds and inline flags are not supported")
            group = self.alternation(depth + 1)
            if self._peek() != ")":
                raise PatternError("missing ')'")
            self.pos += 1
            return group
        if c == "[":
            return self.char_class()
        if c == ".":
            self.pos += 1
            return CharSet(_LINE_BREAKS, negated=True)
        if c == "\\":
            return self.escape(in_class=False)
        if c in "*+?":
            raise PatternError(f"nothing to repeat at offset {self.pos}")
        if c in "^$":
            raise PatternError("anchors are supported only at the start and the end of a pattern")
        if c == "{" and self._counts() is not None:
            raise PatternError(f"nothing to repeat at offset {self.pos}")
        self.pos += 1
        return _char(c)

    def _counts(self) -> tuple[int, int | None, int] | None:
        """``{m}``, ``{m,}`` or ``{m,n}`` at the current position: (m, n, its length), else None
        (a ``{`` that is no quantifier stands for itself)."""
        text, start = self.text, self.pos
        close = text.find("}", start, self.end)
        if close < 0:
            return None
        inner = text[start + 1 : close]
        low, comma, high = inner.partition(",")
        if not low.isascii() or not low.isdigit() or (high and not (high.isascii() and high.isdigit())):
            return None
        if len(low) > 9 or len(high) > 9:
            raise PatternError("a repetition count is too large")
        maximum = int(high) if high else (None if comma else int(low))
        return int(low), maximum, close + 1 - start

    def quantifier(self, atom: Node) -> Node:
        c = self._peek()
        if c in ("*", "+", "?"):
            self.pos += 1
            low, high = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
        elif c == "{" and (counts := self._counts()) is not None:
            low, high, length = counts
            self.pos += length
            if high is not None and high < low:
                raise PatternError(f"the repetition {{{low},{high}}} has its numbers out of order")
        else:
            return atom
        if self._peek() == "?":
            self.pos += 1  # lazy: the same strings
        if self._peek() in ("*", "+") or (self._peek() == "{" and self._counts() is not None):
            raise PatternError(f"nothing to repeat at offset {self.pos}")
        return Repeat(atom, low, high)

    def escape(self, in_class: bool) -> Node:
        """A backslash escape: a character or a shorthand class."""
        kind = self._peek(1)
        if not kind:
            raise PatternError("a pattern cannot end with a backslash")
        self.pos += 2
        if kind in _SHORTHANDS:
            return CharSet(_SHORTHANDS[kind])
        if kind.lower() in _SHORTHANDS:
            return CharSet(_SHORTHANDS[kind.lower()], negated=True)
        if kind in _CONTROL_ESCAPES and not (kind == "0" and self._peek().isdigit()):
            return Char(chr(_CONTROL_ESCAPES[kind]))
        if kind == "b" and in_class:
            return Char("\b")
        if kind in "xu":
            digits = 2 if kind == "x" else 4
            hex_text = self.text[self.pos : self.pos + digits]
            if len(hex_text) != digits or not all(h in "0123456789abcdefABCDEF" for h in hex_text):
                raise PatternError(f"\\{kind} needs {digits} hex digits")
            self.pos += digits
            return _char(chr(int(hex_text, 16)))
        if kind.isdigit() or kind == "k":
            raise PatternError("backreferences are not supported")
        if kind in "bBAzZG":
            raise PatternError(f"\\{kind} (a position, not a character) is not supported")
        if kind in "pPc":
            raise PatternError(f"\\{kind} escapes are not supported")
        if kind.isalnum():
            raise PatternError(f"unknown escape \\{kind}")
        return Char(kind)

    def char_class(self) -> CharSet:
        self.pos += 1
        negated = self._peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.pos >= self.end:
                raise PatternError("missing ']'")
            if self._peek() == "]":
                self.pos += 1
                break
            low = self._class_atom()
            if isinstance(low, CharSet):
                if low.negated:
                    raise PatternError("negated shorthands (\\D, \\W, \\S) inside a class are not supported")
                ranges.extend(low.ranges)
                continue
            if self._peek() == "-" and self._peek(1) not in ("]", ""):
                self.pos += 1
                high = self._class_atom()
                if isinstance(high, CharSet):
                    raise PatternError("a class range cannot end in a shorthand")
                if ord(high) < ord(low):
                    raise PatternError(f"the class range {low!r}-{high!r} is out of order")
                ranges.append((ord(low), ord(high)))
            else:
                ranges.append((ord(low), ord(low)))
        if not ranges:
            raise PatternError("empty character classes are not supported")
        return CharSet(_merge(ranges), negated)

    def _class_atom(self) -> str | CharSet:
        if self._peek() == "\\":
            node = self.escape(in_class=True)
            if isinstance(node, Char | CharSet):
                return node.char if isinstance(node, Char) else node
            raise PatternError("unexpected escape in a class")
        c = self._peek()
        self.pos += 1
        return c


def _char(char: str) -> Char:
    if 0xD800 <= ord(char) <= 0xDFFF:
        raise PatternError("a lone surrogate cannot be written as text")
    return Char(char)


def _merge(ranges: list[tuple[int, int]]) -> Ranges:
    merged: list[tuple[int, int]] = []
    for low, high in sorted(ranges):
        if merged and low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return tuple(merged)


# ---- GBNF --------------------------------------------------------------------------------------

# What JSON text cannot hold as itself inside a string: control characters, the quote, the backslash.
_JSON_ESCAPED: Ranges = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))

AddRule = Callable[[str, str], str]


def pattern_gbnf(pattern: Pattern, name: str, add_rule: AddRule) -> str:
    """GBNF for the JSON text of a string the pattern matches (what goes between its quotes).
    ``add_rule(name, body)`` defines a rule and returns the name it got."""
    return _Writer(name, add_rule).string(pattern)


class _Writer:
    def __init__(self, name: str, add_rule: AddRule) -> None:
        self.name = name
        self.add_rule = add_rule
        self.count = 0

    def string(self, pattern: Pattern) -> str:
        any_text = self.charset(CharSet((), negated=True))[0] + "*"
        parts = [] if pattern.anchored_start else [any_text]
        parts.append(self.group(pattern.body))
        if not pattern.anchored_end:
            parts.append(any_text)
        return " ".join(p for p in parts if p)

    def group(self, group: Group) -> str:
        alternatives = [self.sequence(sequence) for sequence in group.alternatives]
        if len(alternatives) == 1:
            return alternatives[0]
        return "(" + " | ".join(alternatives) + ")"

    def sequence(self, items: tuple[Node, ...]) -> str:
        out: list[str] = []
        text: list[str] = []
        for item in items:
            if isinstance(item, Char):
                text.append(item.char)
                continue
            if text:
                out.append(_json_literal("".join(text)))
                text = []
            out.append(self.node(item))
        if text:
            out.append(_json_literal("".join(text)))
        return " ".join(p for p in out if p)

    def node(self, node: Node) -> str:
        if isinstance(node, Char):
            return _json_literal(node.char)
        if isinstance(node, CharSet):
            return self.charset(node)[0]
        if isinstance(node, Group):
            return self.group(node)
        return self.repeat(node)

    def repeat(self, node: Repeat) -> str:
        item = node.item
        if isinstance(item, Char):
            operand = _json_literal(item.char)
        elif isinstance(item, CharSet) and (written := self.charset(item))[1]:
            operand = written[0]
        else:
            # A quantified group gets a rule of its own: llama.cpp multiplies a repetition by the
            # symbols its operand created, and refuses the grammar past 2000.
            body = self.node(item)
            if not body:
                # Repeating nothing is nothing; and llama.cpp takes x* of an empty rule x for left
                # recursion.
                return ""
            self.count += 1
            operand = self.add_rule(f"{self.name}-{self.count}", body)
        return repetition(operand, node.min, node.max)

    def charset(self, charset: CharSet) -> tuple[str, bool]:
        """The set as GBNF and whether it is a single term (a class or one literal)."""
        if charset.negated:
            excluded = _merge([*charset.ranges, *_JSON_ESCAPED])
            if excluded == ((0, _MAX_CODE_POINT),):
                raise PatternError("a character class matches nothing")
            return "[^" + "".join(_class_range(r) for r in excluded) + "]", True
        plain = _subtract(charset.ranges, _JSON_ESCAPED)
        parts = ["[" + "".join(_class_range(r) for r in plain) + "]"] if plain else []
        for low, high in _intersect(charset.ranges, _JSON_ESCAPED):
            parts.extend(_json_literal(chr(code)) for code in range(low, high + 1))
        if len(parts) == 1:
            return parts[0], True
        return "(" + " | ".join(parts) + ")", False


def _json_literal(text: str) -> str:
    """GBNF for ``text`` as it is written inside a JSON string."""
    return literal(json.dumps(text, ensure_ascii=False)[1:-1])


def _class_char(code: int) -> str:
    if code < 0x80 and chr(code).isalnum():
        return chr(code)
    if code <= 0xFF:
        return f"\\x{code:02X}"
    if code <= 0xFFFF:
        return f"\\u{code:04X}"
    return f"\\U{code:08X}"


def _class_range(bounds: tuple[int, int]) -> str:
    low, high = bounds
    return _class_char(low) if low == high else f"{_class_char(low)}-{_class_char(high)}"


def _subtract(ranges: Ranges, removed: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    for low, high in ranges:
        pieces = [(low, high)]
        for r_low, r_high in removed:
            next_pieces: list[tuple[int, int]] = []
            for p_low, p_high in pieces:
                if r_high < p_low or r_low > p_high:
                    next_pieces.append((p_low, p_high))
                    continue
                if p_low < r_low:
                    next_pieces.append((p_low, r_low - 1))
                if r_high < p_high:
                    next_pieces.append((r_high + 1, p_high))
            pieces = next_pieces
        out.extend(pieces)
    return tuple(out)


def _intersect(ranges: Ranges, other: Ranges) -> Ranges:
    out = []
    for low, high in ranges:
        for o_low, o_high in other:
            if max(low, o_low) <= min(high, o_high):
                out.append((max(low, o_low), min(high, o_high)))
    return tuple(out)
