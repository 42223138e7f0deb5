"""Bounds on what a JSON schema expands into downstream: checked by the server at submission and by the
bundled CPU backend before it builds a grammar.

A schema (a ``response_format``, or the tools an answer is constrained to call) becomes a grammar in the
backend: llama.cpp's GBNF in the bundled backend, an automaton in TGI's or vLLM's guided decoding. Its
keywords turn into repetitions there (``maxLength: 2000`` is up to 2000 copies of a character rule), its
``$ref``s into rules reached from many places, its patterns into their own repetitions. What is refused,
each with a :class:`SchemaBoundsError` naming the offending field (``...properties.summary.maxLength``):

- a document nested deeper than :data:`MAX_SCHEMA_DEPTH` (the worker's frame parser and the server's
  serializers have their own recursion limits past it);
- length and count keywords that are not non-negative integers, or above :data:`MAX_STRING_LENGTH`
  (``minLength``/``maxLength``) or :data:`MAX_ITEMS` (items, properties, contains), or a minimum above
  its maximum; numeric bounds that are not finite numbers within :data:`MAX_NUMBER_MAGNITUDE`; objects with
  more than :data:`MAX_PROPERTIES` properties;
- patterns longer than :data:`MAX_PATTERN_LENGTH`, that are not regular expressions of the supported
  subset (:mod:`oasst_shared.json_pattern`), with a count above :data:`MAX_PATTERN_REPEAT`, or whose
  nested bounded repetitions multiply past :data:`MAX_PATTERN_NESTING` (each split of a string among them
  is one more state llama.cpp follows per token);
- ``$ref``s outside the document, that do not resolve, or that lead back to themselves without anything
  in between (a left-recursive grammar);
- schemas whose grammar would exceed :data:`MAX_GRAMMAR_ELEMENTS` elements or :data:`MAX_GRAMMAR_CHARACTERS`
  characters, or take more than :data:`MAX_CONVERSION_STEPS` steps to write.

The grammar's size is estimated by a walk that follows llama-cpp-python 0.3.36's converter
(``llama_cpp.llama_grammar.SchemaConverter``) as the bundled backend runs it (its repetitions and patterns
written by :mod:`oasst_shared.gbnf` and :mod:`oasst_shared.json_pattern`), stopping as soon as a budget is
exceeded; the backend's tests check the estimate against the converter's real output.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from oasst_shared.gbnf import GbnfError, measure, repetition
from oasst_shared.json_pattern import PatternError, parse_pattern, pattern_gbnf
from oasst_shared.schema_keywords import SUBSCHEMA_KEYWORDS, SUBSCHEMA_LIST_KEYWORDS, SUBSCHEMA_MAP_KEYWORDS
from oasst_shared.tool_calls import (
    MAX_SCHEMA_CHARACTERS,
    NamedToolChoice,
    ToolChoice,
    ToolDefinition,
    called_tools,
    tool_call_schema,
)

MAX_SCHEMA_DEPTH = 64  # nesting of objects and arrays in a schema document
MAX_STRING_LENGTH = 10_000  # minLength, maxLength
MAX_ITEMS = 1_000  # minItems, maxItems, minContains, maxContains, minProperties, maxProperties
MAX_PROPERTIES = 256  # properties of one object (the converter's work grows with their square)
MAX_NUMBER_MAGNITUDE = 2**53  # minimum, maximum, exclusiveMinimum, exclusiveMaximum, multipleOf
MAX_PATTERN_LENGTH = 1_000  # characters of one pattern
MAX_PATTERN_REPEAT = 1_000  # any count of a pattern's repetition
MAX_PATTERN_NESTING = 256  # product of the bounded counts of nested repetitions in a pattern
MAX_GRAMMAR_ELEMENTS = 300_000  # what llama.cpp allocates for the grammar, 8 bytes each
MAX_GRAMMAR_CHARACTERS = 2_000_000  # the grammar's text
MAX_CONVERSION_STEPS = 200_000  # rules written and re-written by the converter

_LENGTH_KEYWORDS = {"minLength": MAX_STRING_LENGTH, "maxLength": MAX_STRING_LENGTH}
_COUNT_KEYWORDS = {
    "minItems": MAX_ITEMS,
    "maxItems": MAX_ITEMS,
    "minContains": MAX_ITEMS,
    "maxContains": MAX_ITEMS,
    "minProperties": MAX_ITEMS,
    "maxProperties": MAX_ITEMS,
}
_ORDERED = (
    ("minLength", "maxLength"),
    ("minItems", "maxItems"),
    ("minContains", "maxContains"),
    ("minProperties", "maxProperties"),
)
_BOUNDED_COUNTS = {**_LENGTH_KEYWORDS, **_COUNT_KEYWORDS}
_NUMBER_KEYWORDS = frozenset(("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"))
_SUBSCHEMAS = frozenset((*SUBSCHEMA_KEYWORDS, *SUBSCHEMA_LIST_KEYWORDS, *SUBSCHEMA_MAP_KEYWORDS))


class SchemaBoundsError(ValueError):
    """A schema past one of this module's bounds; ``path`` names the offending field."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass
