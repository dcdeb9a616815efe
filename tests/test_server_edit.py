"""Mercury Edit's routes, ``POST /v1/apply/completions`` and ``POST /v1/edit/completions``, on the mock
engine with the official ``openai`` SDK (its generic ``client.post``, as Inception's docs call the
routes) and raw HTTP for the errors: the chat completion's shapes, usage, streaming, the server-side
system prompt, the 400s, auth, the metrics label, the ``diffusing`` view, the wrapper taken off
replies; and the shapes once on the embedded model."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any, cast

import openai
import pytest
from fastapi.testclient import TestClient
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from quicksilver.assets import embedded_model_path
from quicksilver.server import ServerConfig, build_app, build_served_model
from quicksilver.server.async_engine import AsyncEngine
from quicksilver.server.mock_engine import MOCK_ANSWER, MockEngine, default_script
from quicksilver.server.protocol.edit import EditCompletionRequest
from quicksilver.server.serving.edit import APPLY, NEXT_EDIT, EditServing, Unwrap, unwrap
from quicksilver.server.serving.generation import ServedModel
from quicksilver.server.twin import build_editor
from quicksilver.suite.edit_format import (
    APPLY_SYSTEM,
    CURSOR,
    NEXT_EDIT_SYSTEM,
    NextEditRequest,
    Snippet,
    apply_message,
    next_edit_message,
    strip_wrapper,
)

ORIGINAL = "def total(xs):\n    s = 0\n    for x in xs:\n        s += x\n    return s\n"
UPDATE = "def total(xs):\n    # ... existing code ...\n    return s * 2\n"
MERGED = ORIGINAL.replace("return s", "return s * 2").rstrip("\n")  # as a section holds it
APPLY_MSG = apply_message(ORIGINAL, UPDATE)
NEXT_MSG = next_edit_message(
    NextEditRequest(
        recent=[Snippet("util.py", "def helper():\n    return 1")],
        path="main.py",
        above="import util\n",
        region=f"def main():\n    print(util.help{CURSOR})\n",
        below="main()\n",
        history="--- main.py\n+++ main.py\n@@ -1 +1 @@\n-import os\n+import util",
    )
)
ROUTES = [("/v1/apply/completions", APPLY_MSG), ("/v1/edit/completions", NEXT_MSG)]
KEY = "edit-key"


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


PROMPTS: list[str] = []  # the prompts the wrapping mock saw


def wrapping_script(prompt: str) -> str:
    """The mock's replies, but an apply-edit turn answers with the merged code in a wrapper."""
    PROMPTS.append(prompt)
    if APPLY_SYSTEM in prompt:
        return f"<|updated_code|>\n{MERGED}\n<|/updated_code|>"
    return default_script(prompt)


def mock_served(name: str, script: Any = wrapping_script, edits: bool = False) -> ServedModel:
    mock = MockEngine(script=script)
    tok = mock.tokenizer
    assert tok.mask_id is not None
    return ServedModel(
        name,
        tok,
        AsyncEngine(mock),
        mock.max_context,
        "bidirectional",
        list(tok.stop_ids),
        tok.mask_id,
        edits=edits,
    )


def app_client(**overrides: Any) -> TestClient:
    cfg = ServerConfig(mock=True, **overrides)
    return TestClient(build_app(mock_served("quicksilver-mock"), cfg))


@pytest.fixture(scope="module")
def http() -> Iterator[TestClient]:
    with app_client(api_key=KEY) as c:
        c.headers["Authorization"] = f"Bearer {KEY}"
        yield c


@pytest.fixture(scope="module")
def sdk(http: TestClient) -> openai.OpenAI:
    """The openai SDK speaking HTTP to the app through the test client."""
    return openai.OpenAI(
        base_url="http://testserver/v1", api_key=KEY, max_retries=0, http_client=http
    )


def post(sdk: openai.OpenAI, path: str, **body: Any) -> ChatCompletion:
    return sdk.post(path, body=body, cast_to=ChatCompletion)


def stream(sdk: openai.OpenAI, path: str, **body: Any) -> list[ChatCompletionChunk]:
    body |= {"stream": True}
    chunks = sdk.post(
        path,
        body=body,
        cast_to=ChatCompletion,
        stream=True,
        stream_cls=openai.Stream[ChatCompletionChunk],
    )
    return list(chunks)


