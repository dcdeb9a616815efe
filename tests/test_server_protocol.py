"""The OpenAI protocol on the ASGI app with the mock engine (no weights): response shapes, streaming,
tools, structured output, reasoning, diffusing, limits and the error envelope."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient

from quicksilver.server import ServerConfig, build_app, build_served_model
from quicksilver.server.mock_engine import MOCK_ANSWER, MOCK_REASONING
from quicksilver.server.protocol.chat import ChatCompletionResponse
from quicksilver.server.protocol.completion import CompletionResponse

USER = [{"role": "user", "content": "hi"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "book_hotel",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "nights": {"type": "integer"},
                    "luxury": {"type": "boolean"},
                },
                "required": ["city", "nights", "luxury"],
                "additionalProperties": False,
            },
        },
    },
]


def make_client(**overrides: Any) -> TestClient:
    cfg = ServerConfig(mock=True, **overrides)
    return TestClient(build_app(build_served_model(cfg), cfg))


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    with make_client() as c:
        yield c


def chat(c: TestClient, **body: Any) -> dict[str, Any]:
    body.setdefault("messages", USER)
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def events(c: TestClient, path: str, **body: Any) -> list[Any]:
    body.setdefault("messages", USER) if path.endswith("chat/completions") else None
    r = c.post(path, json={**body, "stream": True})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    out = []
    for line in r.text.splitlines():
        if line.startswith("data: "):
            out.append("[DONE]" if line == "data: [DONE]" else json.loads(line[6:]))
    return out


def test_chat_response_shape_usage_and_reasoning(client: TestClient) -> None:
    r = chat(client, model="quicksilver-mock", reasoning_effort="medium")
    assert (
        r["object"] == "chat.completion"
        and r["id"].startswith("chatcmpl-")
        and r["model"] == "quicksilver-mock"
    )
    (ch,) = r["choices"]
    assert ch["finish_reason"] == "stop" and ch["message"]["role"] == "assistant"
    assert ch["message"]["content"] == MOCK_ANSWER
    assert ch["message"]["reasoning_content"] == ch["message"]["reasoning"] == MOCK_REASONING
    ChatCompletionResponse.model_validate(r)  # the documented response model describes what is sent
    u = r["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert u["completion_tokens_details"]["reasoning_tokens"] > 0
    assert r["diffusion"]["nfe"] > 0 and r["diffusion"]["tpf"] > 0


@pytest.mark.parametrize("effort", ["none", "instant"])
def test_no_reasoning_efforts_answer_at_once(client: TestClient, effort: str) -> None:
    msg = chat(client, reasoning_effort=effort)["choices"][0]["message"]
    assert msg["content"] == MOCK_ANSWER and "reasoning_content" not in msg


def test_reasoning_never_eats_the_answer_budget(client: TestClient) -> None:
    """max_tokens smaller than the reasoning: the answer still gets all of its max_tokens."""
    r = chat(client, reasoning_effort="high", max_tokens=12)
    ch = r["choices"][0]
    assert ch["message"]["reasoning_content"] == MOCK_REASONING
    assert ch["message"]["content"] and ch["finish_reason"] == "length"
    assert (
        r["usage"]["completion_tokens"]
        - r["usage"]["completion_tokens_details"]["reasoning_tokens"]
        == 12
    )


def test_streaming_same_id_role_first_usage_and_done(client: TestClient) -> None:
    ev = events(
        client,
        "/v1/chat/completions",
        reasoning_effort="low",
        stream_options={"include_usage": True},
    )
    assert ev[-1] == "[DONE]"
    chunks = ev[:-1]
    assert len({c["id"] for c in chunks}) == 1 and all(
        c["object"] == "chat.completion.chunk" for c in chunks
    )
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    reasoning = "".join(
        c["choices"][0]["delta"].get("reasoning_content", "") for c in chunks if c["choices"]
    )
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert reasoning == MOCK_REASONING and content == MOCK_ANSWER
    finals = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finals) == 1 and finals[0]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0
    assert (
        sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 2
    )  # incremental


def test_stop_strings_cut_and_finish_with_stop(client: TestClient) -> None:
    r = chat(client, reasoning_effort="none", stop=["mock", "zzz"])
    assert r["choices"][0]["message"]["content"] == MOCK_ANSWER.split("mock")[0]
    assert r["choices"][0]["finish_reason"] == "stop"
    ev = events(client, "/v1/chat/completions", reasoning_effort="none", stop="quick")
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in ev[:-1])
    assert text == MOCK_ANSWER.split("quick")[0]


def test_n_choices_and_seeds(client: TestClient) -> None:
    r = chat(client, n=3, reasoning_effort="none", temperature=0.7, seed=5)
    assert [c["index"] for c in r["choices"]] == [0, 1, 2]
    ev = events(client, "/v1/chat/completions", n=2, reasoning_effort="none")
    assert {c["choices"][0]["index"] for c in ev[:-1] if c["choices"]} == {0, 1}


def test_tool_call_auto_is_parsed(client: TestClient) -> None:
    r = chat(client, tools=TOOLS, reasoning_effort="none")
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls" and ch["message"]["content"] is None
    ChatCompletionResponse.model_validate(r)
    (call,) = ch["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}


def test_tool_call_parser_keeps_text_before_calls_only() -> None:
    from quicksilver.server.serving.tools import parse_tool_calls

    call = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    content, calls = parse_tool_calls("Let me look. " + call + '": "')
    assert content == "Let me look." and [c["function"]["name"] for c in calls] == ["f"]
    assert parse_tool_calls(call + " junk")[0] is None
    assert [c["function"]["arguments"] for c in parse_tool_calls(call + call)[1]] == [
        '{"x": 1}'
    ] * 2
    text = (
        '<tool_call>{"name": "f", "arguments": {"x": 3139 3</tool_call>'  # unparsable: stays text
    )
    assert parse_tool_calls(text) == (text, [])


def test_tool_loop_second_turn_answers_with_the_result(client: TestClient) -> None:
    first = chat(client, tools=TOOLS, reasoning_effort="none")["choices"][0]["message"]
    call = first["tool_calls"][0]
    messages = USER + [
        first,
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temp_c": 21}'},
    ]
    r = chat(client, messages=messages, tools=TOOLS, reasoning_effort="none")
    ch = r["choices"][0]
    assert ch["finish_reason"] == "stop" and "temp_c" in ch["message"]["content"]


def streamed_calls(ev: list[Any]) -> list[dict[str, Any]]:
    """Tool calls accumulated from stream deltas per index, as clients do."""
    calls: dict[int, dict[str, Any]] = {}
    for c in ev[:-1]:
        for d in (c["choices"] or [{}])[0].get("delta", {}).get("tool_calls") or []:
            cur = calls.setdefault(d["index"], {"id": None, "name": "", "arguments": ""})
            cur["id"] = d.get("id") or cur["id"]
            fn = d.get("function") or {}
            cur["name"] += fn.get("name") or ""
            cur["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


def test_streamed_tool_call(client: TestClient) -> None:
    ev = events(client, "/v1/chat/completions", tools=TOOLS, reasoning_effort="none")
    deltas = [c["choices"][0]["delta"] for c in ev[:-1]]
    assert not "".join(d.get("content", "") for d in deltas)  # the call is not leaked as text
    (call,) = streamed_calls(ev)
    assert call["id"].startswith("call_") and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris", "days": 3}
    assert ev[-2]["choices"][0]["finish_reason"] == "tool_calls"


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "book_hotel"}}]
)
def test_forced_tool_choice_validates_against_the_schema(client: TestClient, choice: Any) -> None:
    r = chat(client, tools=TOOLS, tool_choice=choice, reasoning_effort="none")
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    (call,) = ch["message"]["tool_calls"]
    tool = {t["function"]["name"]: t["function"] for t in TOOLS}[call["function"]["name"]]
    if isinstance(choice, dict):
        assert call["function"]["name"] == "book_hotel"
    jsonschema.validate(json.loads(call["function"]["arguments"]), tool["parameters"])


def test_tool_choice_none_never_calls(client: TestClient) -> None:
    msg = chat(client, tools=TOOLS, tool_choice="none", reasoning_effort="none")["choices"][0][
        "message"
    ]
    assert "tool_calls" not in msg and "<tool_call>" not in msg["content"]


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "ok"],
    "additionalProperties": False,
}


@pytest.mark.parametrize("effort", ["none", "low"])
def test_json_schema_strict_output_validates(client: TestClient, effort: str) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "person", "strict": True, "schema": SCHEMA},
    }
    r = chat(client, response_format=fmt, reasoning_effort=effort)
    ch = r["choices"][0]
    jsonschema.validate(json.loads(ch["message"]["content"]), SCHEMA)
    assert ch["finish_reason"] == "stop"
    ev = events(client, "/v1/chat/completions", response_format=fmt, reasoning_effort=effort)
    streamed = "".join(c["choices"][0]["delta"].get("content", "") for c in ev[:-1])
    jsonschema.validate(json.loads(streamed), SCHEMA)


def test_json_object_mode(client: TestClient) -> None:
    r = chat(
        client, response_format={"type": "json_object"}, reasoning_effort="none", max_tokens=48
    )
    assert isinstance(json.loads(r["choices"][0]["message"]["content"]), dict)


def test_unenforceable_strict_schema_is_400(client: TestClient) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {
            "name": "x",
            "strict": True,
            "schema": {"type": "integer", "multipleOf": 3},
        },
    }
    r = client.post("/v1/chat/completions", json={"messages": USER, "response_format": fmt})
    assert r.status_code == 400 and "multipleOf" in r.json()["error"]["message"]
    fmt["json_schema"]["schema"] = {"type": "string", "pattern": "(?=a)"}  # outside the subset
    r = client.post("/v1/chat/completions", json={"messages": USER, "response_format": fmt})
    e = r.json()["error"]
    assert r.status_code == 400 and "look-around" in e["message"]
    assert e["param"] == "response_format.json_schema.schema"


def test_diffusing_stream_sends_canvas_states(client: TestClient) -> None:
    ev = events(
        client, "/v1/chat/completions", diffusing=True, reasoning_effort="none", max_tokens=64
    )
    canv = [c["choices"][0]["canvas"] for c in ev[:-1] if "canvas" in c["choices"][0]]
    keys = ("phase", "step", "text", "masked", "committed", "remasked", "stable", "done")
    assert len(canv) >= 3 and all(k in canv[0] for k in keys)
    assert canv[0]["masked"] > 0 and "░" in canv[0]["text"]
    steps = [c["step"] for c in canv]
    assert steps == sorted(steps)
    assert canv[-1]["done"] and canv[-1]["text"].startswith(MOCK_ANSWER)
    text = "".join(
        c["choices"][0]["delta"].get("content", "") for c in ev[:-1]
    )  # deltas stay append-only
    assert text == MOCK_ANSWER


def test_completions_and_fim(client: TestClient) -> None:
    r = client.post(
        "/v1/completions", json={"prompt": ["Once upon a time", "Hi"], "max_tokens": 16}
    ).json()
    CompletionResponse.model_validate(r)
    assert (
        r["object"] == "text_completion"
        and [c["text"] for c in r["choices"]] == [" and so on."] * 2
    )
    r = client.post(
        "/v1/completions", json={"prompt": "abc", "echo": True, "max_tokens": 16}
    ).json()
    assert r["choices"][0]["text"] == "abc and so on."
    r = client.post(
        "/v1/fim/completions", json={"prompt": "def f(", "suffix": "):\n    pass"}
    ).json()
    assert r["choices"][0]["text"] == "middle" and r["usage"]["prompt_tokens"] > 0
    r = client.post(
        "/v1/completions", json={"prompt": "def f(", "suffix": "): pass", "max_tokens": 8}
    ).json()
    assert r["choices"][0]["text"] == "middle"
    ev = events(
        client,
        "/v1/fim/completions",
        prompt="a",
        suffix="b",
        stream_options={"include_usage": True},
    )
    assert (
        "".join(c["choices"][0]["text"] for c in ev[:-2]) == "middle"
        and ev[-2]["usage"]["total_tokens"] > 0
    )


def test_models_health_metrics(client: TestClient) -> None:
    m = client.get("/v1/models").json()
    assert m["object"] == "list" and m["data"][0]["id"] == "quicksilver-mock"
    assert client.get("/v1/models/quicksilver-mock").status_code == 200
    assert client.get("/health").json()["status"] == "ok"
    assert "/v1/fim/completions" in client.get("/openapi.json").json()["paths"]
    chat(client)  # a request of its own: histograms have samples only once observed (no test order)
    text = client.get("/metrics").text
    for name in (
        "requests_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
        "e2e_request_latency_seconds",
        "request_queue_time_seconds",
        "diffusion_denoising_steps_total",
        "diffusion_forward_passes_total",
        "diffusion_committed_tokens_total",
        "diffusion_tokens_per_forward_bucket",
        "num_requests_running",
    ):
        assert f"quicksilver:{name}" in text, name


def err(r: Any, status: int, param: str | None = "") -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert "Traceback" not in body["error"]["message"]
    if param != "":
        assert body["error"]["param"] == param
    return dict(body["error"])


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, None),
        ({"messages": USER, "temperature": 5}, "temperature"),
        ({"messages": USER, "max_tokens": 0}, "max_tokens"),
        ({"messages": USER, "n": 99}, "n"),
        ({"messages": USER, "stop": ["a"] * 20}, "stop"),
        ({"messages": USER, "policy": "bogus"}, "policy"),
        ({"messages": USER, "threshold": 1.5}, "threshold"),
        ({"messages": USER, "max_tokens": 100000}, "max_tokens"),
        ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
        ({"messages": USER, "logprobs": True, "top_logprobs": 25}, "top_logprobs"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                    }
                ]
            },
            "messages",
        ),
        ({"messages": USER, "response_format": {"type": "json_schema"}}, None),
    ],
)
def test_bad_fields_are_400_in_the_envelope(
    client: TestClient, body: dict[str, Any], param: str | None
) -> None:
    e = err(client.post("/v1/chat/completions", json=body), 400)
    assert e["type"] == "invalid_request_error"
    if param:
        assert e["param"] and e["param"].startswith(param), e


def test_not_json_unknown_model_and_route(client: TestClient) -> None:
    err(
        client.post(
            "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
        ),
        400,
    )
    e = err(
        client.post("/v1/chat/completions", json={"model": "gpt-9", "messages": USER}), 404, "model"
    )
    assert e["code"] == "model_not_found"
    assert (
        client.post("/v1/completions", json={"model": "quicksilver", "prompt": "x"}).status_code
        == 200
    )  # alias
    err(client.get("/v1/models/gpt-9"), 404)
    err(client.get("/v1/nothing"), 404, None)
    err(client.get("/v1/chat/completions"), 405, None)


def test_api_key_protects_everything_but_health() -> None:
    with make_client(api_key="sekret") as c:
        assert c.get("/health").status_code == 200
        for method, path in [
            ("get", "/v1/models"),
            ("get", "/metrics"),
            ("post", "/v1/chat/completions"),
            ("get", "/openapi.json"),
        ]:
            e = err(getattr(c, method)(path), 401, None)
            assert e["code"] == "invalid_api_key"
            err(getattr(c, method)(path, headers={"Authorization": "Bearer wrong"}), 401, None)
        ok = c.post(
            "/v1/chat/completions",
            json={"messages": USER, "reasoning_effort": "none"},
            headers={"Authorization": "Bearer sekret"},
        )
        assert ok.status_code == 200


def test_limits_body_messages_tools_prompt() -> None:
    with make_client(max_body_bytes=2000, max_messages=3, max_tools=1, max_prompt_tokens=50) as c:
        e = err(
            c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 5000}]}
            ),
            413,
            None,
        )
        assert e["code"] == "request_too_large"
        err(c.post("/v1/chat/completions", json={"messages": USER * 4}), 400, "messages")
        err(c.post("/v1/chat/completions", json={"messages": USER, "tools": TOOLS}), 400, "tools")
        e = err(
            c.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "y" * 200}]}
            ),
            400,
        )
        assert e["code"] == "context_length_exceeded"


def test_overload_is_503_and_too_many_open_is_429() -> None:
    with make_client(max_waiting=0) as c:
        e = err(c.post("/v1/chat/completions", json={"messages": USER}), 503, None)
        assert e["code"] == "server_overloaded"
    with make_client(max_concurrent=0) as c:
        r = c.post("/v1/completions", json={"prompt": "x"})
        err(r, 429, None)
        assert r.headers["retry-after"] == "1"
        assert "quicksilver:requests_rejected_total" in c.get("/metrics").text


def test_block_causal_fim_uses_the_infilling_prompt_and_realtime_skips_reasoning() -> None:
    cfg = ServerConfig(mock=True)
    served = build_served_model(cfg)
    served.attention = (
        "block_causal"  # no look-ahead: the server must use <|fim_prefix|>…<|fim_middle|>
    )
    with TestClient(build_app(served, cfg)) as c:
        r = c.post("/v1/fim/completions", json={"prompt": "a, b, ", "suffix": ", e"}).json()
        assert r["choices"][0]["text"] == "middle"
        seen: list[str] = []
        script = served.engine.engine.decoder.script  # type: ignore[attr-defined]
        served.engine.engine.decoder.script = lambda p: (seen.append(p), script(p))[1]  # type: ignore[attr-defined]
        c.post("/v1/fim/completions", json={"prompt": "a, b, ", "suffix": ", e"})
        assert seen[-1].startswith("<|fim_prefix|>a, b, <|fim_suffix|>, e<|fim_middle|>")
        msg = chat(c, realtime=True, max_completion_tokens=64)["choices"][0]["message"]
        assert msg["content"] == MOCK_ANSWER and "reasoning_content" not in msg
        assert seen[-1].endswith("<think></think>")  # the instant template: no reasoning phase


def test_an_engine_failure_is_a_500_envelope_or_an_error_event() -> None:
    cfg = ServerConfig(mock=True)
    served = build_served_model(cfg)

    def boom(rows: Any) -> Any:
        raise RuntimeError("device lost")

    good = served.engine.engine.decoder.step  # type: ignore[attr-defined]
    served.engine.engine.decoder.step = boom  # type: ignore[attr-defined, method-assign]
    with TestClient(build_app(served, cfg)) as c:
        e = err(c.post("/v1/chat/completions", json={"messages": USER}), 500, None)
        assert e["type"] == "server_error" and "device lost" in e["message"]
        # a stream that fails before its first chunk gets the status too (decided before the first
        # byte); failures after it are one error event and [DONE] (tests/test_reliability_server.py)
        r = c.post(
            "/v1/chat/completions",
            json={"messages": USER, "reasoning_effort": "none", "stream": True},
        )
        assert "device lost" in err(r, 500, None)["message"]
        health = c.get("/health")
        assert health.status_code == 200  # the engine itself goes on
        assert health.json() == {
            "status": "ok",
            "runtime": {"quicksilver-mock": "torch"},
            "step_errors": 2,
        }
        err(c.post("/v1/chat/completions", json={"messages": USER}), 500, None)
        health = c.get("/health")  # three failing steps in a row: take no traffic
        assert health.status_code == 503 and health.json()["status"] == "degraded"
        assert c.head("/health").status_code == 503
        assert (
            'quicksilver:engine_step_errors_total{model_name="quicksilver-mock"} 3.0'
            in c.get("/metrics").text
        )
        served.engine.engine.decoder.step = good  # type: ignore[attr-defined, method-assign]
        assert c.post("/v1/chat/completions", json={"messages": USER}).status_code == 200
        assert c.get("/health").json()["status"] == "ok"  # one good step: healthy again


def test_structured_budgets_shrink_to_fit_max_tokens(client: TestClient) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "person", "strict": True, "schema": SCHEMA},
    }
    full = chat(client, response_format=fmt, reasoning_effort="none")
    small = chat(client, response_format=fmt, reasoning_effort="none", max_tokens=64)
    assert small["usage"]["completion_tokens"] <= 64 < full["usage"]["completion_tokens"]
    jsonschema.validate(json.loads(small["choices"][0]["message"]["content"]), SCHEMA)
    call = chat(
        client, tools=TOOLS, tool_choice="required", reasoning_effort="none", max_tokens=100
    )
    args = json.loads(call["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"])
    assert call["usage"]["completion_tokens"] <= 100 and isinstance(args, dict)
    e = err(
        client.post(
            "/v1/chat/completions", json={"messages": USER, "response_format": fmt, "max_tokens": 5}
        ),
        400,
        "max_tokens",
    )
    assert "at least" in e["message"]


def test_parallel_tool_calls_decode_each_call_on_its_own_canvas(client: TestClient) -> None:
    ask = [{"role": "user", "content": "get_weather for Oslo, then book_hotel there"}]
    both = chat(client, messages=ask, tools=TOOLS, reasoning_effort="none")["choices"][0]
    assert both["finish_reason"] == "tool_calls" and both["message"]["content"] is None
    assert [t["function"]["name"] for t in both["message"]["tool_calls"]] == [
        "get_weather",
        "book_hotel",
    ]
    one = chat(
        client, messages=ask, tools=TOOLS, reasoning_effort="none", parallel_tool_calls=False
    )
    assert [t["function"]["name"] for t in one["choices"][0]["message"]["tool_calls"]] == [
        "get_weather"
    ]
    ev = events(client, "/v1/chat/completions", messages=ask, tools=TOOLS, reasoning_effort="none")
    calls = streamed_calls(ev)
    assert [c["name"] for c in calls] == ["get_weather", "book_hotel"]
    for c in calls:
        tool = {t["function"]["name"]: t["function"] for t in TOOLS}[c["name"]]
        jsonschema.validate(json.loads(c["arguments"]), tool["parameters"])


def test_a_tool_description_with_a_line_separator_is_served(client: TestClient) -> None:
    """U+2028 inside a tool's description (json.dumps keeps it as is): a fuzz finding that made the
    mock engine's prompt parser fail (500)."""
    tool = {
        "type": "function",
        "function": {"name": "f", "description": "a\u2028b\x1cc", "parameters": {"type": "object"}},
    }
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": USER,
            "tools": [tool],
            "tool_choice": "required",
            "reasoning_effort": "none",
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "f"
