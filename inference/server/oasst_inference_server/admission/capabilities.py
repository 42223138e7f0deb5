"""Admission by capability: what the connected workers of a model can honour (structured output, tools,
logprobs, penalties, the JSON-schema keywords their grammar enforces), as they reported it."""

from __future__ import annotations

from oasst_inference_server.domain_errors import InvalidRequest
from oasst_inference_server.scheduling.worker_registry import LiveModel
from oasst_shared.sampling import SamplingParameters
from oasst_shared.schema_keywords import schema_keywords


def check_capabilities(
    sampling: SamplingParameters,
    model: LiveModel,
    needed: dict[str, str] | None = None,
    *,
    top_logprobs_param: str = "top_logprobs",
    tool_schemas: dict[str, object] | None = None,
) -> None:
    """Refuse (InvalidRequest: a 400 naming the parameter) what some connected worker of ``model`` cannot honour:
    ``sampling``'s needs, ``needed`` (capability -> parameter), and JSON-schema keywords the workers'
    grammar does not enforce in the output schema or in ``tool_schemas`` (parameter -> schema)."""
    schemas: dict[str, object] = {**(tool_schemas or {})}
    if sampling.output_schema is not None:
        schemas["response_format"] = sampling.output_schema
    most = model.capabilities.max_top_logprobs
    if sampling.logprobs and (sampling.top_logprobs or 0) > most and model.capabilities.logprobs:
        raise InvalidRequest(
            "unsupported_parameter",
            f"{top_logprobs_param}: the workers serving {model.config.name!r} give at most {most} "
            "alternatives per token",
            param=top_logprobs_param,
        )
    unenforced = set(model.capabilities.unenforced_schema_keywords)
    for param, schema in schemas.items():
        keywords = sorted(schema_keywords(schema) & unenforced)
        if keywords:
            raise InvalidRequest(
                "unsupported_schema",
                f"{param}: the workers serving {model.config.name!r} cannot enforce the JSON-schema "
                f"keywords {', '.join(keywords)} (their grammar would not guarantee a valid answer)",
                param=param,
            )
    for capability, param in {**sampling.required_capabilities(), **(needed or {})}.items():
        if not getattr(model.capabilities, capability):
            raise InvalidRequest(
                "unsupported_parameter",
                f"{param} is not supported by the workers serving {model.config.name!r} "
                "(their backend cannot honour it)",
                param=param,
            )
