"""Schemas to llama.cpp grammars, judged by llama.cpp itself (its grammar parser and sampler, on SmolLM2's
vocabulary; no generation): every schema within the bounds gives a grammar llama.cpp builds, the texts it
lets through are the schema's, the shared estimate bounds the real grammar, and nothing reaches the
sampler unchecked."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from llama_cpp import llama_grammar

from oasst_cpu_backend.grammar import check_gbnf, request_grammar, sampler_grammar, schema_to_gbnf
from oasst_cpu_backend.schemas import GenerateParameters
from oasst_cpu_backend.validation import InvalidRequest
from oasst_shared import schema_bounds
from oasst_shared.gbnf import measure, repetition
from oasst_shared.json_pattern import parse_pattern
from oasst_shared.schema_bounds import SchemaBoundsError, check_schema
from tests.support.grammar_probe import accepts, builds, vocab
from tests.support.json_schemas import object_schemas, patterns, schemas

SUMMARY_2000 = {
    "type": "object",
    "properties": {"summary": {"type": "string", "maxLength": 2000}},
    "required": ["summary"],
}


def test_the_schema_that_crashed_the_backend_gives_a_grammar_llama_cpp_builds() -> None:
    # llama-cpp-python's own converter nests maxLength 2000 as 2000 groups, which llama.cpp refuses
    # (NULL, and the process died on the first token).
    original = llama_grammar.json_schema_to_gbnf(json.dumps(SUMMARY_2000))
    assert not builds(original)
    gbnf = schema_to_gbnf(SUMMARY_2000)
    assert builds(gbnf)
    for length in (0, 1, 1999, 2000):
        assert accepts(gbnf, json.dumps({"summary": "a" * length}))
    assert not accepts(gbnf, json.dumps({"summary": "a" * 2001}))
    assert not accepts(gbnf, '{"summary": "a\nb"}')  # a raw newline is not JSON


@pytest.mark.parametrize(
    ("low", "high"), [(0, 33), (0, 300), (7, 1000), (1000, 1000), (0, 10_000), (2500, 9000)]
)
def test_llama_cpp_takes_exactly_the_counts_of_a_repetition(low: int, high: int) -> None:
    gbnf = "root ::= " + repetition('"a"', low, high)
    assert builds(gbnf)
    edges = {low, min(low + 1, high), (low + high) // 2, max(high - 1, low), high}
    for count in edges:
        assert accepts(gbnf, "a" * count), count
    assert not accepts(gbnf, "a" * (high + 1))
    if low:
        assert not accepts(gbnf, "a" * (low - 1))


def test_ordinary_patterns_are_json_text_llama_cpp_takes() -> None:
    schema = {"type": "string", "pattern": r"^\d{3}-[a-z]+\.com$"}
    gbnf = schema_to_gbnf(schema)
    assert accepts(gbnf, '"555-abc.com"')
    assert not accepts(gbnf, '"555-abcxcom"')  # "\." is a dot, not any character
    quoted = schema_to_gbnf({"type": "string", "pattern": '^a.b"c\\\\$'})
    assert accepts(quoted, json.dumps('axb"c\\'))
    assert not accepts(quoted, '"a"b\\"c\\\\"')  # the wildcard never writes a raw quote


_TEXT = st.one_of(st.characters(min_codepoint=0x20, max_codepoint=0x7E), st.just("é"))


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(pattern=patterns(), data=st.data())
def test_a_pattern_grammar_lets_through_the_json_text_of_what_the_pattern_matches(
    pattern: str, data: st.DataObject
) -> None:
    try:
        check_schema({"type": "string", "pattern": pattern}, "schema")
    except SchemaBoundsError:
        assume(False)
    # (Long repetitions make long texts: they are the repetition tests' business.)
    assume(all((r.max or r.min) <= 40 for r, _ in parse_pattern(pattern).repeats()))
    gbnf = schema_to_gbnf({"type": "string", "pattern": pattern})
    # The grammar's strings are the pattern's, ECMA's \d, \w and \s being ASCII's here (Python's are
    # wider): every matching text without a quote or backslash (wildcards and negated classes leave those
    # out: JSON escapes them), and nothing that does not match.
    matching = data.draw(st.from_regex(pattern, alphabet=_TEXT))
    # (Python's $ also matches before a final newline, ECMA's does not.)
    if re.search(pattern, matching, re.ASCII) and not re.search(r'["\\\n]', matching):
        assert accepts(gbnf, json.dumps(matching, ensure_ascii=False)), (pattern, matching)
    other = data.draw(st.text(alphabet='ab7Z-. @é"\\,x/', max_size=12))
    if accepts(gbnf, json.dumps(other, ensure_ascii=False)):
        assert re.search(pattern, other), (pattern, other)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(schema=st.one_of(schemas(), object_schemas()))
def test_every_schema_within_the_bounds_gives_a_grammar_llama_cpp_builds_and_the_estimate_bounds_it(
    schema: dict[str, Any],
) -> None:
    try:
        estimate = check_schema(schema, "schema")
    except SchemaBoundsError as error:
        with pytest.raises(InvalidRequest, match=re.escape(error.reason)):
            schema_to_gbnf(schema)
        return
    gbnf = schema_to_gbnf(schema)
    size = measure(gbnf)
    assert size.elements <= estimate.elements
    assert len(gbnf) <= estimate.characters
    assert builds(gbnf)
    check_gbnf(vocab(), gbnf)


def test_the_estimate_covers_the_built_in_rules() -> None:
    everything = {
        "type": "object",
        "properties": {
            **{t: {"type": t} for t in ("string", "number", "integer", "boolean", "null", "array", "object")},
            **{f: {"type": "string", "format": f} for f in ("date", "time", "date-time", "uuid", "uuid4")},
            "free": {},
            "more": {"type": "object", "additionalProperties": True},
        },
    }
    gbnf = schema_to_gbnf(everything)
    estimate = check_schema(everything, "schema")
    assert measure(gbnf).elements <= estimate.elements and len(gbnf) <= estimate.characters
    assert schema_bounds.RESERVED_RULE_NAMES == frozenset(llama_grammar.RESERVED_NAMES)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "pattern": r"^\d+$"},  # llama.cpp refused "\d"
        {"type": "string", "pattern": r"^[a-z]+\.[a-z]+$"},  # and "\."
        {"enum": ['a"b', "c\\d", "e\nf"]},  # a backslash ended the literal early
        {"type": "array", "items": {}},  # the converter failed on items: {}
        {"type": "string", "pattern": "^(?:a{0})*$"},  # a repeated empty rule reads as left recursion
        {  # a recursive $defs name that is not a rule name ("a_b") was written raw
            "$defs": {"a_b": {"type": "object", "properties": {"next": {"$ref": "#/$defs/a_b"}}}},
            "$ref": "#/$defs/a_b",
        },
        {  # refs under a root $ref were never resolved
            "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            "$ref": "#/$defs/n",
        },
    ],
)
def test_schemas_llama_cpp_python_turned_into_a_refused_grammar_now_work(schema: dict[str, Any]) -> None:
    assert builds(schema_to_gbnf(schema))


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ({"type": "string", "maxLength": 20_000}, "grammar.maxLength`: 20000 is more"),
        ({"type": "string", "minLength": 30_000_000}, "grammar.minLength`"),
        ({"type": "string", "pattern": "^(?=a)$"}, "unsupported pattern"),
        ({"type": "strin"}, "invalid JSON schema"),
        ({"anyOf": [True, False]}, "not a schema this backend takes"),
    ],
)
def test_what_cannot_be_a_grammar_is_refused(schema: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequest, match=re.escape(message)):
        schema_to_gbnf(schema)


def test_a_grammar_llama_cpp_refuses_never_reaches_the_sampler() -> None:
    for refused in ('root ::= "a"{2001}', r'root ::= "\d"', "root ::= root", "root ::= undefined"):
        with pytest.raises(InvalidRequest, match="llama.cpp refused"):
            check_gbnf(vocab(), refused)
        with pytest.raises(InvalidRequest):
            sampler_grammar(vocab(), refused)
    sampler_grammar(vocab(), 'root ::= "a"')


ENGINE_WITH_A_REFUSED_GRAMMAR = """
from oasst_cpu_backend.batch import generate_alone
from oasst_cpu_backend.engine import ModelEngine
from oasst_cpu_backend.records import EngineRequest, Sampling
from oasst_cpu_backend.settings import default_model_path
from oasst_cpu_backend.validation import InvalidRequest