def test_apply_edit_is_a_chat_completion_with_the_bare_merged_code(sdk: openai.OpenAI) -> None:
    r = post(sdk, "/apply/completions", model="quicksilver-mock", messages=user(APPLY_MSG))
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "quicksilver-mock"
    (ch,) = r.choices
    assert ch.message.role == "assistant" and ch.finish_reason == "stop"
    assert ch.message.content == MERGED  # the wrapper the model wrote is gone
    assert ch.message.tool_calls is None
    assert not (ch.message.model_extra or {}).get("reasoning_content")
    u = r.usage
    assert u is not None and u.completion_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.completion_tokens_details and u.completion_tokens_details.reasoning_tokens == 0
    # the model read the server's system prompt and the sections, and no reasoning phase
    prompt = next(p for p in reversed(PROMPTS) if APPLY_SYSTEM in p)
    assert APPLY_MSG in prompt
    assert "<think>" not in prompt or prompt.endswith("<think></think>")  # closed at once


def test_next_edit_is_a_chat_completion(sdk: openai.OpenAI) -> None:
    r = post(sdk, "/edit/completions", messages=user(NEXT_MSG), max_tokens=64, temperature=0)
    (ch,) = r.choices
    assert r.object == "chat.completion" and ch.message.content == MOCK_ANSWER
    assert r.usage is not None and r.usage.prompt_tokens > 0
    prompt = next(p for p in reversed(PROMPTS) if NEXT_EDIT_SYSTEM in p)
    assert NEXT_MSG in prompt


def test_sections_are_rendered_again_in_the_trained_layout(sdk: openai.OpenAI) -> None:
    """Text around the sections and blank lines between them do not reach the model."""
    loose = "Please merge.\n\n" + APPLY_MSG.replace("\n\n", "\n\n\n") + "\nThanks!"
    assert post(sdk, "/apply/completions", messages=user(loose)).choices[0].message.content
    assert PROMPTS[-1].count(APPLY_MSG) == 1
    assert "Please merge" not in PROMPTS[-1] and "Thanks" not in PROMPTS[-1]


@pytest.mark.parametrize(("path", "msg"), ROUTES)
def test_streams_are_chat_chunks_with_usage_and_done(
    sdk: openai.OpenAI, http: TestClient, path: str, msg: str
) -> None:
    opts = {"include_usage": True}
    chunks = stream(sdk, path.removeprefix("/v1"), messages=user(msg), stream_options=opts)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finish[-1] == "stop" and not any(finish[:-1])
    assert text == (MERGED if "apply" in path else MOCK_ANSWER)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    raw = http.post(path, json={"messages": user(msg), "stream": True})
    assert raw.status_code == 200 and raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_json_and_stream_agree(sdk: openai.OpenAI) -> None:
    body: dict[str, Any] = {"messages": user(APPLY_MSG), "seed": 3, "max_tokens": 20}
    whole = post(sdk, "/apply/completions", **body)
    chunks = stream(sdk, "/apply/completions", **body)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].finish_reason == "length"
    assert text == whole.choices[0].message.content == unwrap(whole.choices[0].message.content)


def test_diffusing_view(http: TestClient) -> None:
    body = {"messages": user(NEXT_MSG), "stream": True, "diffusing": True, "max_tokens": 64}
    r = http.post("/v1/edit/completions", json=body)
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    canvases = [e["choices"][0]["canvas"] for e in events if "canvas" in e["choices"][0]]
    assert len(canvases) >= 3 and canvases[0]["masked"] > 0 and canvases[-1]["done"]
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert text == MOCK_ANSWER  # deltas stay append-only beside the canvas states


def error(http: TestClient, path: str, body: dict[str, Any], status: int = 400) -> dict[str, Any]:
    r = http.post(path, json=body)
    assert r.status_code == status, r.text
    e: dict[str, Any] = r.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}
    return e


@pytest.mark.parametrize(
    ("path", "msg", "missing"),
    [
        ("/v1/apply/completions", APPLY_MSG.split("<|update_snippet|>")[0], "update_snippet"),
        ("/v1/apply/completions", "merge this please", "original_code"),
        ("/v1/edit/completions", NEXT_MSG.split("<|edit_diff_history|>")[0], "edit_diff_history"),
        ("/v1/edit/completions", APPLY_MSG, "current_file_content"),
        ("/v1/edit/completions", NEXT_MSG.replace(CURSOR, ""), "<|cursor|>"),
        (
            "/v1/edit/completions",
            NEXT_MSG.replace("<|/code_to_edit|>", ""),
            "code_to_edit",
        ),
    ],
)
def test_a_missing_section_is_a_400_naming_it(
    http: TestClient, path: str, msg: str, missing: str
) -> None:
    e = error(http, path, {"messages": user(msg)})
    assert missing in e["message"] and e["type"] == "invalid_request_error"
    assert e["param"] == "messages[0].content" and e["code"] == "missing_section"


