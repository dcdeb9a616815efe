"""A live server (in this process, real HTTP) on a tiny random DiffusionGemma checkpoint
(tests/diffusion_gemma_fixture.py), driven by the official ``openai`` and ``anthropic`` SDKs: chat
and its stream, ``reasoning_effort``, tool calls, ``json_schema`` (every reply validates), the
``diffusing`` view, ``/v1/messages``, and a 400 in each protocol's envelope for image and audio
parts. Random weights write gibberish: the contract is tested, not the content."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from diffusion_gemma_fixture import CANVAS, write_tiny_diffusion_gemma
from inprocess import serving
from quicksilver.server import ServerConfig

MODEL, KEY = "tiny-dg", "sk-dg-test"
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
]
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "member": {"type": "boolean"}},
    "required": ["name", "member"],
    "additionalProperties": False,
}
HI = [{"role": "user", "content": "hi"}]
QUIET: dict[str, Any] = {"reasoning_effort": "none", "seed": 7}  # answer at once, reproducibly


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    ckpt = write_tiny_diffusion_gemma(tmp_path_factory.mktemp("dg") / "tiny-dg")
    with serving(ServerConfig(model=str(ckpt), served_model_name=MODEL, api_key=KEY)) as u:
        yield u


@pytest.fixture(scope="module")
def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_chat_and_its_stream(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=24, **QUIET)  # type: ignore[arg-type]
    choice = r.choices[0]
    assert isinstance(choice.message.content, str) and choice.finish_reason in ("stop", "length")
    assert r.usage is not None and 0 < r.usage.completion_tokens <= 24
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=HI,  # type: ignore[arg-type]
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
            **QUIET,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # the same seed: the same tokens, streamed
    assert (
        chunks[-1].usage is not None
        and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    )


def test_reasoning_effort(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=HI,
        max_tokens=16,
        reasoning_effort="low",
        seed=1,  # type: ignore[arg-type]
    )
    msg = r.choices[0].message
    assert msg.model_extra is not None and isinstance(msg.model_extra.get("reasoning_content"), str)
    assert isinstance(msg.content, str) and r.usage is not None
    details = r.usage.completion_tokens_details
    assert details is not None and details.reasoning_tokens  # its own budget, beside the answer's


@pytest.mark.parametrize("seed", [1, 2])
def test_a_tool_call_comes_back(client: openai.OpenAI, seed: int) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris for 3 days?"}],
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        reasoning_effort="none",
        seed=seed,
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    auto = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,
        max_tokens=CANVAS,
        **QUIET,
    )
    msg = auto.choices[0].message
    assert "<tool_call>" not in (msg.content or "")  # text never holds call markup
    for c in msg.tool_calls or []:
        jsonschema.validate(json.loads(c.function.arguments), WEATHER)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_replies_validate(client: openai.OpenAI, seed: int) -> None:
    fmt: Any = {
        "type": "json_schema",
        "json_schema": {"name": "p", "schema": PERSON, "strict": True},
    }
    r = client.chat.completions.create(
        model=MODEL,
        messages=HI,
        response_format=fmt,
        reasoning_effort="none",
        seed=seed,  # type: ignore[arg-type]
    )
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), PERSON)


def test_the_diffusing_view(client: openai.OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=HI,  # type: ignore[arg-type]
            max_tokens=24,
            stream=True,
            extra_body={"diffusing": True},
            **QUIET,
        )
    )
    canvases = [c.choices[0].model_extra.get("canvas") for c in chunks if c.choices]
    views = [v for v in canvases if v]
    assert views and all(v["masked"] == 0 and len(v["cells"]) <= 24 for v in views)
    assert [v["step"] for v in views] == sorted(v["step"] for v in views)


def test_messages_api(url: str) -> None:
    ac = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
    m = ac.messages.create(model=MODEL, max_tokens=24, messages=HI)  # type: ignore[arg-type]
    assert m.type == "message" and [b.type for b in m.content] == ["text"]
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.output_tokens > 0
    with ac.messages.stream(model=MODEL, max_tokens=24, messages=HI) as s:  # type: ignore[arg-type]
        assert isinstance("".join(s.text_stream), str)
    tool = {"name": "get_weather", "description": "Weather.", "input_schema": WEATHER}
    m = ac.messages.create(
        model=MODEL,
        max_tokens=128,
        tools=[tool],  # type: ignore[list-item]
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "Weather in Paris?"}],
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses
    for b in uses:
        jsonschema.validate(b.input, WEATHER)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ],
)
def test_image_and_audio_parts_are_a_400(client: openai.OpenAI, part: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]}
            ],  # type: ignore[list-item]
            max_tokens=8,
        )
    err = e.value.body
    assert isinstance(err, dict) and err["type"] == "invalid_request_error"
    assert f"content parts of type {part['type']!r} are not supported" in err["message"]


def test_an_image_block_is_a_400_on_messages(url: str) -> None:
    ac = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    with pytest.raises(anthropic.BadRequestError) as e:
        ac.messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": [image]}],  # type: ignore[list-item]
        )
    assert e.value.status_code == 400 and "image" in str(e.value)
