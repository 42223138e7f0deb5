"""GBNF repetitions and llama.cpp's accounting of a grammar (what llama.cpp itself accepts: the CPU backend's
tests/cpu_backend/test_grammar.py)."""

from __future__ import annotations

import pytest

from oasst_shared.gbnf import NATIVE_REPEAT, GbnfError, literal, measure, repetition


def test_small_counts_are_written_as_llama_cpp_writes_them() -> None:
    assert repetition("x", 0, 1) == "x?"
    assert repetition("x", 0, None) == "x*"
    assert repetition("x", 1, None) == "x+"
    assert repetition("x", 3, None) == "x{3} x*"
    assert repetition("x", 2, 5) == "x{2,5}"
    assert repetition("x", 4, 4) == "x{4}"
    assert repetition("x", 0, 0) == ""
    assert repetition("x", 0, 3, '","') == '(x ("," x){0,2})?'
    assert repetition("x", 1, None, '","') == 'x ("," x)*'


@pytest.mark.parametrize("count", [NATIVE_REPEAT + 1, 2000, 10_000, 65_000])
def test_large_counts_cost_about_the_square_root(count: int) -> None:
    text = repetition("char", 0, count)
    # llama.cpp writes x{0,n} as n rules; blocks of about sqrt(n) keep the grammar small at any count.
    assert measure(f"x ::= {text}\nchar ::= [a]").elements < 20 * count**0.5 + 100
    exact = repetition("char", count, count)
    assert measure(f"x ::= {exact}\nchar ::= [a]").elements < 20 * count**0.5 + 100


def test_no_large_count_reaches_llama_cpps_limit() -> None:
    # measure() refuses what llama.cpp refuses: a count over 2000, or a count times its operand's
    # symbols at 2000 and more.
    for count in (2001, 5000, 10_000, 100_000):
        measure("x ::= " + repetition("char", count, count) + "\nchar ::= [a]")
        measure("x ::= " + repetition('("a" b c)', 0, count) + '\nb ::= "b"\nc ::= "c"')
    with pytest.raises(GbnfError):
        measure('x ::= "a"{2001}')
    with pytest.raises(GbnfError):
        measure('x ::= ("a" b c){0,700}\nb ::= "b"\nc ::= "c"')


def test_impossible_repetitions_are_refused() -> None:
    with pytest.raises(GbnfError):
        repetition("x", 3, 2)
    with pytest.raises(GbnfError):
        repetition("x", -1, 2)


def test_measure_counts_what_llama_cpp_builds() -> None:
    # root: "a" (1), ref to the group (1), END; the group: "b" ALT "c" END; x?: 1 rule [x, ALT, END]
    # and a ref in its place.
    size = measure('root ::= "a" ("b" | "c") x?\nx ::= "xy"')
    assert size.rules == 4
    assert size.elements == (1 + 1 + 1 + 1) + (1 + 1 + 1 + 1) + (1 + 2) + (2 + 1)
    # x{2,4}: one inline copy more, and 2 optional rules of [x, (ref), ALT, END].
    assert measure('root ::= "a"{2,4}').elements == 2 + 1 + 1 + (1 + 2) + (1 + 1 + 2)


def test_literals_escape_what_llama_cpp_reads_as_escapes() -> None:
    assert literal('a"b\\c\nd\te\x01') == '"a\\"b\\\\c\\nd\\te\\x01"'
    assert literal("é") == '"é"'
    measure("x ::= " + literal(chr(0x7F) + "\\u0000"))
