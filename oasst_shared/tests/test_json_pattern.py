"""Patterns: what is parsed and refused, and the GBNF written for them (llama.cpp's verdict on that GBNF is
in the CPU backend's tests/cpu_backend/test_grammar.py)."""

from __future__ import annotations

import pytest

from oasst_shared.gbnf import measure
from oasst_shared.json_pattern import CharSet, PatternError, Repeat, parse_pattern, pattern_gbnf


def gbnf(pattern: str) -> str:
    rules: list[str] = []

    def add_rule(name: str, body: str) -> str:
        rules.append(f"{name} ::= {body}")
        return name

    body = pattern_gbnf(parse_pattern(pattern), "p", add_rule)
    return "\n".join([f"root ::= {body}", *rules])


@pytest.mark.parametrize(
    "pattern",
    [
        r"^\d{3}-\d{4}$",
        r"^[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}$",
        r"^(?:[01]\d|2[0-3]):[0-5]\d$",
        r"^(?<year>\d{4})-(\d{2})$",
        r"^[^\s@]+$",
        r"^\w+\s?\W*\S\D$",
        r"^\x41\u00e9\t\n[\b]$",
        r"^a{2,}b*?c+?d??$",
        r"^{}]{,3}$",
        r"[0-9]",
        "^$",
        "",
    ],
)
def test_ordinary_patterns_parse_and_give_a_grammar_llama_cpp_sizes(pattern: str) -> None:
    measure(gbnf(pattern))


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        (r"^(?=a)b$", "lookaround"),
        (r"^(?!a)b$", "lookaround"),
        (r"^(?<=a)b$", "lookaround"),
        (r"^(a)\1$", "backreference"),
        (r"^\bword\b$", "position"),
        (r"^\p{L}$", "not supported"),
        (r"^a^b$", "anchors"),
        (r"^a$b$", "anchors"),
        (r"^*a$", "nothing to repeat"),
        (r"^a**$", "nothing to repeat"),
        (r"^a{2,1}$", "out of order"),
        (r"^[]$", "empty"),
        (r"^[z-a]$", "out of order"),
        (r"^(a$", "missing"),
        (r"^a)$", "unbalanced"),
        (r"^\q$", "unknown escape"),
        ("^\\", "backslash"),
        (r"^[\D]$", "negated shorthand"),
        (r"^\ud800$", "surrogate"),
        ("^" + "(" * 40 + "a" + ")" * 40 + "$", "deeper"),
        (r"^a{1234567890}$", "too large"),
    ],
)
def test_what_is_not_a_supported_regular_expression_is_refused(pattern: str, why: str) -> None:
    with pytest.raises(PatternError, match=why):
        parse_pattern(pattern)


def test_characters_json_escapes_are_written_escaped() -> None:
    # A pattern matches the string's value; the grammar writes its JSON text.
    assert 'root ::= "a\\\\\\"b\\\\\\\\c\\\\n"' in gbnf('^a"b\\\\c\\n$')
    # Wildcards and negated classes never write a raw quote, backslash or control character.
    wildcard = gbnf("^.$")
    assert "\\x22" in wildcard and "\\x5C" in wildcard and "\\x00-\\x1F" in wildcard
    negated = gbnf("^[^a]$")
    assert negated == "root ::= [^\\x00-\\x1F\\x22\\x5Ca]"
    # A class that includes them offers their escapes instead.
    quote = gbnf('^["a]$')
    assert '"\\\\\\""' in quote and "[a]" in quote


def test_unanchored_patterns_match_anywhere() -> None:
    assert gbnf("[0-9]").startswith("root ::= [^\\x00-\\x1F\\x22\\x5C]* [0-9] [^")
    assert gbnf("^a").endswith('"a" [^\\x00-\\x1F\\x22\\x5C]*')


def test_quantified_groups_get_rules_of_their_own() -> None:
    grammar = gbnf("^(ab|c){2,3}(d(e{0,100}))*$")
    assert "p-1 ::= " in grammar and "p-2 ::= " in grammar
    measure(grammar)


def test_nested_repetitions_report_their_product() -> None:
    parsed = parse_pattern(r"^([a-z0-9]{1,63}\.){1,10}[a-z]{2,24}(x*)+$")
    products = sorted(nested for _, nested in parsed.repeats())
    assert products == [1, 1, 10, 24, 630]
    assert isinstance(parsed.repeats()[0][0], Repeat)
    assert parse_pattern(".").body.alternatives[0][0] == CharSet(((10, 10), (13, 13), (0x2028, 0x2029)), True)
