"""GBNF, llama.cpp's grammar format: the pieces a JSON-schema conversion writes (literals, repetitions),
and the size llama.cpp's parser builds from a grammar, so that it can be bounded before llama.cpp sees it.

What llama.cpp accepts (``src/llama-grammar.cpp`` of the build llama-cpp-python 0.3.36 vendors, checked
against it): ``x{m,n}`` is expanded into ``n - m`` rules and ``m`` inline copies; an exact count above
2000 is refused, and so is any repetition whose operand created ``k`` symbols (a group creates one per
nested group, repetition rule and first-named rule) when ``k * max(n, m) >= 2000``. A refused grammar
gives no sampler at all (NULL), which llama-cpp-python 0.3.36 adds to its sampler chain unchecked: the
process dies on the first token. :func:`repetition` therefore writes counts up to :data:`NATIVE_REPEAT`
as they are and larger ones as nested blocks of about ``sqrt(n)`` items, which llama.cpp accepts at
every count and which costs ``O(sqrt(n))`` rules instead of ``n``. :func:`measure` parses a grammar as
llama.cpp does and counts what it would build.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Counts up to this are written as llama.cpp's own x{m,n} (n - m rules of the operand). Above it, blocks
# are smaller: about 10 * sqrt(n) elements against 4 * n. And with an operand of a few symbols (ours are a
# rule, a literal, a class or a small group) no count comes near llama.cpp's limit of 2000.
NATIVE_REPEAT = 32
# llama.cpp's MAX_REPETITION_THRESHOLD.
LLAMA_REPETITION_THRESHOLD = 2000


class GbnfError(ValueError):
    """A grammar llama.cpp would refuse, or a repetition that cannot be written."""


def literal(text: str) -> str:
    """``text`` as a GBNF string literal (llama.cpp reads ``\\\\``, ``\\"``, ``\\n``, ``\\r``, ``\\t`` and
    hex escapes; every other character stands for itself)."""
    out = ['"']
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02X}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def repetition(item: str, min_count: int, max_count: int | None, separator: str | None = None) -> str:
    """``item`` repeated ``min_count`` to ``max_count`` (None: no upper bound) times, with ``separator``
    between two items if given; llama.cpp accepts it for every count.

    ``item`` is one GBNF term (a rule name, a literal, a class or a parenthesised group)."""
    if min_count < 0 or (max_count is not None and max_count < min_count):
        raise GbnfError(f"no repetition from {min_count} to {max_count}")
    if max_count == 0:
        return ""
    if min_count == 0 and max_count == 1:
        return f"{item}?"
    if separator is not None:
        rest = repetition(
            f"({separator} {item})", max(min_count - 1, 0), None if max_count is None else max_count - 1
        )
        body = f"{item} {rest}" if rest else item
        return f"({body})?" if min_count == 0 else body
    if max_count is None:
        if min_count <= 1:
            return f"{item}{'*+'[min_count]}"
        return f"{_exact(item, min_count)} {item}*"
    if max_count <= NATIVE_REPEAT:
        return f"{item}{{{min_count}}}" if min_count == max_count else f"{item}{{{min_count},{max_count}}}"
    return " ".join(part for part in (_exact(item, min_count), _up_to(item, max_count - min_count)) if part)


def _block(count: int) -> int:
    """The block size that splits ``count`` into about sqrt(count) blocks of about sqrt(count) items."""
    return math.isqrt(count - 1) + 1


def _exact(item: str, count: int) -> str:
    if count == 0:
        return ""
    if count == 1:
        return item
    if count <= NATIVE_REPEAT:
        return f"{item}{{{count}}}"
    block = _block(count)
    blocks, rest = divmod(count, block)
    return " ".join(part for part in (_exact(f"({_exact(item, block)})", blocks), _exact(item, rest)) if part)


def _up_to(item: str, count: int) -> str:
    """``item`` 0 to ``count`` times. Above NATIVE_REPEAT, with b = ceil(sqrt(count + 1)) and
    count = a*b + r: either fewer than ``a`` full blocks and a partial one, or ``a`` full blocks and up
    to ``r`` more; every length appears once, so llama.cpp follows at most a few stacks at a time."""
    if count == 0:
        return ""
    if count <= NATIVE_REPEAT:
        return f"{item}{{0,{count}}}"
    block = _block(count + 1)
    full, rest = divmod(count, block)
    whole = f"({_exact(item, block)})"
    fewer = " ".join(p for p in (_up_to(whole, full - 1), _up_to(item, block - 1)) if p)
    most = " ".join(p for p in (_exact(whole, full), _up_to(item, rest)) if p)
    return f"({fewer} | {most})"


# ---- what llama.cpp's parser builds --------------------------------------------------------------


@dataclass(frozen=True)
class GrammarSize:
    """What llama.cpp builds from a grammar: its rules and their elements (8 bytes each)."""

    rules: int
    elements: int


def measure(gbnf: str) -> GrammarSize:
    """Parse ``gbnf`` as llama.cpp's parser does and count the rules and elements it would build;
    :class:`GbnfError` for the repetitions llama.cpp refuses (and for text it cannot parse)."""
    return _Parser(gbnf).parse()


_WORD = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_DIGITS = frozenset("0123456789")


class _Parser:
    """llama_grammar_parser's recursive descent, keeping counts instead of elements."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.symbols: dict[str, int] = {}
        self.rules: dict[int, int] = {}  # rule id -> element count

    def parse(self) -> GrammarSize:
        pos = self._space(0, newline_ok=True)
        while pos < len(self.src):
            pos = self._rule(pos)
        return GrammarSize(rules=len(self.rules), elements=sum(self.rules.values()))

    def _char(self, pos: int) -> int:
        return ord(self.src[pos]) if pos < len(self.src) else 0

    def _at(self, pos: int) -> str:
        return self.src[pos] if pos < len(self.src) else ""

    def _space(self, pos: int, newline_ok: bool) -> int:
        src = self.src
        while pos < len(src):
            c = src[pos]
            if c in " \t" or (newline_ok and c in "\r\n"):
                pos += 1
            elif c == "#":
                while pos < len(src) and src[pos] not in "\r\n":
                    pos += 1
            else:
                break
        return pos

    def _name(self, pos: int) -> int:
        end = pos
        while end < len(self.src) and self.src[end] in _WORD:
            end += 1
        if end == pos:
            raise GbnfError(f"expecting name at {self.src[pos : pos + 20]!r}")
        return end

    def _symbol(self, name: str) -> int:
        return self.symbols.setdefault(name, len(self.symbols))

    def _generated(self, base: str) -> int:
        new_id = len(self.symbols)
        self.symbols[f"{base}_{new_id}"] = new_id
        return new_id

    def _rule(self, pos: int) -> int:
        end = self._name(pos)
        name = self.src[pos:end]
        pos = self._space(end, newline_ok=False)
        if self.src[pos : pos + 3] != "::=":
            raise GbnfError(f"expecting ::= at {self.src[pos : pos + 20]!r}")
        pos = self._space(pos + 3, newline_ok=True)
        pos = self._alternates(pos, name, self._symbol(name), nested=False)
        if self._at(pos) == "\r":
            pos += 2 if self._at(pos + 1) == "\n" else 1
        elif self._at(pos) == "\n":
            pos += 1
        elif pos < len(self.src):
            raise GbnfError(f"expecting newline or end at {self.src[pos : pos + 20]!r}")
        return self._space(pos, newline_ok=True)

    def _alternates(self, pos: int, name: str, rule_id: int, nested: bool) -> int:
        size, pos = self._sequence(pos, name, nested)
        while self._at(pos) == "|":
            pos = self._space(pos + 1, newline_ok=True)
            more, pos = self._sequence(pos, name, nested)
            size += 1 + more  # ALT
        self.rules[rule_id] = size + 1  # END
        return pos

    def _literal_char(self, pos: int) -> int:
        """The end of one (possibly escaped) character of a literal or class."""
        if self._at(pos) == "\\":
            kind = self._at(pos + 1)
            digits = {"x": 2, "u": 4, "U": 8}.get(kind)
            if digits is not None:
                end = pos + 2
                while end < pos + 2 + digits and self._at(end) in "0123456789abcdefABCDEF" and self._at(end):
                    end += 1
                if end == pos + 2:
                    raise GbnfError("expecting hex digits")
                return end
            if kind in ('"', "\\", "[", "]", "t", "r", "n"):
                return pos + 2
            raise GbnfError(f"unknown escape at {self.src[pos : pos + 10]!r}")
        if pos >= len(self.src):
            raise GbnfError("unexpected end of input")
        return pos + 1

    def _sequence(self, pos: int, name: str, nested: bool) -> tuple[int, int]:
        """Parse one sequence; return its element count and the position after it."""
        size = 0
        last_start = 0  # where the last symbol began (an element index in this sequence's rule)
        prev_rules = 1
        has_last = False

        def repeat(min_times: int, max_times: int | None) -> None:
            nonlocal size, prev_rules
            if not has_last:
                raise GbnfError("expecting preceding item to */+/?/{")
            symbol = size - last_start
            total = max_times if max_times is not None and max_times > 0 else max(min_times, 1)
            if prev_rules * total >= LLAMA_REPETITION_THRESHOLD:
                raise GbnfError("number of rules that are going to be repeated exceeds llama.cpp's limit")
            size = last_start if min_times == 0 else size + (min_times - 1) * symbol
            optional = 1 if max_times is None else max_times - min_times
            for index in range(optional):
                # The symbol, a reference to the next optional rule (not in the first of a bounded
                # run), ALT and END; the sequence keeps one reference to the last of them.
                linked = max_times is None or index > 0
                self.rules[self._generated(name)] = symbol + int(linked) + 2
            if optional:
                size += 1
            prev_rules *= total

        src = self.src
        while pos < len(src):
            c = src[pos]
            if c == '"':
                pos += 1
                last_start, prev_rules, has_last = size, 1, True
                while self._at(pos) != '"':
                    pos = self._literal_char(pos)
                    size += 1
                pos = self._space(pos + 1, nested)
            elif c == "[":
                pos += 1
                if self._at(pos) == "^":
                    pos += 1
                last_start, prev_rules, has_last = size, 1, True
                while self._at(pos) != "]":
                    pos = self._literal_char(pos)
                    size += 1
                    if self._at(pos) == "-" and self._at(pos + 1) not in ("]", ""):
                        pos = self._literal_char(pos + 1)
                        size += 1
                pos = self._space(pos + 1, nested)
            elif c in _WORD:
                end = self._name(pos)
                self._symbol(src[pos:end])
                pos = self._space(end, nested)
                last_start, prev_rules, has_last = size, 1, True
                size += 1
            elif c == "(":
                pos = self._space(pos + 1, newline_ok=True)
                before = len(self.symbols)
                sub_id = self._generated(name)
                pos = self._alternates(pos, name, sub_id, nested=True)
                prev_rules = max(1, len(self.symbols) - before)
                last_start, has_last = size, True
                size += 1
                if self._at(pos) != ")":
                    raise GbnfError(f"expecting ')' at {src[pos : pos + 20]!r}")
                pos = self._space(pos + 1, nested)
            elif c == ".":
                last_start, prev_rules, has_last = size, 1, True
                size += 1
                pos = self._space(pos + 1, nested)
            elif c in "*+?":
                pos = self._space(pos + 1, nested)
                repeat(*{"*": (0, None), "+": (1, None), "?": (0, 1)}[c])
            elif c == "{":
                pos = self._space(pos + 1, nested)
                end = pos
                while self._at(end) in _DIGITS and self._at(end):
                    end += 1
                if end == pos:
                    raise GbnfError("expecting an int")
                min_times = int(src[pos:end])
                pos = self._space(end, nested)
                max_times: int | None = None
                if self._at(pos) == "}":
                    max_times = min_times
                elif self._at(pos) == ",":
                    pos = self._space(pos + 1, nested)
                    end = pos
                    while self._at(end) in _DIGITS and self._at(end):
                        end += 1
                    if end > pos:
                        max_times = int(src[pos:end])
                        pos = self._space(end, nested)
                    if self._at(pos) != "}":
                        raise GbnfError("expecting '}'")
                else:
                    raise GbnfError("expecting ',' or '}'")
                pos = self._space(pos + 1, nested)
                if min_times > LLAMA_REPETITION_THRESHOLD:
                    raise GbnfError("number of repetitions exceeds llama.cpp's limit")
                if max_times is not None and max_times < min_times:
                    raise GbnfError("a repetition's maximum is below its minimum")
                repeat(min_times, max_times)
            else:
                break
        return size, pos