engine = ModelEngine(default_model_path(), n_ctx=256, n_threads=1)
job = EngineRequest(engine.tokenize("Hello"), 4, Sampling(grammar='root ::= "\\\\d"'))
try:
    generate_alone(engine, job)
except InvalidRequest as error:
    print("refused:", error)
else:
    print("generated")
"""


@pytest.mark.slow
def test_the_engine_refuses_a_grammar_llama_cpp_refuses_instead_of_dying() -> None:
    # In a process of its own: before, llama-cpp-python added the NULL sampler and the process died.
    done = subprocess.run(
        [sys.executable, "-c", ENGINE_WITH_A_REFUSED_GRAMMAR], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "refused: `grammar`: llama.cpp refused" in done.stdout


async def test_a_request_grammar_is_built_off_the_event_loop_within_its_time() -> None:
    params = GenerateParameters.model_validate(
        {"grammar": {"type": "json", "value": json.dumps(SUMMARY_2000)}}
    )
    gbnf = await request_grammar(params, vocab(), timeout=60)
    assert gbnf is not None and builds(gbnf)
    assert await request_grammar(GenerateParameters(), vocab(), timeout=60) is None
    with pytest.raises(InvalidRequest, match="regex"):
        await request_grammar(
            GenerateParameters.model_validate({"grammar": {"type": "regex", "value": "a+"}}),
            vocab(),
            timeout=60,
        )


async def test_a_grammar_that_takes_too_long_to_build_is_refused() -> None:
    wide = {
        "type": "object",
        "properties": {f"f{i}": {"type": "string", "maxLength": 5000} for i in range(200)},
    }
    params = GenerateParameters.model_validate({"grammar": {"type": "json", "value": wide}})
    with pytest.raises(InvalidRequest, match="took longer than"):
        await request_grammar(params, vocab(), timeout=1e-6)
