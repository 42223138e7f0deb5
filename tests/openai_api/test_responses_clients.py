"""Clients nobody here wrote, over the Responses API on the real model: the openai-agents SDK running
an agent that calls a function tool, and LangChain's ChatOpenAI with ``use_responses_api``."""

from __future__ import annotations

import asyncio

import openai
import pytest
from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from langchain_openai import ChatOpenAI

from tests.openai_api.conftest import ApiUser
from tests.support.stacks import MODEL_NAME, Stack

pytestmark = pytest.mark.slow


@pytest.fixture
def stack(production_stack: Stack) -> Stack:
    return production_stack


def test_an_openai_agents_agent_calls_a_function_tool(user: ApiUser, key: str) -> None:
    set_tracing_disabled(True)  # no traces to OpenAI's servers
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    client = openai.AsyncOpenAI(base_url=f"{user.base_url}/v1", api_key=key, max_retries=0)
    agent = Agent(
        name="weather",
        instructions="Use the get_weather tool to answer.",
        model=OpenAIResponsesModel(model=MODEL_NAME, openai_client=client),
        model_settings=ModelSettings(tool_choice="required", temperature=0, max_tokens=64),
        tools=[get_weather],
        tool_use_behavior="stop_on_first_tool",
    )

    async def run() -> str:
        try:
            result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
            return str(result.final_output)
        finally:
            await client.close()

    output = asyncio.run(run())
    assert len(calls) == 1 and calls[0]
    assert output == f"It is sunny in {calls[0]}."


def test_langchain_chat_openai_over_the_responses_api(user: ApiUser, key: str) -> None:
    chat = ChatOpenAI(
        model=MODEL_NAME,
        base_url=f"{user.base_url}/v1",
        api_key=key,
        use_responses_api=True,
        temperature=0,
        max_tokens=16,
        max_retries=0,
    )
    message = chat.invoke("Name a fruit.")
    assert message.text.strip()
    assert message.usage_metadata is not None and message.usage_metadata["output_tokens"] > 0
    streamed = "".join(chunk.text for chunk in chat.stream("Name a fruit."))
    assert streamed == message.text