class GrammarEstimate:
    """An upper bound of the grammar a schema becomes in the bundled backend."""

    elements: int = 0
    characters: int = 0
    steps: int = 0


def check_schema(schema: Any, path: str, *, depth_offset: int = 0) -> GrammarEstimate:
    """Refuse ``schema`` (found at ``path`` in the request) past any bound; return its grammar's estimate.

    ``depth_offset``: how deep the schema will sit in the document it is compiled as (a tool's
    parameters sit inside the schema of a tool call)."""
    checker = _Checker(schema, path, depth_offset)
    checker.structure()
    return checker.estimate()


def check_tool_schemas(
    tools: Sequence[ToolDefinition], choice: ToolChoice | None, path: str = "tools"
) -> GrammarEstimate | None:
    """Refuse tools whose parameters are past a bound, or whose calls under ``choice`` (the schema the
    worker constrains an answer to: :func:`oasst_shared.tool_calls.tool_call_schema`) would build too
    large a grammar. None when ``choice`` calls no tool."""
    for index, tool in enumerate(tools):
        param = f"{path}[{index}].function.parameters"
        _Checker(tool.function.parameters, param, _TOOL_ARGUMENTS_DEPTH).structure()
    called = called_tools(list(tools), choice)
    if not called:
        return None
    combined = tool_call_schema(called)
    if choice == "required" or isinstance(choice, NamedToolChoice):
        # The worker constrains the answer to this schema, which must fit where any schema fits.
        size = len(json.dumps(combined))
        if size > MAX_SCHEMA_CHARACTERS:
            raise SchemaBoundsError(
                path,
                f"the schema of a call of the tools tool_choice allows has {size} characters, more than "
                f"this server's limit of {MAX_SCHEMA_CHARACTERS}",
            )
    # Found inside the combined schema, a tool's parameters are named as the request names them.
    aliases = {
        id(tool.function.parameters): f"{path}[{i}].function.parameters" for i, tool in enumerate(tools)
    }
    return _Checker(combined, path, 0, aliases=aliases).estimate()


# A tool's parameters sit at most this deep in the schema of a call of one of several tools
# (anyOf -> [i] -> variant -> properties -> arguments).
_TOOL_ARGUMENTS_DEPTH = 4


def too_deep(document: Any, limit: int = MAX_SCHEMA_DEPTH) -> str | None:
    """The path (relative to ``document``) of the first object or array nested deeper than ``limit``
    levels, the document itself being level 1; None if there is none. Walks without recursion."""
    stack: list[tuple[Any, int, str]] = [(document, 1, "")]
    while stack:
        node, level, path = stack.pop()
        if not isinstance(node, dict | list):
            continue
        if level > limit:
            return path or "(the schema)"
        children: Iterator[tuple[Any, str]] = (
            ((value, _join(path, key)) for key, value in node.items())
            if isinstance(node, dict)
            else ((value, f"{path}[{index}]") for index, value in enumerate(node))
        )
        for child, child_path in children:
            if isinstance(child, dict | list):
                stack.append((child, level + 1, child_path))
    return None


