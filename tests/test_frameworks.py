"""The agent frameworks users reach the server through, against a live server (real HTTP, each
framework's own client): LangChain ``ChatOpenAI`` (tools with ``auto`` in a tool loop,
``with_structured_output`` in each method), the openai-agents SDK (an ``Agent`` with a function tool,
on the Responses API and on Chat Completions), pydantic-ai (a tool, a structured output) and
litellm — on the mock engine (deterministic, fast), and a tool turn on the embedded model."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from inprocess import serving
from quicksilver.assets import embedded_model_path
from quicksilver.server import ServerConfig
from quicksilver.server.mock_engine import MOCK_ANSWER

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm: no fetch at import
MODEL = "quicksilver-mock"


def get_weather(city: str) -> str:
    """Get the weather in a city."""
    return json.dumps({"city": city, "temp_c": 21})


class City(BaseModel):
    name: str
    population: int


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving() as u:
        yield u


# ---- LangChain -------------------------------------------------------------------------------
def test_langchain_tool_loop_with_auto(url: str) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    weather = tool(get_weather)
    llm = ChatOpenAI(model=MODEL, base_url=url + "/v1", api_key="unused", max_retries=0)
    bound = llm.bind_tools([weather])  # tool_choice left to the model: auto
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    ai = bound.invoke(messages)
    assert ai.content == "" and [c["name"] for c in ai.tool_calls] == ["get_weather"]
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]))
    final = bound.invoke(messages)
    assert not final.tool_calls and "temp_c" in str(final.content)
    chunks = list(bound.stream([HumanMessage("What is the weather in Paris?")]))
    merged = chunks[0]
    for c in chunks[1:]:
        merged = merged + c
    assert [c["name"] for c in merged.tool_calls] == ["get_weather"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_langchain_structured_output(url: str, method: str) -> None:
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=MODEL, base_url=url + "/v1", api_key="unused", max_retries=0)
    if method == "json_mode":  # JSON mode promises an object, not a schema
        short = ChatOpenAI(  # a free-form object fills its whole canvas: keep it small
            model=MODEL, base_url=url + "/v1", api_key="unused", max_retries=0, max_tokens=48
        )
        out = short.with_structured_output(None, method="json_mode").invoke("A city, as JSON.")
        assert isinstance(out, dict)
        return
    city = llm.with_structured_output(City, method=method).invoke("Name a city.")  # type: ignore[arg-type]
    assert isinstance(city, City)


# ---- openai-agents SDK ------------------------------------------------------------------------
@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_openai_agents_sdk_function_tool(url: str, api: str) -> None:
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather",
        instructions="Answer with the tool's result.",
        tools=[function_tool(get_weather)],
        model=kind(model=MODEL, openai_client=client),
    )
    result = Runner.run_sync(agent, "What is the weather in Paris?", max_turns=4)
    calls = [i for i in result.new_items if i.type == "tool_call_item"]
    outputs = [i for i in result.new_items if i.type == "tool_call_output_item"]
    assert len(calls) == 1 and len(outputs) == 1
    assert "temp_c" in result.final_output


# ---- pydantic-ai -----------------------------------------------------------------------------
def _pydantic_model(url: str) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=url + "/v1", api_key="unused"))


def test_pydantic_ai_tool(url: str) -> None:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_model(url), tools=[get_weather])
    result = agent.run_sync("What is the weather in Paris?")
    assert "temp_c" in result.output
    kinds = [p.part_kind for m in result.all_messages() for p in m.parts]
    assert "tool-call" in kinds and "tool-return" in kinds


def test_pydantic_ai_structured_output(url: str) -> None:
    from pydantic_ai import Agent

    result = Agent(_pydantic_model(url), output_type=City).run_sync("Name a city.")
    assert isinstance(result.output, City)


# ---- litellm ---------------------------------------------------------------------------------
@pytest.mark.slow  # importing litellm alone takes most of it (make test-slow, CI)
def test_litellm_completion_tools_and_stream(url: str) -> None:
    import litellm

    kw: dict[str, Any] = {"model": "openai/" + MODEL, "api_base": url + "/v1", "api_key": "unused"}
    r = litellm.completion(
        messages=[{"role": "user", "content": "hi"}], reasoning_effort="none", **kw
    )
    assert r.choices[0].message.content == MOCK_ANSWER
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ]
    r = litellm.completion(messages=[{"role": "user", "content": "weather?"}], tools=tools, **kw)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_weather" and r.choices[0].finish_reason == "tool_calls"
    text = "".join(
        c.choices[0].delta.content or ""
        for c in litellm.completion(
            messages=[{"role": "user", "content": "hi"}], stream=True, reasoning_effort="none", **kw
        )
    )
    assert text == MOCK_ANSWER


# ---- the embedded model -----------------------------------------------------------------------
@pytest.mark.slow  # the mock-engine tests above cover the protocol; this re-proves it on the model
@pytest.mark.skipif(embedded_model_path() is None, reason="this build ships no embedded model")
def test_langchain_and_agents_sdk_on_the_embedded_model() -> None:
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    with serving(ServerConfig()) as u:
        llm = ChatOpenAI(
            model="quicksilver",
            base_url=u + "/v1",
            api_key="unused",
            max_retries=0,
            reasoning_effort="none",
        )
        ai = llm.bind_tools([tool(get_weather)]).invoke(
            [HumanMessage("Please get the weather in Paris.")]
        )
        assert [c["name"] for c in ai.tool_calls] == ["get_weather"]
        assert isinstance(ai.tool_calls[0]["args"]["city"], str) and "<tool_call>" not in str(
            ai.content
        )
