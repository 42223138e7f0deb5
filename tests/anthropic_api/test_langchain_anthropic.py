"""LangChain's ``ChatAnthropic``, unmodified, with its base URL pointed at the server."""

from __future__ import annotations

import pytest

from tests.openai_api.conftest import ApiUser

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


def test_chat_anthropic_plain_streamed_and_with_tools(user: ApiUser, key: str) -> None:
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        return f"It is sunny in {city}."

    llm = ChatAnthropic(  # type: ignore[call-arg]
        model=MODEL, base_url=user.base_url, api_key=key, max_tokens=32, temperature=0, max_retries=0
    )

    plain = llm.invoke("What is the capital of France?")
    assert isinstance(plain, AIMessage) and plain.text.strip()
    assert plain.usage_metadata is not None and plain.usage_metadata["input_tokens"] > 0
    assert plain.response_metadata["stop_reason"] in ("end_turn", "max_tokens")

    streamed = "".join(chunk.text for chunk in llm.stream("What is the capital of France?"))
    assert streamed == plain.text

    with_tools = llm.bind_tools([get_weather], tool_choice="get_weather")
    answer = with_tools.invoke("What is the weather in Rome?")
    (call,) = answer.tool_calls
    assert call["name"] == "get_weather" and isinstance(call["args"].get("city"), str)
    result = get_weather.invoke(call)
    final = llm.bind_tools([get_weather]).invoke(["What is the weather in Rome?", answer, result])
    assert isinstance(final, AIMessage) and final.text.strip()
