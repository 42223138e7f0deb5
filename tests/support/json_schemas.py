"""Hypothesis strategies for JSON schemas as clients send them for structured output and tool parameters:
nested objects and arrays, strings with length keywords, patterns and formats, enums and consts, anyOf,
$defs/$ref (recursive ones too), numbers. Counts run past the server's bounds now and then, so that both
sides of every bound are drawn.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

Schema = dict[str, Any]


def nested(levels: int) -> Schema:
    """A string inside ``levels`` objects, each the one required property of the one around it."""
    schema: Schema = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_.-$ AZ09é", min_size=1, max_size=12)
_SMALL_COUNT = st.integers(min_value=0, max_value=40)
_COUNT = st.one_of(
    _SMALL_COUNT, st.integers(min_value=0, max_value=2500), st.sampled_from([2000, 10_000, 10_001])
)
_LITERAL_TEXT = st.text(alphabet='abcXYZ019 -_."\\/\n\té', max_size=8)


def _pattern_atom() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(["a", "b", "Z", "7", "-", " ", "@", "é"]),
        st.sampled_from(["\\.", "\\-", '"', "\\\\", "\\/", "\\d", "\\w", "\\s", "\\D", "\\x41", "\\u00e9"]),
        st.sampled_from(["[a-z]", "[0-9]", "[A-Za-z0-9_]", "[^,]", '[^"]', '["x]', "[\\d.]", "."]),
    )


def _quantifier() -> st.SearchStrategy[str]:
    few = st.integers(min_value=0, max_value=6)
    bounded = st.tuples(few, few).map(lambda p: f"{{{min(p)},{max(p)}}}")
    return st.one_of(
        st.just(""),
        st.just(""),
        st.sampled_from(["*", "+", "?", "*?"]),
        bounded,
        few.map(lambda n: f"{{{n}}}"),
        st.sampled_from(["{1,}", "{0,40}", "{0,300}", "{2,1200}"]),
    )


def patterns() -> st.SearchStrategy[str]:
    """Regular expressions of the supported subset, mostly anchored, some past the bounds."""

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        sequence = st.lists(st.tuples(inner, _quantifier()).map("".join), min_size=1, max_size=4).map("".join)
        return st.one_of(
            sequence,
            st.lists(sequence, min_size=2, max_size=3).map(lambda alts: "(" + "|".join(alts) + ")"),
            sequence.map(lambda s: f"(?:{s})"),
        )

    body = st.recursive(_pattern_atom(), extend, max_leaves=6)
    sequence = st.lists(st.tuples(body, _quantifier()).map("".join), min_size=1, max_size=5).map("".join)
    return st.tuples(
        st.sampled_from(["^", "^", "^", ""]), sequence, st.sampled_from(["$", "$", "$", ""])
    ).map("".join)


def _string() -> st.SearchStrategy[Schema]:
    def build(lengths: tuple[int | None, int | None], pattern: str | None, fmt: str | None) -> Schema:
        schema: Schema = {"type": "string"}
        low, high = lengths
        if low is not None:
            schema["minLength"] = low
        if high is not None:
            schema["maxLength"] = high if low is None else max(low, high)
        if pattern is not None:
            schema["pattern"] = pattern
        elif fmt is not None:
            schema["format"] = fmt
        return schema

    return st.builds(
        build,
        st.tuples(st.none() | _SMALL_COUNT, st.none() | _COUNT),
        st.none() | st.none() | patterns(),
        st.none() | st.sampled_from(["date", "date-time", "uuid", "email"]),
    )


def _number() -> st.SearchStrategy[Schema]:
    bounds = st.fixed_dictionaries(
        {}, optional={"minimum": st.integers(-100, 100), "maximum": st.floats(-1e20, 1e20, allow_nan=False)}
    )
    return st.builds(
        lambda kind, extra: {"type": kind, **extra}, st.sampled_from(["integer", "number"]), bounds
    )


def _scalar() -> st.SearchStrategy[Any]:
    return st.one_of(_LITERAL_TEXT, st.integers(-1000, 1000), st.booleans(), st.none())


def _leaf() -> st.SearchStrategy[Schema]:
    return st.one_of(
        _string(),
        _number(),
        st.sampled_from([{"type": "boolean"}, {"type": "null"}, {"type": ["string", "null"]}, {}]),
        st.lists(_scalar(), min_size=1, max_size=5, unique_by=repr).map(lambda values: {"enum": values}),
        _scalar().map(lambda value: {"const": value}),
    )


def _extend(inner: st.SearchStrategy[Schema]) -> st.SearchStrategy[Schema]:
    def obj(properties: dict[str, Schema], required: list[bool], closed: bool) -> Schema:
        names = list(properties)
        schema: Schema = {
            "type": "object",
            "properties": properties,
            "required": [n for n, r in zip(names, required, strict=False) if r],
        }
        if closed:
            schema["additionalProperties"] = False
        return schema

    def array(items: Schema, counts: tuple[int | None, int | None]) -> Schema:
        schema: Schema = {"type": "array", "items": items}
        low, high = counts
        if low is not None:
            schema["minItems"] = min(low, 3)
        if high is not None:
            schema["maxItems"] = high if low is None else max(min(low, 3), high)
        return schema

    return st.one_of(
        st.builds(
            obj,
            st.dictionaries(_NAMES, inner, min_size=1, max_size=4),
            st.lists(st.booleans(), max_size=4),
            st.booleans(),
        ),
        st.builds(array, inner, st.tuples(st.none() | _SMALL_COUNT, st.none() | _COUNT)),
        st.lists(inner, min_size=2, max_size=3).map(lambda alternatives: {"anyOf": alternatives}),
    )


def _with_definitions(body: Schema, definition: Schema, recursive: bool) -> Schema:
    """``body`` as an object with one property referring to ``definition`` (which, if ``recursive``,
    holds a list of itself)."""
    if recursive:
        definition = {
            "type": "object",
            "properties": {
                "value": definition,
                "children": {"type": "array", "items": {"$ref": "#/$defs/node_1"}},
            },
            "required": ["value"],
        }
    return {
        "$defs": {"node_1": definition},
        "type": "object",
        "properties": {"main": body, "linked": {"$ref": "#/$defs/node_1"}},
        "required": ["main", "linked"],
    }


def schemas(max_leaves: int = 8) -> st.SearchStrategy[Schema]:
    """A schema for ``response_format`` (an object or not), sometimes with definitions and references."""
    plain = st.recursive(_leaf(), _extend, max_leaves=max_leaves)
    referring = st.builds(_with_definitions, plain, plain, st.booleans())
    return st.one_of(plain, plain, referring)


def object_schemas(max_leaves: int = 6) -> st.SearchStrategy[Schema]:
    """A schema for a tool's parameters: always an object."""
    return st.builds(
        lambda properties: {"type": "object", "properties": properties, "required": list(properties)[:1]},
        st.dictionaries(
            _NAMES, st.recursive(_leaf(), _extend, max_leaves=max_leaves), min_size=1, max_size=3
        ),
    )
