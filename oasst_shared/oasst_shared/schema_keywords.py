"""The keywords a JSON schema uses, found by walking it as a schema (a property named ``minimum`` is not
the keyword ``minimum``).

A backend that constrains output with a grammar enforces some keywords only; its worker reports the others
(``WorkerCapabilities.unenforced_schema_keywords``) and the server refuses a schema that uses one, rather
than promise an answer that validates and deliver one that may not. Some keywords are enforced alone but
not next to another one in the same schema: those are reported as "maxLength with pattern".
"""

from __future__ import annotations

from typing import Any

# Keywords whose value is a schema, a list of schemas, or a mapping of names to schemas (items: a list in
# drafts before 2020-12).
SUBSCHEMA_KEYWORDS = (
    "items",
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "additionalItems",
    "unevaluatedItems",
    "unevaluatedProperties",
)
SUBSCHEMA_LIST_KEYWORDS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
SUBSCHEMA_MAP_KEYWORDS = ("properties", "$defs", "definitions", "patternProperties", "dependentSchemas")

# What llama.cpp's JSON-schema-to-grammar converter (the bundled backend's) does not enforce.
LLAMA_CPP_UNENFORCED = (
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "uniqueItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "minProperties",
    "maxProperties",
    "patternProperties",
    "propertyNames",
    "dependentRequired",
    "dependentSchemas",
    # A string with a pattern, or with a format it knows (date, time, date-time, uuid), is written from
    # that alone: its lengths are left out.
    "minLength with pattern",
    "maxLength with pattern",
    "minLength with format",
    "maxLength with format",
)
_LENGTHS = ("minLength", "maxLength")
_WRITTEN_FORMATS = frozenset(
    ("date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5")
)


def schema_keywords(schema: Any) -> set[str]:
    """Every keyword used anywhere in ``schema``, and every pair of the "X with Y" kind."""
    found: set[str] = set()
    _walk(schema, found, depth=0)
    return found


def _walk(schema: Any, found: set[str], depth: int) -> None:
    if not isinstance(schema, dict) or depth > 64:
        return
    found.update(schema)
    lengths = [key for key in _LENGTHS if key in schema]
    if lengths and "pattern" in schema:
        found.update(f"{key} with pattern" for key in lengths)
    elif lengths and schema.get("format") in _WRITTEN_FORMATS:
        found.update(f"{key} with format" for key in lengths)
    for key in SUBSCHEMA_KEYWORDS:
        _walk(schema.get(key), found, depth + 1)
    for key in SUBSCHEMA_LIST_KEYWORDS:
        for item in schema.get(key) or [] if isinstance(schema.get(key), list) else []:
            _walk(item, found, depth + 1)
    for key in SUBSCHEMA_MAP_KEYWORDS:
        mapping = schema.get(key)
        if isinstance(mapping, dict):
            for item in mapping.values():
                _walk(item, found, depth + 1)
