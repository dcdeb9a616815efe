"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) through the clients
that speak it, against a live server: the official ``anthropic`` SDK (create, a stream read by the
SDK's own accumulator, a multi-turn tool loop with ``tool_result``, ``tool_choice`` any / a named
tool / parallel calls off, ``stop_sequences``, ``thinking``, count_tokens, ``x-api-key`` and bearer
auth, bad requests as the SDK's typed exceptions), LangChain's ``ChatAnthropic`` with ``bind_tools``
in a loop, and pydantic-ai's Anthropic model with a tool and a structured output — on the mock
engine, on a random tiny model (every ``tool_use.input`` validates, text never holds markup) and
on the embedded model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from inprocess import serving
from quicksilver.assets import embedded_model_path
from quicksilver.server import ServerConfig
from quicksilver.server.mock_engine import MOCK_ANSWER, MOCK_REASONING
from test_frameworks import City, get_weather

MODEL = "quicksilver-mock"
KEY = "sk-anthropic-test"
WEATHER = {
    "name": "get_weather",
    "description": "Get the weather in a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
TIME = {**WEATHER, "name": "get_time", "description": "Current time in a city."}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving(ServerConfig(mock=True, api_key=KEY)) as u:
        yield u


@pytest.fixture(scope="module")
def client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)


def test_create_and_a_stream_read_by_the_sdk_accumulator(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == MOCK_ANSWER  # type: ignore[union-attr]
    assert m.stop_reason == "end_turn" and m.stop_sequence is None
    counted = client.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert m.usage.input_tokens == counted.input_tokens > 0 and m.usage.output_tokens > 0
    with client.messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert text == MOCK_ANSWER and final.content[0].text == MOCK_ANSWER  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == m.usage.output_tokens


def test_raw_stream_has_the_typed_event_sequence(url: str) -> None:
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "tools": [WEATHER], "stream": True}
    r = httpx.post(url + "/v1/messages", json=body, headers={"x-api-key": KEY}, timeout=60)
    kinds = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == [
        "message_delta",
        "message_stop",
    ]
    assert kinds[2:-2] == ["content_block_start", "content_block_delta", "content_block_stop"]
    datas = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert datas[2]["content_block"] == {
        "type": "tool_use",
        "id": datas[2]["content_block"]["id"],
        "name": "get_weather",
        "input": {},
    }
    assert json.loads(datas[3]["delta"]["partial_json"]) == {"city": "Paris"}
    assert datas[-2]["delta"]["stop_reason"] == "tool_use"


def test_a_tool_loop_with_tool_result(client: anthropic.Anthropic) -> None:
    m = client.messages.create(model=MODEL, max_tokens=128, tools=[WEATHER], messages=USER)  # type: ignore[list-item]
    assert m.stop_reason == "tool_use"
    (call,) = [b for b in m.content if b.type == "tool_use"]
    jsonschema.validate(call.input, WEATHER["input_schema"])
    turn2 = [
        *USER,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": call.id,
                    "content": get_weather(**call.input),
                }  # type: ignore[arg-type]
            ],
        },
    ]
    final = client.messages.create(model=MODEL, max_tokens=128, tools=[WEATHER], messages=turn2)  # type: ignore[arg-type, list-item]
    assert final.stop_reason == "end_turn" and "temp_c" in final.content[0].text  # type: ignore[union-attr]
    err = [
        {
            "type": "tool_result",
            "tool_use_id": call.id,
            "content": [{"type": "text", "text": "down"}],
            "is_error": True,
        }
    ]
    final = client.messages.create(
        model=MODEL,
        max_tokens=128,
        tools=[WEATHER],
        messages=[*turn2[:2], {"role": "user", "content": err}],  # type: ignore[arg-type, list-item]
    )
    assert "Error: down" in final.content[0].text  # type: ignore[union-attr]


def test_tool_choice_any_named_and_no_parallel_calls(client: anthropic.Anthropic) -> None:
    ask = [{"role": "user", "content": "get_weather and get_time for Paris"}]
    both = client.messages.create(
        model=MODEL,
        max_tokens=256,
        tools=[WEATHER, TIME],
        tool_choice={"type": "any"},
        messages=ask,
    )  # type: ignore[list-item, arg-type]
    assert [b.name for b in both.content if b.type == "tool_use"] == ["get_weather", "get_time"]
    one = client.messages.create(
        model=MODEL,
        max_tokens=256,
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        messages=ask,  # type: ignore[arg-type]
    )
    assert [b.type for b in one.content if b.type == "tool_use"] == ["tool_use"]
    named = client.messages.create(
        model=MODEL,
        max_tokens=256,
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice={"type": "tool", "name": "get_time"},
        messages=USER,  # type: ignore[arg-type]
    )
    assert [b.name for b in named.content if b.type == "tool_use"] == ["get_time"]
    none = client.messages.create(
        model=MODEL, max_tokens=64, tools=[WEATHER], tool_choice={"type": "none"}, messages=USER
    )  # type: ignore[list-item, arg-type]
    assert none.stop_reason == "end_turn" and all(b.type == "text" for b in none.content)
    assert "<tool_call>" not in none.content[0].text  # type: ignore[union-attr]


