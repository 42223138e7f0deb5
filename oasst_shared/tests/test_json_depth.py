"""The depth of JSON measured before it is parsed, against the depth of what the parser reads."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from oasst_shared.json_depth import json_depth, value_depth

# Strings full of what could confuse a scanner: brackets, quotes, backslashes, escapes.
tricky_text = st.text(alphabet=st.sampled_from('[]{}"\\/\nu0aé😀 ,:'), max_size=12)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | tricky_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4),
    max_leaves=40,
)


def parsed_depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((parsed_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((parsed_depth(v) for v in value), default=0)
    return 0


@settings(max_examples=500, deadline=None)
@given(values, st.booleans(), st.booleans())
def test_the_scan_agrees_with_the_parser(value, ascii_only, indent):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=2 if indent else None).encode()
    assert json_depth(text) == parsed_depth(value) == parsed_depth(json.loads(text))
    assert value_depth(value, 1000) == parsed_depth(value)


def test_brackets_inside_strings_do_not_count():
    assert json_depth(b'{"a": "[[[[{{{{"}') == 1
    assert json_depth(b'["\\"[[[", "\\\\", [["x\\\\\\"]]]"]]]') == 3
    assert json_depth(b'"\\\\"') == 0
    assert json_depth(b"") == json_depth(b"42") == json_depth(b'"["') == 0


def test_deep_and_malformed_text():
    assert json_depth(b"[" * 100_000 + b"]" * 100_000) == 100_000
    assert json_depth(b"[" * 100_000) == 100_000  # unclosed: the parser refuses it afterwards
    # Malformed: a parser stops where the running count first goes below zero, and never nests more
    # deeply than the count before that point.
    assert json_depth(b"]]]][[") == 0
    assert json_depth(b"[[]]]][[[") == 2
    assert json_depth(b'["unterminated') == 1


def test_value_depth_stops_past_its_limit():
    deep: Any = []
    for _ in range(100_000):
        deep = [deep]
    assert value_depth(deep, 10) == 11  # counted no further, and no recursion
    assert value_depth({"a": ({"b": 1},)}, 10) == 3
    assert value_depth("text", 10) == 0