_PLAIN_NAME = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]*$")


def _join(path: str, key: Any) -> str:
    """``path`` and a key after it, as a request names a field (a long key is cut: paths stay short)."""
    text = str(key)
    if len(text) <= 64 and _PLAIN_NAME.match(text):
        return f"{path}.{text}" if path else text
    shown = text if len(text) <= 64 else text[:61] + "..."
    return f"{path}[{json.dumps(shown)}]"


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0


# ---- which branch of the converter a schema takes ----------------------------------------------

_STRING_FORMATS = ("date", "time", "date-time")
_UUID_FORMAT = re.compile(r"^uuid[1-5]?$")
# Names the converter gives its built-in rules; a schema rule with one of them gets a "-" appended.
RESERVED_RULE_NAMES = frozenset(
    (
        "root",
        "dot",
        "boolean",
        "decimal-part",
        "integral-part",
        "number",
        "integer",
        "value",
        "object",
        "array",
        "uuid",
        "char",
        "string",
        "null",
        *_STRING_FORMATS,
        "date-string",
        "time-string",
        "date-time-string",
    )
)


def converter_branch(schema: dict[str, Any]) -> str:
    """Which rule llama-cpp-python 0.3.36's ``SchemaConverter.visit`` writes for ``schema``, in its order
    of precedence (the bundled backend's converter and the estimate take the same branches)."""
    kind = schema.get("type")
    fmt = schema.get("format")
    fmt = fmt if isinstance(fmt, str) else ""
    if schema.get("$ref") is not None:
        return "ref"
    if "oneOf" in schema or "anyOf" in schema:
        return "union"
    if isinstance(kind, list):
        return "type_list"
    if "const" in schema:
        return "const"
    if "enum" in schema:
        return "enum"
    if kind in (None, "object") and (
        "properties" in schema
        or ("additionalProperties" in schema and schema["additionalProperties"] is not True)
    ):
        return "object"
    if kind in (None, "object") and "allOf" in schema:
        return "all_of"
    if kind in (None, "array") and ("items" in schema or "prefixItems" in schema):
        return "array"
    if kind in (None, "string") and "pattern" in schema:
        return "pattern"
    if kind in (None, "string") and _UUID_FORMAT.match(fmt):
        return "uuid"
    if kind in (None, "string") and fmt in _STRING_FORMATS:
        return "format"
    if kind == "string" and ("minLength" in schema or "maxLength" in schema):
        return "string_length"
    if kind == "object" or len(schema) == 0:
        return "any_object"
    return "primitive"


def array_items(schema: dict[str, Any]) -> tuple[list[Any] | None, Any, int, int | None]:
    """An array schema's (tuple items or None, item schema, minItems, maxItems), as the bundled backend
    reads them: ``items: true`` and ``{}`` are any item, ``items: false`` none."""
    items = schema.get("items")
    if isinstance(items, list):
        return items, None, 0, None
    if not items and isinstance(schema.get("prefixItems"), list):
        return schema["prefixItems"], None, 0, None
    low = schema.get("minItems", 0)
    high = schema.get("maxItems")
    if items is False:
        return None, {}, 0, 0
    return None, items if isinstance(items, dict) else {}, low, high


def string_lengths(schema: dict[str, Any]) -> tuple[int, int | None]:
    return schema.get("minLength", 0), schema.get("maxLength")


def ref_target(root: Any, ref: str) -> Any:
    """What a local ``$ref`` points at, found as the converter finds it (it takes the text after the last
    ``#`` as a path of keys); KeyError if nothing."""
    target = root
    for key in ref.split("#")[-1].split("/")[1:]:
        if not isinstance(target, dict) or key not in target:
            raise KeyError(key)
        target = target[key]
    return target


def ref_rule_name(ref: str) -> str:
    return ref.split("/")[-1]


