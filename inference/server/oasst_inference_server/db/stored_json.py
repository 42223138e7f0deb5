"""JSON columns read back: a row stored under older rules must not take a read down with it.

What the server stores was valid when it was stored, and nested at most ``MAX_JSON_DEPTH`` levels since
the edge has refused deeper bodies; but a rule tightened later (a bound, a name pattern) or a row from an
older version can fail today's model. A read that shows a stored value (a message, a user's settings)
then shows what it can and logs what it could not; a read that acts on it (a work frame) refuses the
message instead (``message_lifecycle``), so nothing runs on half a request. Python's ``json`` parses
these columns: at the depth they can have it needs a few hundred of the thousand frames it may use.
"""

from __future__ import annotations

from collections.abc import Hashable
from functools import cache
from typing import Any, TypeVar, cast

from loguru import logger
from pydantic import TypeAdapter, ValidationError

from oasst_shared.json_depth import value_depth
from oasst_shared.limits import MAX_JSON_DEPTH

T = TypeVar("T")


def stored_object(value: Any) -> dict[str, Any]:
    """A column that holds a JSON object, or an empty one if it holds anything else."""
    return value if isinstance(value, dict) else {}


def read_stored(shape: type[T], value: Any, *, what: str) -> T | None:
    """``value`` read through ``shape`` (a model, or a type such as ``list[Model]``), or None with a
    warning naming ``what`` when it no longer reads (None stays None)."""
    if value is None:
        return None
    adapter = _adapter(cast(Hashable, shape))
    if value_depth(value, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        logger.warning("{}: stored JSON nests deeper than {} levels; not shown", what, MAX_JSON_DEPTH)
        return None
    try:
        read: T = adapter.validate_python(value)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        logger.warning("{}: stored JSON no longer reads ({}); not shown", what, first["msg"])
        return None
    return read


@cache
def _adapter(shape: Hashable) -> TypeAdapter[Any]:
    return TypeAdapter(cast(Any, shape))