@pytest.mark.parametrize("path", [p for p, _ in ROUTES])
def test_roles_other_than_one_user_message_are_400s(http: TestClient, path: str) -> None:
    msg = dict(ROUTES)[path]
    bad = [
        user(msg) * 2,  # two user messages
        [{"role": "system", "content": "Be brief."}, *user(msg)],  # the system prompt is ours
        [*user(msg), {"role": "assistant", "content": "ok"}],
        [{"role": "developer", "content": msg}],
    ]
    for messages in bad:
        e = error(http, path, {"messages": messages})
        assert e["param"] == "messages" and "exactly one user message" in e["message"]
    assert error(http, path, {"messages": []})["param"] == "messages"
    assert error(http, path, {"messages": [{"role": "robot", "content": msg}]})["param"]
    assert (
        "image_url"
        in error(
            http,
            path,
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        )["message"]
    )


def test_text_parts_and_chat_limits(http: TestClient) -> None:
    parts = [{"type": "text", "text": APPLY_MSG[:40]}, {"type": "text", "text": APPLY_MSG[40:]}]
    r = http.post("/v1/apply/completions", json={"messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == MERGED
    for field, value in (("max_tokens", 0), ("temperature", 3), ("top_p", 0), ("n", 0)):
        e = error(http, "/v1/apply/completions", {"messages": user(APPLY_MSG), field: value})
        assert e["param"] == field
    e = error(http, "/v1/apply/completions", {"messages": user(APPLY_MSG), "model": "nope"}, 404)
    assert e["code"] == "model_not_found"
    e = error(http, "/v1/apply/completions", {"messages": user(APPLY_MSG), "max_tokens": 10**7})
    assert e["param"] == "max_tokens"


def test_n_choices_each_unwrapped(http: TestClient) -> None:
    body = {"messages": user(APPLY_MSG), "n": 2, "seed": 1}
    r = http.post("/v1/apply/completions", json=body).json()
    assert [c["message"]["content"] for c in r["choices"]] == [MERGED, MERGED]
    s = http.post("/v1/apply/completions", json=body | {"stream": True}).text
    texts = ["", ""]
    for line in s.splitlines():
        if line.startswith("data: {"):
            ch = json.loads(line[6:])["choices"][0]
            texts[ch["index"]] += ch["delta"].get("content") or ""
    assert texts == [MERGED, MERGED]


def test_auth_and_metrics_label(http: TestClient) -> None:
    for path, msg in ROUTES:
        r = http.post(path, json={"messages": user(msg)}, headers={"Authorization": "Bearer no"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    metrics = http.get("/metrics").text
    for label in ("apply", "edit"):
        line = next(
            x
            for x in metrics.splitlines()
            if x.startswith("quicksilver:requests_total{") and f'endpoint="{label}"' in x
        )
        assert float(line.rsplit(" ", 1)[1]) >= 1


def test_fim_and_chat_keep_working(http: TestClient) -> None:
    r = http.post("/v1/fim/completions", json={"prompt": "def f(", "suffix": "):\n    pass"})
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "middle"
    r = http.post("/v1/chat/completions", json={"messages": user("hi"), "reasoning_effort": "none"})
    assert r.json()["choices"][0]["message"]["content"] == MOCK_ANSWER


WRAPPED = [
    "<|updated_code|>\nx = 1\n<|/updated_code|>",
    "<|updated_code|>x = 1<|/updated_code|>\n",
    "  <|updated_code|>\n\nx = 1\n\n<|/updated_code|>  ",
    "<|updated_code|>\n<|/updated_code|>",
    "<|updated_code|>\n\n<|/updated_code|>",
    "<|updated_code|>\nif a < b:\n    x = '<|'\n<|/updated_code|>",
    "x = 1\n",
    "  x = '<|updated_code|>'\n",
    "<|updat",
    "<",
    "",
    "\n",
    "<|updated_code|>",
]


@pytest.mark.parametrize("reply", WRAPPED)
def test_unwrap_agrees_with_strip_wrapper_however_the_reply_streams(reply: str) -> None:
    rng = random.Random(reply)
    assert unwrap(reply) == (strip_wrapper(reply) if reply.strip() != "<|updated_code|>" else "")
    for _ in range(50):
        cuts = sorted(rng.sample(range(len(reply) + 1), min(len(reply) + 1, rng.randint(1, 6))))
        u = Unwrap()
        pieces = [reply[a:b] for a, b in zip([0, *cuts], [*cuts, len(reply)], strict=True)]
        assert "".join(u.feed(p) for p in pieces) + u.end() == unwrap(reply)


@pytest.mark.skipif(embedded_model_path() is None, reason="this build ships no embedded model")
def test_embedded_model_answers_both_routes() -> None:
    """The shapes on the real model (it is not trained on edits yet: the content is not checked)."""
    cfg = ServerConfig()
    with TestClient(build_app(build_served_model(cfg), cfg)) as c:
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=c)
        for path, msg in ROUTES:
            path = path.removeprefix("/v1")
            r = post(sdk, path, messages=user(msg), max_tokens=32)
            assert r.object == "chat.completion" and r.model == "quicksilver"
            assert isinstance(r.choices[0].message.content, str)
            assert r.choices[0].finish_reason in ("stop", "length")
            assert r.usage is not None and r.usage.prompt_tokens > 0
            chunks = stream(sdk, path, messages=user(msg), max_tokens=32)
            assert chunks[-1].choices[0].finish_reason in ("stop", "length")


EDITOR_REPLY = "merged by the edit model"


@pytest.fixture(scope="module")
def routed() -> Iterator[TestClient]:
    """A chat model (the default) beside an edit model, as ``make run`` serves them."""
    editor = mock_served("mock-edit", lambda prompt: EDITOR_REPLY, edits=True)
    cfg = ServerConfig(mock=True)
    with TestClient(build_app(mock_served("quicksilver-mock"), cfg, [editor])) as c:
        yield c


@pytest.mark.parametrize("path,msg", ROUTES)
def test_edit_routes_go_to_the_edit_model_unless_another_is_named(
    routed: TestClient, path: str, msg: str
) -> None:
    ids = [m["id"] for m in routed.get("/v1/models").json()["data"]]
    assert ids == ["quicksilver-mock", "mock-edit"]
    for model in (None, "mock-edit", "mercury-edit", "mercury-edit-2"):
        body = {"messages": user(msg), "max_tokens": 64} | ({"model": model} if model else {})
        r = routed.post(path, json=body).json()
        assert r["model"] == "mock-edit" and r["choices"][0]["message"]["content"] == EDITOR_REPLY
        lines = routed.post(path, json=body | {"stream": True}).text.splitlines()
        events = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
        assert {e["model"] for e in events} == {"mock-edit"}
        text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
        assert text == EDITOR_REPLY
    asked = routed.post(path, json={"model": "quicksilver-mock", "messages": user(msg)}).json()
    assert asked["model"] == "quicksilver-mock"  # the chat model, as asked
    assert asked["choices"][0]["message"]["content"] != EDITOR_REPLY
    unknown = routed.post(path, json={"model": "gpt-9", "messages": user(msg)})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"


def test_chat_routes_keep_the_default_model(routed: TestClient) -> None:
    r = routed.post("/v1/chat/completions", json={"messages": user("hi"), "max_tokens": 8})
    assert r.json()["model"] == "quicksilver-mock"
    r = routed.post("/v1/chat/completions", json={"model": "mercury-edit", "messages": user("hi")})
    assert r.status_code == 404  # the aliases name the edit model on the edit routes only


def test_route_defaults_where_the_request_is_silent() -> None:
    serving = EditServing(cast(Any, None))
    silent = EditCompletionRequest(messages=[{"role": "user", "content": APPLY_MSG}])
    chat = serving.to_chat(silent, APPLY)
    assert (chat.temperature, chat.top_p) == (0.0, 1.0)
    silent = EditCompletionRequest(messages=[{"role": "user", "content": NEXT_MSG}])
    chat = serving.to_chat(silent, NEXT_EDIT)
    assert (chat.temperature, chat.top_p) == (0.3, 0.8)
    asked = EditCompletionRequest(
        messages=[{"role": "user", "content": NEXT_MSG}], temperature=0, model="mercury-edit"
    )
    chat = serving.to_chat(asked, NEXT_EDIT)
    assert (chat.temperature, chat.top_p, chat.model) == (0.0, 0.8, None)


def test_edit_model_only_beside_the_embedded_default(tmp_path: Any) -> None:
    assert build_editor(ServerConfig(mock=True), "x") is None
    assert build_editor(ServerConfig(model=str(tmp_path)), "x") is None
    assert build_editor(ServerConfig(edit_model=False), "x") is None
