"""What every generation request passes before it is queued, whichever API it came in by (``/v1`` chat
completions and completions, the Responses API, the Anthropic Messages API): the deployment's bounds, a
live model of the right kind, sampling parameters within the model's, output schemas that fit their bounds
and capabilities every worker of the model has. Each failure is a domain error naming its parameter."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from oasst_inference_server.admission.capabilities import check_capabilities
from oasst_inference_server.admission.output_schemas import check_output_schemas
from oasst_inference_server.admission.request_bounds import check_chat_completion_bounds
from oasst_inference_server.domain_errors import InvalidRequest
from oasst_inference_server.openai_api.openai_service import OpenAIService
from oasst_inference_server.openai_protocol.generation_requests import (
    ChatCompletionRequest,
    CompletionRequest,
)
from oasst_inference_server.scheduling.worker_registry import LiveModel
from oasst_shared.sampling import SamplingParameters

# How an API names a tool's schema in its errors ("{i}": the tool's index).
OPENAI_TOOL_SCHEMA = "tools[{i}].function.parameters"


@dataclass(frozen=True)
class Admitted:
    model: LiveModel
    sampling: SamplingParameters


def sampling_of(body: ChatCompletionRequest | CompletionRequest, model: LiveModel) -> SamplingParameters:
    """The request's sampling parameters within the model's limits; InvalidRequest naming the first bad one."""
    try:
        return body.to_sampling_parameters(default_max_tokens=model.config.max_total_length)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise InvalidRequest("invalid_value", f"{param}: {first['msg']}", param=param) from None


async def admit(
    service: OpenAIService,
    body: ChatCompletionRequest | CompletionRequest,
    *,
    tool_schema_param: str = OPENAI_TOOL_SCHEMA,
) -> Admitted:
    """The checks of every generation request, in order; ``tool_schema_param`` names a forced tool's
    schema in the caller's API (its ``{i}``: the tool's index)."""
    chat = isinstance(body, ChatCompletionRequest)
    if chat:
        check_chat_completion_bounds(service.settings, body)
    model = await service.resolve_model(body.model, "generation")
    sampling = sampling_of(body, model)
    tools = body.tools if chat else None
    tool_choice = body.tool_choice if chat else None
    await check_output_schemas(sampling, tools=tools, tool_choice=tool_choice)
    forced = tool_choice not in (None, "none", "auto")
    tool_schemas = (
        {tool_schema_param.format(i=i): t.function.parameters for i, t in enumerate(tools or [])}
        if forced
        else {}
    )
    check_capabilities(
        sampling,
        model,
        body.required_capabilities(),
        top_logprobs_param="top_logprobs" if chat else "logprobs",
        tool_schemas=tool_schemas,
    )
    return Admitted(model, sampling)
