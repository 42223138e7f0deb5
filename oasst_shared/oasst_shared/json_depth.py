"""How deeply JSON nests, measured before it is parsed (text) or before it is used (values).

Parsers fail in their own ways past their depth limits (Python's ``json`` with a ``RecursionError``
whose depth depends on the caller's stack, pydantic's parser and serializer with errors of their own),
so whatever reads JSON from outside measures it first and refuses it with a clear error past
:data:`oasst_shared.limits.MAX_JSON_DEPTH`.
"""

from __future__ import annotations

from itertools import accumulate
from typing import Any

_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
# An opening bracket becomes +1, a closing one -1 (0xff read as a signed byte).
_SIGNS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")


def json_depth(text: bytes) -> int:
    """The deepest nesting of arrays and objects in JSON ``text`` (0 for a scalar).

    Brackets inside strings do not count. Runs at C speed whatever the text holds, about as fast as
    ``json.loads`` itself and never much slower (measured: 5 us for an ordinary chat request, 150 us
    for 20 tools in 11 KB, 1 ms for 2 MiB of text, under 200 ms for the worst 2 MiB): the strings are
    cut out with two replacements and a split on quotes, and the depth is the largest running sum of
    the brackets that remain. Malformed JSON gets a number too, never less than the depth a parser
    reaches before it finds the fault; the parser refuses it afterwards.
    """
    if b"\\" in text:
        # An escaped backslash, then an escaped quote, left to right as a JSON reader pairs escapes:
        # every quote left delimits a string.
        text = text.replace(b"\\\\", b"").replace(b'\\"', b"")
    if b'"' in text:
        text = b"".join(text.split(b'"')[::2])  # what lies between strings
    signs = text.translate(_SIGNS, _NOT_BRACKETS)
    return max(0, max(accumulate(memoryview(signs).cast("b")), default=0))


def value_depth(value: Any, limit: int) -> int:
    """The nesting of lists and dicts in a parsed value, counted up to ``limit + 1`` (then it stops:
    a value is only ever compared with a limit). Iterative, so a deep value cannot exhaust the stack."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        pending.extend((child, depth + 1) for child in children if isinstance(child, dict | list | tuple))
    return deepest
