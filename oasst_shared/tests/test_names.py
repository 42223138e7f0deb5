"""Names are validated against the whole string: a trailing newline (which Python's ``re.match`` lets
through a ``$``), a leading one, spaces, controls and look-alike characters are refused in every field
that names something: tools, tool_choice, response formats, model configs and a worker key's models (a
request's tool choice and a message's author: tests/openai_api/test_request_names.py, with the server's
request models)."""

from __future__ import annotations

import pytest

from oasst_shared.model_configs import SMOLLM2_135M, ModelConfig
from oasst_shared.sampling import JsonSchemaFormat
from oasst_shared.schemas import CreateWorkerRequest, WorkerLimits
from oasst_shared.tool_calls import FunctionDefinition, NamedToolChoice, ToolDefinition
from tests.support.name_edges import EDGES, refused


@pytest.mark.parametrize("name", EDGES, ids=repr)
def test_a_tool_name_matches_whole(name):
    refused(lambda n: FunctionDefinition(name=n), name)
    refused(lambda n: ToolDefinition.model_validate({"type": "function", "function": {"name": n}}), name)


@pytest.mark.parametrize("name", EDGES, ids=repr)
def test_a_tool_choice_name_matches_whole(name):
    refused(lambda n: NamedToolChoice.model_validate({"type": "function", "function": {"name": n}}), name)


@pytest.mark.parametrize("name", EDGES, ids=repr)
def test_a_response_format_name_matches_whole(name):
    refused(lambda n: JsonSchemaFormat(name=n), name)


@pytest.mark.parametrize("name", EDGES, ids=repr)
def test_a_model_name_matches_whole(name):
    refused(lambda n: ModelConfig(name=n, model_id="x"), name)
    refused(lambda n: WorkerLimits(allowed_models=[n]), name)
    refused(lambda n: CreateWorkerRequest(name="w", allowed_models=["fine", n]), name)


def test_ordinary_names_pass():
    for name in ("get_weather", "a", "A-1_b", "x" * 64):
        assert FunctionDefinition(name=name).name == name
        assert NamedToolChoice.model_validate({"function": {"name": name}}).function.name == name
        assert JsonSchemaFormat(name=name).name == name
    refused(lambda n: FunctionDefinition(name=n), "x" * 65)
    for name in (SMOLLM2_135M.name, "org/model:q4_k_m@rev+1.5"):
        assert ModelConfig(name=name, model_id="x").name == name
        assert WorkerLimits(allowed_models=[name]).allowed_models == [name]