def test_stop_sequences_and_max_tokens(client: anthropic.Anthropic) -> None:
    m = client.messages.create(
        model=MODEL,
        max_tokens=64,
        stop_sequences=["mock"],
        messages=[{"role": "user", "content": "hi"}],
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "mock"
    assert m.content[0].text == MOCK_ANSWER.split("mock")[0]  # type: ignore[union-attr]
    short = client.messages.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}]
    )
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens <= 4


def test_thinking_blocks(client: anthropic.Anthropic) -> None:
    thinking: Any = {"type": "enabled", "budget_tokens": 200}
    m = client.messages.create(
        model=MODEL, max_tokens=64, thinking=thinking, messages=[{"role": "user", "content": "hi"}]
    )
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == MOCK_REASONING  # type: ignore[union-attr]
    with client.messages.stream(
        model=MODEL, max_tokens=64, thinking=thinking, messages=[{"role": "user", "content": "hi"}]
    ) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == MOCK_REASONING and final.content[1].text == MOCK_ANSWER  # type: ignore[union-attr]
    plain = client.messages.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
    )
    assert [b.type for b in plain.content] == ["text"]  # no thinking unless asked, as the API


def test_system_blocks_and_auth_headers(url: str) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 64,
        "system": [{"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    version = {"anthropic-version": "2023-06-01"}
    for auth in ({"x-api-key": KEY}, {"Authorization": f"Bearer {KEY}"}):
        r = httpx.post(url + "/v1/messages", json=body, headers={**auth, **version}, timeout=60)
        assert r.status_code == 200 and r.json()["content"][0]["text"] == MOCK_ANSWER
    r = httpx.post(url + "/v1/messages", json=body, headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": r.json()["error"]["message"]},
    }


def test_bad_requests_are_the_sdks_typed_errors(url: str, client: anthropic.Anthropic) -> None:
    hi = [{"role": "user", "content": "hi"}]
    big = client.messages.create(model=MODEL, max_tokens=8192, messages=hi)  # type: ignore[arg-type]
    assert big.content[0].text == MOCK_ANSWER  # type: ignore[union-attr]  # a bound, lowered to fit
    image = [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                }
            ],
        }
    ]
    with pytest.raises(anthropic.BadRequestError, match="image"):
        client.messages.create(model=MODEL, max_tokens=16, messages=image)  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-9", max_tokens=16, messages=hi)  # type: ignore[arg-type]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=url, api_key="wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=16, messages=hi
        )  # type: ignore[arg-type]
    bad_schema = {
        **WEATHER,
        "input_schema": {"type": "object", "properties": {"c": {"type": "nope"}}},
    }
    with pytest.raises(anthropic.BadRequestError, match="input_schema"):
        client.messages.create(
            model=MODEL, max_tokens=64, tools=[bad_schema], tool_choice={"type": "any"}, messages=hi
        )  # type: ignore[list-item, arg-type]
    r = httpx.post(
        url + "/v1/messages", json={"model": MODEL, "messages": hi}, headers={"x-api-key": KEY}
    )
    assert (
        r.status_code == 400
        and r.json()["type"] == "error"
        and "max_tokens" in r.json()["error"]["message"]
    )


def test_limits_and_overload_answer_in_the_anthropic_envelope() -> None:
    """The server's own refusals (body size before any parsing, a full queue) on these routes."""
    from fastapi.testclient import TestClient

    from quicksilver.server import build_app, build_served_model

    hi = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    cfg = ServerConfig(mock=True, max_body_bytes=256, max_waiting=0)
    with TestClient(build_app(build_served_model(cfg), cfg)) as c:
        big = c.post("/v1/messages", json={**hi, "system": "x" * 300})
        assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
        busy = c.post("/v1/messages", json=hi)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert busy.json() == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": busy.json()["error"]["message"]},
        }
        other = c.post("/v1/chat/completions", json={"messages": hi["messages"]})
        assert other.status_code == 503 and other.json()["error"]["code"] == "server_overloaded"


# ---- frameworks -------------------------------------------------------------------------------
def test_langchain_chat_anthropic_tool_loop(url: str) -> None:
    from langchain_anthropic import ChatAnthropic
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    weather = tool(get_weather)
    llm = ChatAnthropic(model=MODEL, base_url=url, api_key=KEY, max_retries=0, max_tokens=128)  # type: ignore[call-arg]
    bound = llm.bind_tools([weather])
    messages: list[Any] = [HumanMessage("What is the weather in Paris?")]
    ai = bound.invoke(messages)
    assert [c["name"] for c in ai.tool_calls] == ["get_weather"]
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append(ToolMessage(weather.invoke(call["args"]), tool_call_id=call["id"]))
    final = bound.invoke(messages)
    assert not final.tool_calls and "temp_c" in str(final.content)


def _pydantic_model(url: str) -> Any:
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    return AnthropicModel(MODEL, provider=AnthropicProvider(base_url=url, api_key=KEY))


