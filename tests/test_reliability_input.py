"""Hostile input on the ASGI app with the mock engine: schemas over their cost budgets, malformed
schemas, ``$ref`` cycles, lone surrogates, deep nesting, malicious chat templates — each a fast 400
in the OpenAI envelope naming what was wrong, never a 500 or a frozen server (issue 14)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from quicksilver.errors import ConfigError
from quicksilver.sampling.structured.grammar import LitSet
from quicksilver.sampling.structured.layout_cache import ByteLRU
from quicksilver.server import ServerConfig, build_app, build_served_model
from quicksilver.server.mock_engine import MockEngine
from quicksilver.server.reliability.limits import SchemaLimits, check_schema
from quicksilver.tokenizer import Tokenizer

USER = [{"role": "user", "content": "hi"}]


def fmt(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


@pytest.fixture(scope="module")
def client() -> Iterator[TestClient]:
    cfg = ServerConfig(mock=True)
    with TestClient(build_app(build_served_model(cfg), cfg)) as c:
        yield c


def rejected(c: TestClient, body: dict[str, Any], path: str = "/v1/chat/completions") -> str:
    """Post ``body``; it must be a prompt 400 in the envelope. Returns the message."""
    body = {"messages": USER, **body} if path.endswith("chat/completions") else body
    t0 = time.perf_counter()
    raw = json.dumps(body).encode()  # ASCII escapes: lone surrogates travel as JSON sends them
    r = c.post(path, content=raw, headers={"content-type": "application/json"})
    took = time.perf_counter() - t0
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (
        set(err) == {"message", "type", "param", "code"} and err["type"] == "invalid_request_error"
    )
    assert took < 1.0, f"took {took:.2f} s"
    return str(err["message"])


def fanout(width: int, levels: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"l{levels}": {"type": "string"}}
    for k in range(levels - 1, -1, -1):
        defs[f"l{k}"] = {"anyOf": [{"$ref": f"#/$defs/l{k + 1}"} for _ in range(width)]}
    return {"$defs": defs, "$ref": "#/$defs/l0"}


@pytest.mark.parametrize(
    "schema,limit",
    [
        ({"type": "string", "minLength": 100_000_000}, "canvas"),
        ({"type": "array", "items": {"type": "integer"}, "maxItems": 10_000_000}, "canvas"),
        (fanout(4, 6), "max_alternatives"),
        ({"enum": [f"value-{i}" for i in range(20_000)]}, "max_enum_values"),
        (
            {
                "type": "object",
                "properties": {
                    f"p{i}": {"enum": [f"v{i}-{k:04}" for k in range(200)]} for i in range(12)
                },
            },
            "max_enum_bytes",
        ),
    ],
)
def test_schemas_over_a_budget_are_a_fast_400_naming_it(
    client: TestClient, schema: Any, limit: str
) -> None:
    assert limit in rejected(client, {"response_format": fmt(schema)})


def test_forced_tool_schema_is_budgeted_too(client: TestClient) -> None:
    tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "string", "minLength": 10**8}},
    }
    assert "canvas" in rejected(client, {"tools": [tool], "tool_choice": "required"})


@pytest.mark.parametrize(
    "schema",
    [
        {"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {
            "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}}},
            "$ref": "#/$defs/n",
        },
    ],
)
def test_ref_cycles_are_400(client: TestClient, schema: Any) -> None:
    assert "$ref cycle" in rejected(client, {"response_format": fmt(schema)})


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "minLength": "x"},
        {"enum": 5},
        {"type": "object", "properties": {"a": {"type": "string"}}, "required": 5},
        {"type": "object", "properties": [1]},
        {"type": "wizard"},
    ],
)
def test_keywords_of_the_wrong_type_fail_meta_validation(client: TestClient, schema: Any) -> None:
    assert "not a valid JSON Schema" in rejected(client, {"response_format": fmt(schema)})


def test_deeply_nested_schema_is_400(client: TestClient) -> None:
    schema: Any = {"type": "string"}
    for _ in range(200):
        schema = {"type": "array", "items": schema}
    assert "deeper" in rejected(client, {"response_format": fmt(schema)})


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a\ud800b"}]}),
        ("/v1/completions", {"prompt": "x\udfff"}),
        ("/v1/fim/completions", {"prompt": "def f(", "suffix": "\ud800"}),
        (
            "/v1/chat/completions",
            {
                "messages": USER,
                "tools": [{"type": "function", "function": {"name": "f", "description": "\ud800"}}],
            },
        ),
        ("/v1/chat/completions", {"messages": USER, "response_format": fmt({"enum": ["\ud800"]})}),
    ],
)
def test_lone_surrogates_are_400_at_the_boundary(
    client: TestClient, path: str, body: dict[str, Any]
) -> None:
    assert "surrogate" in rejected(client, body, path)


def test_tool_call_arguments_nested_5000_deep_are_400(client: TestClient) -> None:
    args = '{"a": ' * 5000 + "1" + "}" * 5000
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    assert "deeper" in rejected(client, {"messages": messages})


def test_schemas_within_budget_still_work(client: TestClient) -> None:
    schema = {
        "$defs": {"c": {"type": "string", "enum": ["red", "green"]}},
        "type": "object",
        "properties": {"color": {"$ref": "#/$defs/c"}, "n": {"type": "integer"}},
        "required": ["color", "n"],
        "additionalProperties": False,
    }
    r = client.post("/v1/chat/completions", json={"messages": USER, "response_format": fmt(schema)})
    assert r.status_code == 200, r.text


def test_check_schema_counts_expansion_without_expanding() -> None:
    cost = check_schema(fanout(2, 3), "s", 4096)
    assert cost.alternatives == 2 + 4 + 8 and cost.canvas == 2
    with pytest.raises(Exception, match="max_nodes"):
        check_schema(fanout(3, 7), "s", 4096, limits=SchemaLimits(max_alternatives=10**6))


BAD_TEMPLATES = {
    "loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "output": "{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}",
    "repeat": "{{ 'x' * 10000000000 }}",
    "include": "{% include 'other.jinja' %}",
    "import": "{% import 'macros.jinja' as m %}{{ m.x() }}",
    "type": "{{ messages + 1 }}",
}


@pytest.mark.parametrize("name", sorted(BAD_TEMPLATES))
def test_malicious_chat_templates_fail_cleanly_within_budget(name: str) -> None:
    base = MockEngine().tokenizer
    tok = Tokenizer(base.fast, {**base.config, "chat_template": BAD_TEMPLATES[name]})
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="chat template failed"):
        tok.apply_chat_template(USER)
    assert time.perf_counter() - t0 < 3.0


def test_the_template_budget_counts_the_rendering_threads_own_time() -> None:
    """Wall time the rendering thread does not run (a paused process, a thread waiting for the
    interpreter while another decodes) is not a template that loops: a training run paused with
    SIGSTOP died of "ran longer than 1 s" on its own template (docs/LOG.md, 2026-12-02)."""
    from quicksilver.template_guard import RenderBudget, render_bounded, template_env

    off_cpu = template_env().from_string("{% if wait() %}{% endif %}ok")
    assert render_bounded(off_cpu, RenderBudget(seconds=0.2), wait=lambda: time.sleep(0.4)) == "ok"


def test_a_hanging_template_is_a_400_and_the_server_keeps_serving() -> None:
    cfg = ServerConfig(mock=True)
    served = build_served_model(cfg)
    good = served.tokenizer
    served.tokenizer = Tokenizer(
        good.fast, {**good.config, "chat_template": BAD_TEMPLATES["loops"]}
    )
    with TestClient(build_app(served, cfg)) as c:
        assert "longer than" in rejected_slow(c, {"messages": USER})
        assert c.get("/health").status_code == 200


def rejected_slow(c: TestClient, body: dict[str, Any]) -> str:
    r = c.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    return str(r.json()["error"]["message"])


def test_layout_cache_is_bounded_by_bytes() -> None:
    cache: ByteLRU[bytes] = ByteLRU(100, len)
    for i in range(10):
        cache.get_or_build(str(i), lambda i=i: bytes(30))
    assert len(cache) == 3 and cache.nbytes() <= 100
    built: list[int] = []
    cache.get_or_build("9", lambda: built.append(1) or b"")
    assert not built  # a hit builds nothing
    cache.get_or_build("big", lambda: bytes(500))
    assert len(cache) == 1  # the newest entry stays even when alone over the bound


def test_an_enum_at_the_budget_never_holds_the_engine_thread() -> None:
    """256 values: each step once took up to 2 s of grammar work (one live state per value)."""
    cfg = ServerConfig(mock=True)
    served = build_served_model(cfg)
    engine = served.engine.engine
    step, times = engine.step, []

    def timed() -> Any:
        t0 = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - t0)
        return out

    engine.step = timed  # type: ignore[method-assign]
    values = [f"value-{i}" for i in range(SchemaLimits().max_enum_values)]
    with TestClient(build_app(served, cfg)) as c:
        r = c.post(
            "/v1/chat/completions",
            json={
                "messages": USER,
                "reasoning_effort": "none",
                "response_format": fmt({"enum": values}),
            },
        )
    assert r.status_code == 200, r.text
    assert json.loads(r.json()["choices"][0]["message"]["content"]) in values
    assert times and max(times) < 1.0, f"slowest step {max(times):.2f} s"


def test_litset_accepts_exactly_its_words() -> None:
    m = LitSet(["ab", "abc", "b"])

    def accepts(word: bytes) -> bool:
        states = set(m.starts())
        for b in word:
            states = {t for s in states for t in m.step(s, b)}
        return any(m.accepts(s) for s in states)

    assert [accepts(w) for w in (b"ab", b"abc", b"b", b"a", b"abcd", b"", b"c")] == [
        True, True, True, False, False, False, False,
    ]  # fmt: skip
