"""What agent frameworks and vLLM/llama.cpp users expect of the server, on the mock engine: the
Responses API (typed stream checked with the openai SDK), tokenize/detokenize, logprobs,
X-Request-Id, HEAD /health, a chat-template override, a parsable /metrics whatever the served
name, and budgets that never reject the server's own defaults (a property test)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from inprocess import serving
from quicksilver.assets import embedded_model_path
from quicksilver.server import ServerConfig, build_app, build_served_model
from quicksilver.server.async_engine import AsyncEngine
from quicksilver.server.mock_engine import MOCK_ANSWER, MockEngine
from quicksilver.server.serving.budgets import MIN_REASONING, split
from quicksilver.server.serving.generation import ServedModel

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serving() as u:
        yield u


@pytest.fixture(scope="module")
def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


# ---- the Responses API ------------------------------------------------------------------------
def test_responses_text_usage_and_no_stored_state(sdk: openai.OpenAI) -> None:
    r = sdk.responses.create(model="quicksilver-mock", input="hi", instructions="Be brief.")
    assert r.status == "completed" and r.output_text == MOCK_ANSWER and r.store is False
    assert [o.type for o in r.output] == ["reasoning", "message"]
    assert r.usage and r.usage.output_tokens > r.usage.output_tokens_details.reasoning_tokens > 0
    with pytest.raises(openai.BadRequestError) as e:
        sdk.responses.create(model="quicksilver-mock", input="hi", previous_response_id=r.id)
    assert "store" in str(e.value)


def test_responses_typed_stream_events(sdk: openai.OpenAI) -> None:
    events = list(sdk.responses.create(model="quicksilver-mock", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for k in ("response.output_item.added", "response.content_part.added"):
        assert k in kinds
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    (done,) = [e for e in events if e.type == "response.output_text.done"]
    assert text == done.text == MOCK_ANSWER
    assert events[-1].response.output_text == MOCK_ANSWER  # type: ignore[union-attr]
    with sdk.responses.stream(model="quicksilver-mock", input="hi") as s:  # the SDK's accumulator
        final = s.get_final_response()
    assert final.output_text == MOCK_ANSWER


def test_responses_function_call_loop_and_streamed_arguments(sdk: openai.OpenAI) -> None:
    ask: Any = [{"role": "user", "content": "weather in Paris?"}]
    r = sdk.responses.create(
        model="quicksilver-mock", input=ask, tools=[WEATHER], reasoning={"effort": "none"}
    )
    (call,) = r.output
    assert call.type == "function_call" and call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    follow = ask + [
        {
            "type": "function_call",
            "call_id": call.call_id,
            "name": call.name,
            "arguments": call.arguments,
        },
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'},
    ]
    r2 = sdk.responses.create(model="quicksilver-mock", input=follow, tools=[WEATHER])
    assert "temp_c" in r2.output_text
    events = list(
        sdk.responses.create(
            model="quicksilver-mock",
            input=ask,
            tools=[WEATHER],
            reasoning={"effort": "none"},
            stream=True,
        )
    )
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    (done,) = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(args) == json.loads(done.arguments) == {"city": "Paris"}
    assert not any(e.type == "response.output_text.delta" for e in events)


def test_responses_structured_output_and_bad_items(sdk: openai.OpenAI, url: str) -> None:
    fmt: Any = {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}
    r = sdk.responses.create(model="quicksilver-mock", input="a person", text={"format": fmt})
    jsonschema.validate(json.loads(r.output_text), PERSON)
    bad = httpx.post(url + "/v1/responses", json={"input": [{"type": "image", "url": "x"}]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[0]"
    bad = httpx.post(url + "/v1/responses", json={"input": "hi", "tools": [{"type": "web_search"}]})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_responses_errors_name_responses_fields(url: str) -> None:
    """The Responses route is planned by the same planner as chat, but its 400s point at its own
    fields: ``max_output_tokens``, ``text.format``, ``text.format.schema``, ``input``."""

    def param(body: dict[str, Any]) -> str:
        r = httpx.post(url + "/v1/responses", json={"input": "hi", **body})
        assert r.status_code == 400, r.text
        return str(r.json()["error"]["param"])

    assert param({"max_output_tokens": 10**6}) == "max_output_tokens"
    bad_schema = {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}
    assert param({"text": {"format": bad_schema}}) == "text.format.schema"
    huge = {"type": "json_schema", "name": "x", "schema": {"type": "string", "minLength": 10**8}}
    assert param({"text": {"format": huge}}) == "max_output_tokens"
    fn = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    forced = {"type": "function", "name": "f"}
    json_fmt = {"text": {"format": {"type": "json_object"}}}
    assert param({"tools": [fn], "tool_choice": forced, **json_fmt}) == "text.format"
    assert param({"input": "x" * 100_000}) == "input"


def test_a_structured_canvas_is_built_once_per_request(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan carries the built canvas: three choices of one schema-constrained request build
    it once (the old path built it again per budget pass, for its length and per choice)."""
    from quicksilver.server.serving import planner

    built = []
    real = planner.build_canvas

    def counted(*args: Any) -> Any:
        built.append(1)
        return real(*args)

    monkeypatch.setattr(planner, "build_canvas", counted)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    body = {"messages": [{"role": "user", "content": "a person"}], "n": 3, "response_format": fmt}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        jsonschema.validate(json.loads(choice["message"]["content"]), PERSON)
    assert len(built) == 1


