"""The bounds on what a JSON schema expands into: each refusal names its field; ordinary schemas pass.

The estimate's agreement with the bundled backend's real converter is checked in the CPU backend's tests
(tests/cpu_backend/test_grammar.py), which have llama-cpp-python.
"""

from __future__ import annotations

from typing import Any

import pytest

from oasst_shared.schema_bounds import (
    MAX_GRAMMAR_ELEMENTS,
    MAX_SCHEMA_DEPTH,
    SchemaBoundsError,
    check_schema,
    check_tool_schemas,
    too_deep,
)
from oasst_shared.tool_calls import NamedToolChoice, ToolDefinition
from tests.support.json_schemas import nested

ROOT = "response_format.json_schema.schema"


def refused(schema: Any) -> SchemaBoundsError:
    with pytest.raises(SchemaBoundsError) as caught:
        check_schema(schema, ROOT)
    return caught.value


def tool(name: str, parameters: dict[str, Any]) -> ToolDefinition:
    return ToolDefinition.model_validate(
        {"type": "function", "function": {"name": name, "parameters": parameters}}
    )


ORDINARY: list[dict[str, Any]] = [
    {
        "type": "object",
        "properties": {"summary": {"type": "string", "maxLength": 2000}},
        "required": ["summary"],
    },
    {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": 300,
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "minLength": 1, "maxLength": 200},
                        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 10},
                        "phone": {"type": "string", "pattern": r"^\+?[0-9]{7,15}$"},
                        "host": {"type": "string", "pattern": r"^([a-z0-9-]{1,63}\.)+[a-z]{2,24}$"},
                        "price": {"type": "number", "minimum": 0, "maximum": 1e9},
                    },
                    "required": ["name"],
                },
            },
            "note": {"anyOf": [{"type": "string", "maxLength": 10_000}, {"type": "null"}]},
        },
    },
    {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "$ref": "#/$defs/node",
    },
    nested(MAX_SCHEMA_DEPTH // 2 - 1),
]


@pytest.mark.parametrize("schema", ORDINARY)
def test_ordinary_schemas_pass(schema: dict[str, Any]) -> None:
    estimate = check_schema(schema, ROOT)
    assert 0 < estimate.elements < MAX_GRAMMAR_ELEMENTS // 10


def test_a_deep_schema_is_refused_where_it_gets_too_deep() -> None:
    error = refused(nested(200))
    assert "nested deeper than 64 levels" in error.reason
    assert error.path == ROOT + ".properties.a" * 32
    assert too_deep(nested(31)) is None and too_deep(nested(32)) == ".".join(["properties", "a"] * 32)


@pytest.mark.parametrize(
    ("schema", "field", "reason"),
    [
        ({"type": "string", "maxLength": 2001 * 10}, "maxLength", "limit of 10000"),
        ({"type": "string", "minLength": 30_000_000}, "minLength", "limit of 10000"),
        ({"type": "string", "maxLength": -1}, "maxLength", "non-negative integer"),
        ({"type": "string", "maxLength": True}, "maxLength", "non-negative integer"),
        ({"type": "string", "maxLength": 2.5}, "maxLength", "non-negative integer"),
        ({"type": "string", "minLength": 5, "maxLength": 4}, "minLength", "more than maxLength"),
        ({"type": "array", "maxItems": 1001}, "maxItems", "limit of 1000"),
        ({"type": "object", "minProperties": 5000}, "minProperties", "limit of 1000"),
        ({"type": "array", "minContains": 2, "maxContains": 1}, "minContains", "more than"),
        ({"type": "integer", "minimum": 1e300}, "minimum", "2^53"),
        ({"type": "number", "multipleOf": 0}, "multipleOf", "greater than 0"),
        ({"type": "number", "maximum": "10"}, "maximum", "finite number"),
        ({"type": "string", "pattern": "^" + "a" * 1001 + "$"}, "pattern", "limit of 1000"),
        ({"type": "string", "pattern": "^a{0,5000}$"}, "pattern", "repetition count of 5000"),
        ({"type": "string", "pattern": "^(a{0,30}){0,30}$"}, "pattern", "multiply to 900"),
        ({"type": "string", "pattern": "^(?=x)a$"}, "pattern", "lookarounds"),
        ({"type": "string", "pattern": 5}, "pattern", "must be a string"),
        (
            {"type": "object", "patternProperties": {"^(a{0,99}){0,99}$": {}}},
            'patternProperties["^(a{0,99}){0,99}$"]',
            "multiply",
        ),
        ({"type": "object", "properties": {f"p{i}": {} for i in range(257)}}, "properties", "257 properties"),
        ({"$ref": "https://example.com/schema.json"}, "$ref", "inside the schema"),
        ({"$ref": "#"}, "$ref", "inside the schema"),
        ({"$ref": "#/$defs/missing"}, "$ref", "refers to nothing"),
    ],
)
def test_each_bound_names_its_field(schema: dict[str, Any], field: str, reason: str) -> None:
    error = refused({"type": "object", "properties": {"x": schema}})
    assert error.path == f"{ROOT}.properties.x{'' if field.startswith('[') else '.'}{field}".replace(
        ".[", "["
    )
    assert reason in error.reason