def test_pydantic_ai_anthropic_tool_and_structured_output(url: str) -> None:
    from pydantic_ai import Agent

    result = Agent(_pydantic_model(url), tools=[get_weather]).run_sync(
        "What is the weather in Paris?"
    )
    kinds = [p.part_kind for m in result.all_messages() for p in m.parts]
    assert "tool-call" in kinds and "tool-return" in kinds and "temp_c" in result.output
    city = Agent(_pydantic_model(url), output_type=City).run_sync("Name a city.")
    assert isinstance(city.output, City)


# ---- real models ------------------------------------------------------------------------------
def test_tool_use_guarantees_on_a_random_model(tiny_ckpt: Path, tmp_path: Path) -> None:
    from test_server_agents import SHORT_TEMPLATE

    (tmp_path / "t.jinja").write_text(SHORT_TEMPLATE)
    tools = [
        {
            "name": "w",
            "input_schema": {
                "type": "object",
                "properties": {"c": {"type": "string"}},
                "required": ["c"],
            },
        },
        {
            "name": "b",
            "input_schema": {
                "type": "object",
                "properties": {"n": {"type": "integer"}, "l": {"type": "boolean"}},
                "required": ["n", "l"],
                "additionalProperties": False,
            },
        },
    ]
    schemas = {t["name"]: t["input_schema"] for t in tools}
    cfg = ServerConfig(model=str(tiny_ckpt), chat_template=str(tmp_path / "t.jinja"))
    with serving(cfg) as u:
        c = anthropic.Anthropic(base_url=u, api_key="unused", max_retries=0)
        for choice in ({"type": "auto"}, {"type": "any"}):
            for temperature in (0.0, 1.0):  # extra_body: this SDK no longer sends sampling fields
                kw: Any = dict(
                    model="tiny-bidir",
                    tools=tools,
                    tool_choice=choice,
                    extra_body={"temperature": temperature},
                )
                kw["messages"] = [{"role": "user", "content": "book and weather"}]
                kw["max_tokens"] = 24 if choice["type"] == "auto" else 256
                for m in (c.messages.create(**kw), _streamed(c, kw)):
                    uses = [b for b in m.content if b.type == "tool_use"]
                    for b in uses:
                        jsonschema.validate(b.input, schemas[b.name])
                    for b in m.content:
                        assert b.type != "text" or "<tool_call>" not in b.text
                    assert (m.stop_reason == "tool_use") == bool(uses)
                    assert uses or choice["type"] == "auto"


def _streamed(c: anthropic.Anthropic, kw: dict[str, Any]) -> Any:
    with c.messages.stream(**kw) as s:
        return s.get_final_message()


@pytest.mark.skipif(embedded_model_path() is None, reason="this build ships no embedded model")
def test_the_embedded_model_calls_a_tool_and_answers() -> None:
    """The anthropic SDK, LangChain's ChatAnthropic and pydantic-ai on the embedded model."""
    with serving(ServerConfig()) as u:
        c = anthropic.Anthropic(base_url=u, api_key="unused", max_retries=0)
        ask = [{"role": "user", "content": "Please get the weather in Paris."}]
        m = c.messages.create(model="quicksilver", max_tokens=128, tools=[WEATHER], messages=ask)  # type: ignore[list-item, arg-type]
        (call,) = [b for b in m.content if b.type == "tool_use"]
        assert call.name == "get_weather" and m.stop_reason == "tool_use"
        jsonschema.validate(call.input, WEATHER["input_schema"])
        hi = c.messages.create(
            model="quicksilver", max_tokens=64, messages=[{"role": "user", "content": "Hello!"}]
        )
        hot = c.messages.create(
            model="quicksilver",
            max_tokens=64,
            messages=[{"role": "user", "content": "Hello!"}],
            extra_body={"temperature": 1.0, "top_k": 1},  # top_k 1: greedy at any temperature
        )
        assert hot.content == hi.content
        from langchain_anthropic import ChatAnthropic
        from langchain_core.messages import HumanMessage
        from langchain_core.tools import tool

        llm = ChatAnthropic(model="quicksilver", base_url=u, api_key="unused", max_retries=0)  # type: ignore[call-arg]
        ai = llm.bind_tools([tool(get_weather)]).invoke([HumanMessage(ask[0]["content"])])
        assert [c["name"] for c in ai.tool_calls] == ["get_weather"]
        assert isinstance(ai.tool_calls[0]["args"]["city"], str)
        from pydantic_ai import Agent
        from pydantic_ai.models.anthropic import AnthropicModel
        from pydantic_ai.providers.anthropic import AnthropicProvider

        model = AnthropicModel("quicksilver", provider=AnthropicProvider(base_url=u, api_key="x"))
        run = Agent(model, tools=[get_weather]).run_sync("What is the weather in Paris?")
        kinds = [p.part_kind for m in run.all_messages() for p in m.parts]
        assert kinds[:3] == ["user-prompt", "tool-call", "tool-return"] and run.output.strip()
        assert isinstance(Agent(model, output_type=City).run_sync("Name a city.").output, City)
        assert (
            hi.content[0].type == "text"
            and hi.content[0].text.strip()
            and hi.stop_reason in ("end_turn", "max_tokens")
        )  # type: ignore[union-attr]