# ---- the checks --------------------------------------------------------------------------------

# Upper bounds of the built-in rules (primitives, string formats, the JSON character rule, and one
# more copy of the largest under the name "root"); the backend's tests measure the real ones.
_BUILT_IN_ELEMENTS = 1_500
_BUILT_IN_CHARACTERS = 6_000
# Per rule: " ::= ", the newline, and the digits the converter appends to a taken name.
_RULE_OVERHEAD = 12
_ROOT = "root"
_NON_CONSUMING = frozenset(("ref", "union", "type_list"))


@dataclass
class _Checker:
    root: Any
    path: str
    depth_offset: int = 0
    aliases: dict[int, str] = field(default_factory=dict)
    total: GrammarEstimate = field(default_factory=GrammarEstimate)
    checked: set[int] = field(default_factory=set)
    # $refs converted, those being converted (with where on the branch stack they began), the branches.
    converted: set[str] = field(default_factory=set)
    resolving: dict[str, int] = field(default_factory=dict)
    branches: list[str] = field(default_factory=list)

    # -- bounds on the document ------------------------------------------------------------------

    def structure(self) -> None:
        deep = too_deep(self.root, MAX_SCHEMA_DEPTH - self.depth_offset)
        if deep is not None:
            where = self.path if deep == "(the schema)" else _join_path(self.path, deep)
            raise SchemaBoundsError(where, f"the schema is nested deeper than {MAX_SCHEMA_DEPTH} levels")
        self._keywords(self.root, self.path)

    def _keywords(self, schema: Any, path: str) -> None:
        if not isinstance(schema, dict) or id(schema) in self.checked:
            return
        self.checked.add(id(schema))
        keys = schema.keys()
        for keyword in keys & _BOUNDED_COUNTS.keys():
            limit, value = _BOUNDED_COUNTS[keyword], schema[keyword]
            if not _is_count(value):
                raise SchemaBoundsError(_join(path, keyword), "must be a non-negative integer")
            if value > limit:
                raise SchemaBoundsError(
                    _join(path, keyword), f"{value} is more than this server's limit of {limit}"
                )
        for low, high in _ORDERED:
            if low in schema and high in schema and schema[low] > schema[high]:
                raise SchemaBoundsError(_join(path, low), f"is more than {high}")
        for keyword in keys & _NUMBER_KEYWORDS:
            _check_number(schema[keyword], _join(path, keyword), positive=keyword == "multipleOf")
        if "pattern" in schema:
            _check_pattern(schema["pattern"], _join(path, "pattern"))
        if isinstance(schema.get("patternProperties"), dict):
            for key in schema["patternProperties"]:
                _check_pattern(key, _join(_join(path, "patternProperties"), key))
        properties = schema.get("properties")
        if isinstance(properties, dict) and len(properties) > MAX_PROPERTIES:
            raise SchemaBoundsError(
                _join(path, "properties"),
                f"{len(properties)} properties are more than this server's limit of {MAX_PROPERTIES}",
            )
        if "$ref" in schema:
            self._check_ref(schema["$ref"], _join(path, "$ref"))
        for keyword in keys & _SUBSCHEMAS:
            value = schema[keyword]
            if isinstance(value, dict) and keyword in SUBSCHEMA_KEYWORDS:
                self._keywords(value, _join(path, keyword))
            elif isinstance(value, list) and keyword in SUBSCHEMA_LIST_KEYWORDS:
                for index, item in enumerate(value):
                    self._keywords(item, f"{_join(path, keyword)}[{index}]")
            elif isinstance(value, dict) and keyword in SUBSCHEMA_MAP_KEYWORDS:
                for name, item in value.items():
                    self._keywords(item, _join(_join(path, keyword), name))

    def _check_ref(self, ref: Any, path: str) -> None:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise SchemaBoundsError(path, "only references inside the schema (starting with #/) are followed")
        try:
            target = ref_target(self.root, ref)
        except KeyError:
            raise SchemaBoundsError(path, f"{ref!r} refers to nothing in the schema") from None
        # A target outside the usual places ($defs...) is checked where it is.
        self._keywords(target, self._pointer_path(ref))

    def _pointer_path(self, ref: str) -> str:
        where = self.path
        for key in ref.split("#")[-1].split("/")[1:]:
            where = _join(where, key)
        return where

    # -- the grammar's size ------------------------------------------------------------------------

    def estimate(self) -> GrammarEstimate:
        self._add(_BUILT_IN_ELEMENTS, _BUILT_IN_CHARACTERS, 1, self.path)
        self._visit(self.root, 0, self.path)
        return self.total

    def _add(self, elements: int, characters: int, steps: int, path: str) -> None:
        # A budget is the whole schema's (or tool set's): it is named, not the part where it ran out.
        total = self.total
        total.steps += steps
        total.elements += elements
        total.characters += characters
        if total.elements > MAX_GRAMMAR_ELEMENTS:
            _too_large(self.path, f"its grammar would have more than {MAX_GRAMMAR_ELEMENTS} elements")
        if total.characters > MAX_GRAMMAR_CHARACTERS:
            _too_large(self.path, f"its grammar would be longer than {MAX_GRAMMAR_CHARACTERS} characters")
        if total.steps > MAX_CONVERSION_STEPS:
            _too_large(self.path, f"its grammar would take more than {MAX_CONVERSION_STEPS} steps to write")

    def _rule(self, name: int, elements: int, body: int, path: str, steps: int = 1) -> int:
        """Count a rule whose name has ``name`` characters; return the length of the name it gets."""
        self._add(elements + 1, name + body + _RULE_OVERHEAD, steps, path)
        return name + _RULE_OVERHEAD

    def _visit(self, schema: Any, name: int, path: str) -> int:
        """Count the rules the converter writes for ``schema`` when it names them from a name of
        ``name`` characters; return the length of the name the schema's rule is referred to by."""
        path = self.aliases.get(id(schema), path)
        if schema is True:
            schema = {}
        if not isinstance(schema, dict):
            return 0  # the backend refuses it
        branch = converter_branch(schema)
        rule = name + 1 if name else len(_ROOT)
        self.branches.append(branch)
        try:
            return _BRANCHES[branch](self, schema, name, rule, path)
        finally:
            self.branches.pop()

    def ref(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        ref, path = schema["$ref"], _join(path, "$ref")
        target_name = len(ref_rule_name(ref)) + _RULE_OVERHEAD
        if ref in self.resolving:
            if all(b in _NON_CONSUMING for b in self.branches[self.resolving[ref] :]):
                raise SchemaBoundsError(path, f"{ref!r} leads back to itself with nothing in between")
            self._rule(target_name + 4, 1, target_name, path)  # the rule a recursive reference names
        elif ref not in self.converted:
            # Each reference's schema is converted once (the backend's converter keeps its rule).
            self.converted.add(ref)
            self.resolving[ref] = len(self.branches)
            try:
                self._visit(ref_target(self.root, ref), target_name - _RULE_OVERHEAD, self._pointer_path(ref))
            finally:
                del self.resolving[ref]
        return self._rule(rule, 1, target_name, path)

    def alternatives(self, alternatives: list[Any], name: int, rule: int, path: str, key: str) -> int:
        names = 0
        for index, alternative in enumerate(alternatives):
            digits = len(str(index))
            child = name + 1 + digits if name else len("alternative-") + digits
            names += self._visit(alternative, child, f"{_join(path, key)}[{index}]") + 3
        return self._rule(rule, 2 * len(alternatives), names, path)

    def union(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        key = "oneOf" if schema.get("oneOf") else "anyOf"
        alternatives = schema.get("oneOf") or schema.get("anyOf")
        return self.alternatives(list(alternatives or []), name, rule, path, key)

    def type_list(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        return self.alternatives([{"type": t} for t in schema["type"]], name, rule, path, "type")

    def literals(self, values: list[Any], rule: int, path: str) -> int:
        elements = characters = 0
        for value in values:
            text = json.dumps(value)
            elements += len(text) + 1
            characters += 2 * len(text) + 5
        return self._rule(rule, elements, characters, path)

    def const(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        return self.literals([schema["const"]], rule, path)

    def enum(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        values = schema["enum"]
        return self.literals(list(values) if isinstance(values, list | str | dict) else [], rule, path)

    def object(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        properties = schema.get("properties", {})
        pairs = list(properties.items()) if isinstance(properties, dict) else []
        try:
            required = set(schema.get("required", []))
        except TypeError:
            required = set()
        paths = [_join(_join(path, "properties"), key) for key, _ in pairs]
        return self.object_rule(pairs, paths, required, name, rule, path, schema.get("additionalProperties"))

    def all_of(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        pairs: list[tuple[str, Any]] = []
        paths: list[str] = []
        required: set[str] = set()
        components = schema["allOf"] if isinstance(schema["allOf"], list) else []
        for index, component in enumerate(components):
            where = f"{_join(path, 'allOf')}[{index}]"
            if not isinstance(component, dict):
                continue
            inner = component.get("anyOf") if "anyOf" in component else [component]
            for item in inner if isinstance(inner, list) else []:
                if isinstance(item, dict) and isinstance(item.get("$ref"), str):
                    try:
                        item = ref_target(self.root, item["$ref"])
                    except KeyError:
                        continue
                found = item.get("properties") if isinstance(item, dict) else None
                for key, value in found.items() if isinstance(found, dict) else []:
                    pairs.append((key, value))
                    paths.append(_join(_join(where, "properties"), key))
                    if "anyOf" not in component:
                        required.add(key)
        return self.object_rule(pairs, paths, required, name, rule, path, [])

    def object_rule(
        self,
        pairs: list[tuple[str, Any]],
        paths: list[str],
        required: set[Any],
        name: int,
        rule: int,
        path: str,
        additional: Any,
    ) -> int:
        optional: list[tuple[int, int]] = []  # (name of the key-value rule, name of its "rest" rule)
        elements, characters = 4, 30
        for (key, value), where in zip(pairs, paths, strict=True):
            child = self._visit(value, name + 1 + len(key), where)
            text = json.dumps(key)
            kv = self._rule(name + 1 + len(key) + 3, len(text) + 4, 2 * len(text) + 20 + child, where)
            if key in required:
                elements += 3
                characters += kv + 12
            else:
                optional.append((kv, name + 1 + len(key) + 5))
        if additional is True or isinstance(additional, dict):
            value = {} if additional is True else additional
            value_name = self._visit(value, name + 17, _join(path, "additionalProperties"))
            optional.append((self._rule(name + 14, 5, value_name + 20, path), name + 15))
        count = len(optional)
        if count:
            # An alternative "kv rest" per optional property and a "rest" rule after each, in groups;
            # the converter rebuilds the rest rules of every suffix for each alternative.
            elements += 16 * count + 20
            characters += sum(4 * (kv + rest + _RULE_OVERHEAD) + 50 for kv, rest in optional)
            self._add(0, 0, count * (count + 1) // 2, path)
        return self._rule(rule, elements, characters, path)

    def array(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        items, item, low, high = array_items(schema)
        if items is not None:
            names = 0
            key = "items" if isinstance(schema.get("items"), list) else "prefixItems"
            for index, element in enumerate(items):
                child = name + len("-tuple-") + len(str(index))
                names += self._visit(element, child, f"{_join(path, key)}[{index}]") + 12
            return self._rule(rule, 3 * len(items) + 4, names + 30, path)
        item_name = self._visit(item, name + len("-item"), _join(path, "items"))
        try:
            elements, length, uses = _repetition_size("i", low, high, '"," space')
        except (GbnfError, TypeError):
            return 0  # refused by the bounds, or by the backend
        return self._rule(rule, elements + 4, length + uses * item_name + 30, path, 2)

    def pattern(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        pattern = schema["pattern"]
        try:
            elements, length = _pattern_size(pattern, rule)
        except (PatternError, TypeError):
            return 0
        except GbnfError as error:
            raise SchemaBoundsError(_join(path, "pattern"), f"unsupported pattern: {error}") from None
        return self._rule(rule, elements + 3, length + 20, path, len(pattern) + 1)

    def string_length(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        low, high = string_lengths(schema)
        try:
            elements, length, _ = _repetition_size("char", low, high, None)
        except (GbnfError, TypeError):
            return 0
        return self._rule(rule, elements + 4, length + 30, path, 2)

    def uuid(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        return self._rule(rule, 50, 200, path)

    def small(self, schema: dict[str, Any], name: int, rule: int, path: str) -> int:
        """A rule that names a built-in one (counted once, in the built-ins)."""
        return self._rule(rule, 1, 20, path)


_BRANCHES = {
    "ref": _Checker.ref,
    "union": _Checker.union,
    "type_list": _Checker.type_list,
    "const": _Checker.const,
    "enum": _Checker.enum,
    "object": _Checker.object,
    "all_of": _Checker.all_of,
    "array": _Checker.array,
    "pattern": _Checker.pattern,
    "uuid": _Checker.uuid,
    "format": _Checker.small,
    "string_length": _Checker.string_length,
    "any_object": _Checker.small,
    "primitive": _Checker.small,
}


@functools.lru_cache(maxsize=1024)
def _pattern_size(pattern: str, name: int) -> tuple[int, int]:
    """The elements and characters of the rules of a pattern named with ``name`` characters."""
    defined: list[str] = []

    def add_rule(rule_name: str, body: str) -> str:
        defined.append(f"{rule_name} ::= {body}")
        return rule_name

    body = pattern_gbnf(parse_pattern(pattern), "n" * name, add_rule)
    text = "\n".join([*defined, f"x ::= {body}"])
    return measure(text).elements, len(text)


@functools.lru_cache(maxsize=1024)
def _repetition_size(item: str, low: int, high: int | None, separator: str | None) -> tuple[int, int, int]:
    """The elements and characters of a repetition of ``item`` (one element), and how often it names it."""
    text = repetition(item, low, high, separator)
    return measure(f"x ::= {text}").elements, len(text), text.count(item)


def _too_large(path: str, reason: str) -> None:
    raise SchemaBoundsError(path, f"the schema is too large: {reason}")


def _check_number(value: Any, path: str, *, positive: bool) -> None:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise SchemaBoundsError(path, "must be a finite number")
    if abs(value) > MAX_NUMBER_MAGNITUDE:
        raise SchemaBoundsError(path, f"must be within ±{MAX_NUMBER_MAGNITUDE} (2^53)")
    if positive and value <= 0:
        raise SchemaBoundsError(path, "must be greater than 0")


def _check_pattern(pattern: Any, path: str) -> None:
    if not isinstance(pattern, str):
        raise SchemaBoundsError(path, "must be a string")
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise SchemaBoundsError(
            path, f"{len(pattern)} characters are more than this server's limit of {MAX_PATTERN_LENGTH}"
        )
    try:
        parsed = parse_pattern(pattern)
    except PatternError as error:
        raise SchemaBoundsError(path, f"unsupported pattern: {error}") from None
    for repeat, nested in parsed.repeats():
        count = repeat.max if repeat.max is not None else repeat.min
        if count > MAX_PATTERN_REPEAT:
            raise SchemaBoundsError(
                path,
                f"a repetition count of {count} is more than this server's limit of {MAX_PATTERN_REPEAT}",
            )
        if nested > MAX_PATTERN_NESTING:
            raise SchemaBoundsError(
                path,
                f"nested repetitions multiply to {nested}, more than this server's limit of {MAX_PATTERN_NESTING}",
            )


def _join_path(prefix: str, relative: str) -> str:
    if relative.startswith("["):
        return prefix + relative
    return f"{prefix}.{relative}" if prefix else relative