# ---- tokenize, logprobs, request ids, health, templates, metrics ----------------------------
@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    cfg = ServerConfig(mock=True)
    with TestClient(build_app(build_served_model(cfg), cfg)) as c:
        yield c


def test_tokenize_detokenize_round_trip(client: TestClient) -> None:
    t = client.post("/tokenize", json={"prompt": "héllo wörld", "return_token_strs": True}).json()
    assert t["count"] == len(t["tokens"]) and t["max_model_len"] > 0 and "token_strs" in t
    assert client.post("/detokenize", json={"tokens": t["tokens"]}).json() == {
        "prompt": "héllo wörld"
    }
    msgs = [{"role": "user", "content": "hi"}]
    n = client.post("/tokenize", json={"messages": msgs}).json()["count"]
    used = client.post(
        "/v1/chat/completions", json={"messages": msgs, "reasoning_effort": "none"}
    ).json()["usage"]["prompt_tokens"]
    assert n + 2 == used  # the prompt that answers at once pre-fills <think></think>
    r = client.post("/detokenize", json={"tokens": [10**9]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"
    r = client.post("/tokenize", json={"prompt": "x", "messages": msgs})
    assert r.status_code == 400


def test_logprobs_are_the_commit_step_probabilities(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none"}
    r = client.post("/v1/chat/completions", json={**body, "logprobs": True, "top_logprobs": 3})
    ch = r.json()["choices"][0]
    content = ch["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == ch["message"]["content"]
    for e in content:
        assert e["logprob"] <= 0 and len(e["top_logprobs"]) == 3
        tops = [t["logprob"] for t in e["top_logprobs"]]
        assert tops == sorted(tops, reverse=True) and e["logprob"] <= tops[0] + 1e-6
    plain = client.post("/v1/chat/completions", json=body).json()["choices"][0]
    assert plain["logprobs"] is None and plain["message"] == ch["message"]
    c = client.post("/v1/completions", json={"prompt": "once", "logprobs": 2}).json()["choices"][0]
    lp = c["logprobs"]
    assert "".join(lp["tokens"]) == c["text"] and len(lp["token_logprobs"]) == len(lp["tokens"])
    assert lp["text_offset"][0] == 0 and all(len(t) == 2 for t in lp["top_logprobs"])


def test_streamed_logprobs_come_with_the_final_chunk(client: TestClient) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "none"}
    r = client.post("/v1/chat/completions", json={**body, "stream": True, "logprobs": True})
    assert r.headers["x-request-id"]
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    (last,) = [c for c in chunks if c["choices"][0]["finish_reason"]]
    assert "".join(e["token"] for e in last["choices"][0]["logprobs"]["content"]) == text


def test_request_id_echoed_or_generated_and_head_health(client: TestClient) -> None:
    r = client.get("/v1/models", headers={"X-Request-Id": "agent-42.turn:3"})
    assert r.headers["x-request-id"] == "agent-42.turn:3"
    fresh = client.get("/v1/models", headers={"X-Request-Id": "bad id\twith junk"})
    assert len(fresh.headers["x-request-id"]) == 32 and " " not in fresh.headers["x-request-id"]
    assert "x-request-id" in client.post("/v1/chat/completions", json={}).headers  # errors too
    h = client.head("/health")
    assert h.status_code == 200 and h.content == b""


def test_chat_template_override(tmp_path: Path) -> None:
    tpl = tmp_path / "t.jinja"
    tpl.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    cfg = ServerConfig(mock=True, chat_template=str(tpl))
    with TestClient(build_app(build_served_model(cfg), cfg)) as c:
        t = c.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
        assert c.post("/detokenize", json={"tokens": t["tokens"]}).json()["prompt"] == "[user] hi\n"
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for %}")
    with pytest.raises(Exception, match="does not compile"):
        build_served_model(ServerConfig(mock=True, chat_template=str(bad)))


def test_metrics_parse_whatever_the_served_name() -> None:
    name = 'a"b\\c\nd} x="1'
    cfg = ServerConfig(mock=True, served_model_name=name)
    with TestClient(build_app(build_served_model(cfg), cfg)) as c:
        c.post(
            "/v1/chat/completions",
            json={"model": name, "messages": [{"role": "user", "content": "hi"}]},
        )
        text = c.get("/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    reqs = fams["quicksilver:requests"]
    assert [s.labels for s in reqs.samples if s.name.endswith("_total")] == [
        {"model_name": name, "endpoint": "chat"}
    ]
    assert {s.labels["model_name"] for f in fams.values() for s in f.samples} == {name}
    for key in ("quicksilver:diffusion_forward_passes", "quicksilver:time_to_first_token_seconds"):
        assert key in fams


# ---- budgets ----------------------------------------------------------------------------------
@given(
    room=st.integers(1, 5000),
    answer=st.one_of(st.none(), st.integers(1, 5000)),
    reasoning=st.integers(0, 2000),
    default=st.integers(1, 4096),
    reserved=st.integers(0, 200),
)
def test_split_always_fits(
    room: int, answer: int | None, reasoning: int, default: int, reserved: int
) -> None:
    s = split(room, answer, reasoning, default, reserved)
    assert s.answer >= 1 and (s.reasoning == 0 or s.reasoning >= MIN_REASONING)
    if reserved < room and (answer is None or answer + reserved <= room):
        assert s.answer + s.reasoning + reserved <= room
    if answer is not None:
        assert s.answer == answer
    assert s.reasoning <= reasoning


SMALL_CONTEXT = 384  # a small context (the v1 embedded model's)
FORMATS: list[dict[str, Any]] = [
    {},
    {"response_format": {"type": "json_object"}},
    {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "p", "strict": True, "schema": PERSON},
        }
    },
    {
        "tools": [
            {"type": "function", "function": {k: WEATHER[k] for k in ("name", "parameters")}}
        ],
        "tool_choice": "required",
    },
    {"tools": [{"type": "function", "function": {k: WEATHER[k] for k in ("name", "parameters")}}]},
]


@pytest.fixture(scope="module")
def small() -> Iterator[TestClient]:
    mock = MockEngine(max_context=SMALL_CONTEXT)
    tok = mock.tokenizer
    assert tok.mask_id is not None
    served = ServedModel(
        "small",
        tok,
        AsyncEngine(mock),
        SMALL_CONTEXT,
        "bidirectional",
        list(tok.stop_ids),
        tok.mask_id,
    )
    cfg = ServerConfig(mock=True, default_max_tokens=64)  # short canvases: a fast test
    with TestClient(build_app(served, cfg)) as c:
        yield c


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    chars=st.integers(1, SMALL_CONTEXT),
    effort=st.sampled_from([None, "none", "instant", "low", "medium", "high"]),
    fmt=st.sampled_from(range(len(FORMATS))),
)
def test_defaults_are_never_rejected(
    small: TestClient, chars: int, effort: str | None, fmt: int
) -> None:
    """With no max_tokens, any prompt that leaves room for the answer's skeleton is served: the
    answer, reasoning and skeleton are sized to the context; only a prompt too long is a 400."""
    body: dict[str, Any] = {"messages": [{"role": "user", "content": "x" * chars}], **FORMATS[fmt]}
    if effort:
        body["reasoning_effort"] = effort
    r = small.post("/v1/chat/completions", json=body)
    if r.status_code != 200:
        e = r.json()["error"]
        assert r.status_code == 400 and e["code"] == "context_length_exceeded", e
        assert e["param"] != "max_tokens" or "structured output" in e["message"], e
        ask = {k: body[k] for k in ("messages", "tools") if k in body}
        prompt = small.post("/tokenize", json=ask).json()["count"]
        assert SMALL_CONTEXT - prompt < 64, (prompt, e)  # only when (almost) nothing is left
        return
    out = r.json()
    u = out["usage"]
    assert u["prompt_tokens"] + u["completion_tokens"] <= SMALL_CONTEXT + 2
    ch = out["choices"][0]
    assert (ch["finish_reason"] == "tool_calls") == bool(ch["message"].get("tool_calls"))


