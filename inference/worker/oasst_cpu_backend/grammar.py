"""Structured output: a request's JSON schema (TGI's ``grammar`` parameter) to a llama.cpp grammar that
llama.cpp accepts, or a refusal.

llama-cpp-python 0.3.36 adds the sampler llama.cpp builds from a grammar to its sampler chain without
looking: a grammar llama.cpp refuses (too many repetitions, an escape it does not know, left recursion)
is a NULL sampler, and the process dies on the first token. So a grammar is

1. bounded first, with the bounds the server applies (:mod:`oasst_shared.schema_bounds`): this backend is
   an HTTP server anyone may call directly;
2. converted with llama-cpp-python's converter, whose repetitions, patterns and literals are written by
   :mod:`oasst_shared.gbnf` and :mod:`oasst_shared.json_pattern` instead (its own nest ``maxLength: 2000``
   2000 groups deep, copy ``\\d`` and ``\\.`` into the grammar, and let a pattern's ``.`` write a raw ``"``),
   and whose ``$ref``s are each converted once and named validly when recursive, off the event loop and
   within ``grammar_timeout``;
3. measured as llama.cpp would build it, within the same budget;
4. parsed by llama.cpp itself: NULL is a refusal (llama.cpp prints the refused grammar on stderr: it is
   within the size budget).

Every refusal is :class:`InvalidRequest` (422, ``error_type`` validation), which the worker reports as a
failure of that message alone, retried nowhere. The engine builds its sampler's grammar with
:func:`sampler_grammar`, which parses it again, so no grammar reaches llama.cpp's sampler unchecked.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import llama_cpp
from llama_cpp.llama_grammar import PRIMITIVE_RULES, LlamaGrammar, SchemaConverter

from oasst_cpu_backend.refusals import InvalidRequest
from oasst_cpu_backend.schemas import GenerateParameters
from oasst_shared.gbnf import GbnfError, literal, measure, repetition
from oasst_shared.json_pattern import PatternError, parse_pattern, pattern_gbnf
from oasst_shared.schema_bounds import (
    MAX_GRAMMAR_CHARACTERS,
    MAX_GRAMMAR_ELEMENTS,
    RESERVED_RULE_NAMES,
    SchemaBoundsError,
    array_items,
    check_schema,
    converter_branch,
    ref_rule_name,
    ref_target,
    string_lengths,
)

# llama-cpp-python's converter lets a string hold raw control characters (a newline), which JSON forbids:
# an answer with one would not parse. Its rule, with them excluded (as llama.cpp's own converter does).
_JSON_CHAR_RULE = re.compile(r"^char ::= .*$", re.M)
_STRICT_JSON_CHAR = (
    r'char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
)
_ROOT = b"root"


class _Converter(SchemaConverter):
    """llama-cpp-python's converter with bounded arrays and strings, patterns and literals written by
    oasst_shared (see the module docstring); everything else is its own."""

    def __init__(self) -> None:
        super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
        self._ref_rules: dict[str, str] = {}
        self._pending_refs: dict[str, str] = {}

    def _resolve_ref(self, ref: str) -> str:
        # Its own looks a converted reference up by its raw name, which it never finds when the name is
        # not a valid rule name ("my_node"): that schema is converted again at every reference. And a
        # reference met while its schema is being converted (a recursive schema) is written as that raw
        # name, which llama.cpp cannot parse. Here each reference is converted once, and a recursive
        # one refers to a rule defined as soon as the schema's rule exists.
        if ref in self._ref_rules:
            return self._ref_rules[ref]
        if ref in self._refs_being_resolved:
            if ref not in self._pending_refs:
                # A placeholder body unique to this ref gives the rule a name of its own.
                self._pending_refs[ref] = self._add_rule(f"{ref_rule_name(ref)}-ref", f"<{ref}>")
            return self._pending_refs[ref]
        self._refs_being_resolved.add(ref)
        try:
            rule = str(self.visit(self._refs[ref], ref_rule_name(ref)))
        finally:
            self._refs_being_resolved.discard(ref)
        self._ref_rules[ref] = rule
        if ref in self._pending_refs:
            self._rules[self._pending_refs[ref]] = rule
        return rule

    def resolve_refs(self, schema: Any, url: str) -> Any:
        # Its own stops at the first "$ref" of a schema and misses the refs under it (a root "$ref" next
        # to "$defs" whose schemas refer to each other); it also rewrites the schema. Every local ref is
        # registered here, the schema left as it is (the bounds refused any other kind).
        stack = [schema]
        while stack:
            node = stack.pop()
            if isinstance(node, dict):
                ref = node.get("$ref")
                if isinstance(ref, str) and ref not in self._refs:
                    try:
                        self._refs[ref] = ref_target(schema, ref)
                    except KeyError:
                        raise InvalidRequest(f"`grammar`: {ref!r} refers to nothing in the schema") from None
                stack.extend(node.values())
            elif isinstance(node, list):
                stack.extend(node)
        return schema

    def _format_literal(self, text: str) -> str:
        # Its own escapes only quotes and newlines: a backslash in an enum value ended the literal early.
        return literal(text)

    def visit(self, schema: Any, name: str) -> str:
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            raise InvalidRequest(f"`grammar`: {json.dumps(schema)[:40]} is not a schema this backend takes")
        branch = converter_branch(schema)
        rule_name = name + "-" if name in RESERVED_RULE_NAMES else name or "root"
        if branch == "array":
            items, item, low, high = array_items(schema)
            if items is None:
                item_rule = self.visit(item, f"{name}{'-' if name else ''}item")
                body = repetition(item_rule, low, high, separator='"," space')
                return str(self._add_rule(rule_name, f'"[" space {body} "]" space'))
        elif branch == "string_length":
            low, high = string_lengths(schema)
            char = self._add_primitive("char", PRIMITIVE_RULES["char"])
            return str(self._add_rule(rule_name, f'"\\"" {repetition(char, low, high)} "\\"" space'))
        return str(super().visit(schema, name))

    def _visit_pattern(self, pattern: str, name: str) -> str:
        body = pattern_gbnf(parse_pattern(pattern), name, self._add_rule)
        return str(self._add_rule(name, f'"\\"" {body} "\\"" space'))


def schema_to_gbnf(schema: Any) -> str:
    """The grammar of ``schema``'s instances as JSON text; :class:`InvalidRequest` if it is past a bound
    or cannot be converted. Synchronous and CPU-bound: call it off the event loop."""
    try:
        check_schema(schema, "grammar")
    except SchemaBoundsError as error:
        raise InvalidRequest(f"`{error.path}`: {error.reason}") from None
    converter = _Converter()
    try:
        converter.visit(converter.resolve_refs(schema, "stdin"), "")
        gbnf = converter.format_grammar()
    except InvalidRequest:
        raise
    except PatternError as error:
        raise InvalidRequest(f"`grammar`: unsupported pattern: {error}") from None
    except Exception as error:  # the converter raises many kinds of errors for schemas it cannot take
        raise InvalidRequest(f"invalid JSON schema in `grammar`: {error}") from error
    gbnf = _JSON_CHAR_RULE.sub(lambda _: _STRICT_JSON_CHAR, gbnf)
    try:
        size = measure(gbnf)
    except GbnfError as error:
        raise InvalidRequest(f"`grammar`: llama.cpp would refuse its grammar: {error}") from None
    if size.elements > MAX_GRAMMAR_ELEMENTS or len(gbnf) > MAX_GRAMMAR_CHARACTERS:
        raise InvalidRequest(
            f"`grammar`: the schema is too large: its grammar has {size.elements} elements and "
            f"{len(gbnf)} characters (at most {MAX_GRAMMAR_ELEMENTS} and {MAX_GRAMMAR_CHARACTERS})"
        )
    return gbnf


def check_gbnf(vocab: llama_cpp.llama_vocab_p, gbnf: str) -> None:
    """:class:`InvalidRequest` if llama.cpp refuses ``gbnf`` (it then prints why on stderr)."""
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), _ROOT)
    if not sampler:
        raise InvalidRequest("`grammar`: llama.cpp refused the grammar built from the schema")
    llama_cpp.llama_sampler_free(sampler)


def sampler_grammar(vocab: llama_cpp.llama_vocab_p, gbnf: str) -> LlamaGrammar:
    """The grammar for the engine's sampler, checked by llama.cpp first (it is added unchecked)."""
    check_gbnf(vocab, gbnf)
    return LlamaGrammar.from_string(gbnf, verbose=False)


async def request_grammar(
    params: GenerateParameters, vocab: llama_cpp.llama_vocab_p, timeout: float
) -> str | None:
    """The checked grammar of a request's ``grammar`` parameter, built off the event loop within
    ``timeout`` seconds; None without one."""
    grammar = params.grammar
    if grammar is None:
        return None
    if grammar.type == "regex":
        raise InvalidRequest("grammar of type `regex` is not supported by this backend; use `json`")
    value = grammar.value

    def build() -> str:
        try:
            schema = json.loads(value) if isinstance(value, str) else value
        except (ValueError, RecursionError) as error:
            raise InvalidRequest(f"invalid JSON schema in `grammar`: {error}") from None
        gbnf = schema_to_gbnf(schema)
        check_gbnf(vocab, gbnf)
        return gbnf

    try:
        return await asyncio.wait_for(asyncio.to_thread(build), timeout)
    except TimeoutError:
        # The thread finishes on its own (the bounds keep it short); its result is dropped.
        raise InvalidRequest(f"`grammar`: the schema took longer than {timeout:g}s to convert") from None