def test_keywords_are_read_as_schema_keywords_only() -> None:
    # A property named maxLength is a property, and an enum value is data.
    check_schema(
        {"type": "object", "properties": {"maxLength": {"type": "string"}}, "enum": [{"maxLength": -5}]}, ROOT
    )


def test_a_reference_cycle_with_nothing_in_between_is_refused() -> None:
    error = refused(
        {"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}}, "$ref": "#/$defs/a"}
    )
    assert error.path == f"{ROOT}.$defs.a.anyOf[0].$ref"
    assert "leads back to itself" in error.reason


def test_reference_fan_out_is_counted_once_per_reference() -> None:
    # Each level refers to the one below twice: 2^30 paths, 30 rules.
    defs: dict[str, Any] = {"d0": {"type": "string", "maxLength": 100}}
    for level in range(1, 31):
        below = {"$ref": f"#/$defs/d{level - 1}"}
        defs[f"d{level}"] = {"type": "object", "properties": {"l": below, "r": below}}
    estimate = check_schema({"$defs": defs, "$ref": "#/$defs/d30"}, ROOT)
    assert estimate.elements < 10_000


def test_fan_out_through_all_of_is_bounded_by_the_budget() -> None:
    # allOf copies the properties of what it refers to: each level doubles the converter's work.
    defs: dict[str, Any] = {
        "d0": {"type": "object", "properties": {"s": {"type": "string", "maxLength": 1000}}}
    }
    for level in range(1, 25):
        ref = {"$ref": f"#/$defs/d{level - 1}"}
        defs[f"d{level}"] = {
            "type": "object",
            "properties": {"x": {"allOf": [ref, ref]}, "y": {"allOf": [ref, ref]}},
        }
    error = refused({"$defs": defs, "$ref": "#/$defs/d24"})
    assert error.path == ROOT and "too large" in error.reason


def test_a_grammar_past_the_budget_names_the_whole_schema() -> None:
    wide = {
        "type": "object",
        "properties": {f"f{i}": {"type": "string", "maxLength": 10_000} for i in range(256)},
    }
    check_schema(wide, ROOT)
    error = refused({"type": "object", "properties": {f"o{i}": wide for i in range(4)}})
    assert error.path == ROOT
    assert f"more than {MAX_GRAMMAR_ELEMENTS} elements" in error.reason


def test_tools_are_bounded_one_by_one_and_as_the_set_an_answer_may_call() -> None:
    big = {"type": "object", "properties": {"s": {"type": "string", "maxLength": 50_000}}}
    tools = [tool("ok", {"type": "object"}), tool("big", big)]
    with pytest.raises(SchemaBoundsError) as caught:
        check_tool_schemas(tools, "none")
    assert caught.value.path == "tools[1].function.parameters.properties.s.maxLength"
    # A tool's parameters sit 4 levels down in the schema of a call.
    deep = [tool("deep", nested(MAX_SCHEMA_DEPTH // 2 - 1))]
    with pytest.raises(SchemaBoundsError, match="nested deeper"):
        check_tool_schemas(deep, "required")
    # Each tool small, the set too large: the set is named.
    fields = {
        "type": "object",
        "properties": {f"f{i}": {"type": "string", "maxLength": 9000} for i in range(40)},
    }
    many = [tool(f"t{i}", fields) for i in range(20)]
    assert check_tool_schemas(many[:2], "required") is not None
    with pytest.raises(SchemaBoundsError) as caught:
        check_tool_schemas(many, "auto")
    assert caught.value.path == "tools" and "too large" in caught.value.reason
    # A named choice constrains to that tool alone.
    estimate = check_tool_schemas(many, NamedToolChoice.model_validate({"function": {"name": "t3"}}))
    assert estimate is not None and estimate.elements < MAX_GRAMMAR_ELEMENTS


def test_a_forced_call_schema_must_fit_where_a_schema_fits() -> None:
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "description": "x" * 200} for i in range(100)},
    }
    tools = [tool(f"t{i}", wide) for i in range(4)]
    assert check_tool_schemas(tools, "auto") is not None
    with pytest.raises(SchemaBoundsError, match="64000"):
        check_tool_schemas(tools, "required")


def test_errors_inside_a_tool_set_name_the_tool() -> None:
    bad = {"type": "object", "properties": {"p": {"type": "string", "pattern": "^(a{0,99}){0,99}$"}}}
    tools = [tool("a", {"type": "object"}), tool("b", {"type": "object"}), tool("c", bad)]
    with pytest.raises(SchemaBoundsError) as caught:
        check_tool_schemas(tools, NamedToolChoice.model_validate({"function": {"name": "c"}}))
    assert caught.value.path == "tools[2].function.parameters.properties.p.pattern"