# ---- tool-call guarantees on random weights ----------------------------------------------------
TOOLS2: list[Any] = [  # short: the random checkpoint's byte tokenizer spends a token per byte
    {
        "type": "function",
        "function": {
            "name": "w",
            "parameters": {
                "type": "object",
                "properties": {"c": {"type": "string"}},
                "required": ["c"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "b",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer"}, "l": {"type": "boolean"}},
                "required": ["n", "l"],
                "additionalProperties": False,
            },
        },
    },
]


def check_turn(msg: dict[str, Any], finish: str, tools: list[Any]) -> None:
    """content never holds call markup; every call names an offered tool and validates; the finish
    reason is tool_calls exactly when there are calls."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for tag in ("<tool_call>", "</tool_call>"):
        assert tag not in (msg.get("content") or "")
    calls = msg.get("tool_calls") or []
    for c in calls:
        jsonschema.validate(json.loads(c["function"]["arguments"]), schemas[c["function"]["name"]])
    assert (finish == "tool_calls") == bool(calls), (finish, calls)


def streamed_turn(sse_text: str) -> tuple[dict[str, Any], str]:
    """(message, finish_reason) accumulated from a chat stream as clients do (calls by index)."""
    calls: dict[int, dict[str, Any]] = {}
    content, finish = "", ""
    for line in sse_text.splitlines():
        if not line.startswith("data: {"):
            continue
        for ch in json.loads(line[6:])["choices"]:
            d = ch["delta"]
            content += d.get("content") or ""
            finish = ch["finish_reason"] or finish
            for tc in d.get("tool_calls") or []:
                cur = calls.setdefault(tc["index"], {"function": {"name": "", "arguments": ""}})
                fn = tc.get("function") or {}
                cur["function"]["name"] += fn.get("name") or ""
                cur["function"]["arguments"] += fn.get("arguments") or ""
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)]}, finish


SHORT_TEMPLATE = (  # no tool schemas in the prompt: a random model reads nothing anyway
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "<|im_start|>assistant\n{% if reasoning is defined and not reasoning %}<think></think>{% endif %}"
)


def test_tool_guarantees_on_a_random_model(tiny_ckpt: Path, tmp_path: Path) -> None:
    (tmp_path / "t.jinja").write_text(SHORT_TEMPLATE)
    cfg = ServerConfig(model=str(tiny_ckpt), chat_template=str(tmp_path / "t.jinja"))
    with TestClient(build_app(build_served_model(cfg), cfg)) as c:
        for choice in ("auto", "required"):
            for seed in range(2):
                body: dict[str, Any] = {
                    "messages": [{"role": "user", "content": "book and weather"}],
                    "tools": TOOLS2,
                    "tool_choice": choice,
                    "temperature": 1.0,
                    "seed": seed,
                    "reasoning_effort": "none",
                }
                if choice == "auto":
                    body["max_tokens"] = 24
                r = c.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                ch = r.json()["choices"][0]
                check_turn(ch["message"], ch["finish_reason"], TOOLS2)
                assert ch["message"].get("tool_calls") or choice == "auto"
                r = c.post("/v1/chat/completions", json={**body, "stream": True})
                check_turn(*streamed_turn(r.text), TOOLS2)


@pytest.mark.skipif(embedded_model_path() is None, reason="this build ships no embedded model")
def test_tool_guarantees_on_the_embedded_model() -> None:
    tools: list[Any] = [
        {
            "type": "function",
            "function": {k: WEATHER[k] for k in ("name", "description", "parameters")},
        },
        {
            "type": "function",
            "function": {
                "name": "get_time",
                "description": "Current time in a city.",
                "parameters": WEATHER["parameters"],
            },
        },
    ]
    cfg = ServerConfig()
    with TestClient(build_app(build_served_model(cfg), cfg)) as c:
        for ask, call in CALLS_ASKED.items():
            body = {
                "messages": [{"role": "user", "content": ask}],
                "tools": tools,
                "reasoning_effort": "none",
            }
            ch = c.post("/v1/chat/completions", json=body).json()["choices"][0]
            check_turn(ch["message"], ch["finish_reason"], tools)
            streamed = streamed_turn(
                c.post("/v1/chat/completions", json={**body, "stream": True}).text
            )
            check_turn(*streamed, tools)
            for msg in (ch["message"], streamed[0]):  # the turns that need a call make that call
                made = [
                    (t["function"]["name"], json.loads(t["function"]["arguments"]))
                    for t in msg.get("tool_calls") or []
                ]
                assert call is None or made == [call], (ask, made)


# asks of the embedded model's tool turns: the one call each needs (None: either way, checked only
# for the guarantees)
CALLS_ASKED: dict[str, tuple[str, dict[str, str]] | None] = {
    "Please get the weather in Paris.": ("get_weather", {"city": "Paris"}),
    "What time is it in Rome?": ("get_time", {"city": "Rome"}),
    "What's the time in Oslo?": ("get_time", {"city": "Oslo"}),
    "Hello!": None,
}


def test_auto_tools_that_cannot_fit_answer_in_text_without_markup(small: TestClient) -> None:
    """Near the end of the context, an ``auto`` turn whose call canvas no longer fits answers in
    text with the call tag banned, counted in /metrics (never dropped silently)."""
    from quicksilver.server.protocol.chat import ChatCompletionRequest

    tools = FORMATS[-1]["tools"]
    serving = small.app.state.qs.chat.default  # type: ignore[attr-defined]
    open_id = serving.served.tokenizer.token_to_id("<tool_call>")
    roomy = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], tools=tools)
    plan = serving.plan(roomy)
    assert plan.calls is not None and open_id not in plan.ban_ids  # the call can be made
    for chars in range(SMALL_CONTEXT):  # the prompt (the tools' schemas and x * chars) grows
        req = ChatCompletionRequest(
            messages=[{"role": "user", "content": "x" * chars}], tools=tools
        )
        try:
            plan = serving.plan(req)
        except Exception:  # the prompt itself no longer fits: past the edge
            break
        if plan.calls is None:
            break
    assert plan.calls is None, "no prompt length left the call canvas without room"
    assert open_id in plan.ban_ids  # text only: the model cannot open a call in content
    metric = [
        ln
        for ln in small.get("/metrics").text.splitlines()
        if ln.startswith("quicksilver:tool_calls_unavailable_total")
    ]
    assert metric and float(metric[0].rsplit(" ", 1)[1]) >= 1, metric
