"""Admission of the JSON schemas a generation turns into a grammar downstream: the ``response_format`` of
structured output and the tools an answer may be constrained to call, within the bounds of
:mod:`oasst_shared.schema_bounds` (the numbers are in docs/security.md).

A schema under the request size limit can still expand into a grammar that takes a backend down, or
build one of megabytes: it is refused here, before anything is stored or queued, with a 400 naming the
field. The check walks the schema and estimates its grammar within a budget: a fraction of a millisecond
for an ordinary schema, which is checked on the event loop; tens of milliseconds for a large tool set,
which is checked in a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from oasst_inference_server.domain_errors import InvalidRequest
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schema_bounds import SchemaBoundsError, check_schema, check_tool_schemas
from oasst_shared.tool_calls import ToolChoice, ToolDefinition


async def check_output_schemas(
    sampling: SamplingParameters,
    *,
    prefix: str = "",
    tools: Sequence[ToolDefinition] | None = None,
    tool_choice: ToolChoice | None = None,
) -> None:
    """Refuse (``InvalidRequest``, a 400 whose ``param`` is the offending field's path, after ``prefix``)
    a response format or tool set past a bound. Every tool is bounded (it is sent to the worker and may
    be rendered into the prompt whatever the choice); the grammar of the tools an answer may call is
    bounded unless ``tool_choice`` is "none" (backends with tools of their own compile them for "auto"
    too)."""
    response_format = sampling.response_format
    schema = (
        response_format.json_schema.schema_
        if response_format is not None
        and response_format.type == "json_schema"
        and response_format.json_schema is not None
        and response_format.json_schema.schema_
        else None
    )
    checked_tools = list(tools or [])
    if schema is None and not checked_tools:
        return

    def check() -> None:
        if schema is not None:
            check_schema(schema, f"{prefix}response_format.json_schema.schema")
        if checked_tools:
            check_tool_schemas(checked_tools, tool_choice, f"{prefix}tools")

    try:
        if _larger_than([schema, *(t.function.parameters for t in checked_tools)], _ON_THE_LOOP_NODES):
            await asyncio.to_thread(check)
        else:
            check()  # a few hundred microseconds: cheaper than the hop to a thread and back
    except SchemaBoundsError as error:
        raise InvalidRequest("schema_out_of_bounds", str(error), param=error.path) from None


# Schemas with at most this many objects and arrays are checked on the event loop.
_ON_THE_LOOP_NODES = 200


def _larger_than(document: object, limit: int) -> bool:
    """Whether ``document`` holds more than ``limit`` objects and arrays (stops counting past it)."""
    stack = [document]
    count = 0
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
        else:
            continue
        count += 1
        if count > limit:
            return True
    return False
