"""The real server as a subprocess on a free port, driven by the official ``openai`` client: on an
``init-model`` checkpoint (random weights: real decoding, garbage text), on the mock engine (for
timing-sensitive disconnects), and on the embedded model when this build ships one."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from quicksilver.assets import embedded_model_path

KEY = "test-key-123"
TOOLS: list[Any] = [
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
    }
]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "member"],
    "additionalProperties": False,
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RemoteServer:
    """``quicksilver serve`` in a subprocess; waits for /health, stops it (by its pid) at the end."""

    def __init__(
        self, *args: str, key: str | None = KEY, preexec_fn: Callable[[], object] | None = None
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "quicksilver.cli", "serve", "--port", str(self.port), *args]
        if key:
            cmd += ["--api-key", key]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("QUICKSILVER_API_KEY", None)
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=preexec_fn,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited: {self.proc.stdout.read() if self.proc.stdout else ''}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not become healthy")

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def metric(self, name: str) -> float:
        text = httpx.get(self.url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(f"quicksilver:{name}{{"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RemoteServer]:
    from quicksilver.models.init import init_model

    ckpt = init_model(tmp_path_factory.mktemp("ckpt") / "tiny-2k", "tiny", seed=0, max_seq_len=2048)
    srv = RemoteServer("--model", str(ckpt), "--served-model-name", "tiny")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def mock_server() -> Iterator[RemoteServer]:
    srv = RemoteServer("--mock", "--mock-step-delay", "0.05")
    yield srv
    srv.stop()


def test_plain_chat_and_models(tiny_server: RemoteServer) -> None:
    c = tiny_server.client()
    assert [m.id for m in c.models.list().data] == ["tiny"]
    r = c.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Hello!"},
        ],
        max_tokens=16,
        reasoning_effort="none",
        temperature=0.5,
        seed=1,
    )
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage is not None
    assert r.usage.completion_tokens <= 16 and r.usage.prompt_tokens > 0
    r2 = c.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "Hello!"},
        ],
        max_tokens=16,
        reasoning_effort="none",
        temperature=0.5,
        seed=1,
    )
    assert r2.choices[0].message.content == r.choices[0].message.content  # seeded


def test_streaming_with_usage(tiny_server: RemoteServer) -> None:
    c = tiny_server.client()
    stream = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Count."}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        reasoning_effort="none",
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert len({ch.id for ch in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert (
        chunks[-1].choices == []
        and chunks[-1].usage is not None
        and chunks[-1].usage.completion_tokens == 24
    )


def test_two_turn_tool_loop(tiny_server: RemoteServer) -> None:
    c = tiny_server.client()
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Paris for 2 days?"}]
    r = c.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=TOOLS,
        tool_choice="required",
        reasoning_effort="none",
    )
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and ch.message.tool_calls
    call = ch.message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), TOOLS[0]["function"]["parameters"])
    messages += [
        ch.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21})},
    ]
    r2 = c.chat.completions.create(
        model="tiny",
        messages=messages,
        tools=TOOLS,
        tool_choice="none",
        max_tokens=16,
        reasoning_effort="none",
    )
    assert (
        r2.choices[0].finish_reason in ("stop", "length") and not r2.choices[0].message.tool_calls
    )


def test_json_schema_strict_validates(tiny_server: RemoteServer) -> None:
    c = tiny_server.client()
    for seed in (1, 2):
        r = c.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "A person, please."}],
            temperature=1.0,
            seed=seed,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "strict": True, "schema": SCHEMA},
            },
            reasoning_effort="low",
        )
        content = r.choices[0].message.content
        assert content is not None
        jsonschema.validate(json.loads(content), SCHEMA)


def test_fim(tiny_server: RemoteServer) -> None:
    r = httpx.post(
        tiny_server.url + "/v1/fim/completions",
        headers={"Authorization": f"Bearer {KEY}"},
        json={
            "model": "tiny",
            "prompt": "1, 2, 3, ",
            "suffix": ", 6, 7",
            "max_tokens": 8,
            "ignore_eos": True,
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "text_completion" and body["usage"]["completion_tokens"] == 8
    c = tiny_server.client()
    r2 = c.completions.create(model="tiny", prompt="1, 2, 3, ", suffix=", 6, 7", max_tokens=8)
    assert r2.choices[0].finish_reason in ("stop", "length")


def test_diffusing_stream(tiny_server: RemoteServer) -> None:
    c = tiny_server.client()
    stream = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=16,
        stream=True,
        reasoning_effort="none",
        extra_body={"diffusing": True, "ignore_eos": True},
    )
    canvases = [
        ch.choices[0].model_extra["canvas"]
        for ch in stream
        if ch.choices and ch.choices[0].model_extra and "canvas" in ch.choices[0].model_extra
    ]
    assert len(canvases) >= 2 and canvases[0]["masked"] > 0 and canvases[-1]["masked"] == 0
    assert [cv["step"] for cv in canvases] == sorted(cv["step"] for cv in canvases)


def test_reasoning_effort_gives_reasoning_and_a_full_answer(tiny_server: RemoteServer) -> None:
    c = tiny_server.client()
    r = c.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "2+2?"}],
        max_tokens=12,
        reasoning_effort="low",
        extra_body={"ignore_eos": True},
    )
    extra = r.choices[0].message.model_extra or {}
    assert "reasoning_content" in extra and extra["reasoning"] == extra["reasoning_content"]
    u = r.usage
    assert u is not None and u.completion_tokens_details is not None
    assert (
        u.completion_tokens - (u.completion_tokens_details.reasoning_tokens or 0) == 12
    )  # answer kept its budget


def test_wrong_key_is_401_and_bad_fields_are_400(tiny_server: RemoteServer) -> None:
    with pytest.raises(openai.AuthenticationError) as e:
        tiny_server.client("wrong").chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}]
        )
    assert e.value.status_code == 401
    c = tiny_server.client()
    with pytest.raises(openai.BadRequestError) as bad:
        c.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], temperature=9
        )
    body: Any = bad.value.body
    assert body["type"] == "invalid_request_error" and body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert httpx.get(tiny_server.url + "/health").status_code == 200  # open without a key


def test_disconnect_mid_stream_frees_the_request(mock_server: RemoteServer) -> None:
    before = mock_server.metric("requests_aborted_total")
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": 600,
        "reasoning_effort": "none",
        "ignore_eos": True,
    }
    with httpx.Client(timeout=30) as h:
        with h.stream(
            "POST",
            mock_server.url + "/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {KEY}"},
        ) as r:
            lines = (
                r.iter_lines()
            )  # (breaking out of iter_lines would close the connection already)
            n = 0
            while n < 3:
                n += next(lines).startswith("data: ")
            assert mock_server.metric("num_requests_running") == 1
        t0 = time.time()  # the connection is closed here
    while time.time() - t0 < 5 and (
        mock_server.metric("num_requests_running")
        or mock_server.metric("requests_aborted_total") == before
    ):
        time.sleep(0.05)
    assert mock_server.metric("num_requests_running") == 0
    assert mock_server.metric("requests_aborted_total") == before + 1
    assert time.time() - t0 < 2.0  # freed within a step or two (a step is 0.05 s here)


def test_disconnect_while_waiting_for_a_full_response(mock_server: RemoteServer) -> None:
    before = mock_server.metric("requests_aborted_total")
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 600,
        "reasoning_effort": "none",
        "ignore_eos": True,
    }
    with pytest.raises(httpx.TimeoutException):
        httpx.post(
            mock_server.url + "/v1/chat/completions",
            json=body,
            timeout=0.5,
            headers={"Authorization": f"Bearer {KEY}"},
        )
    t0 = time.time()
    while time.time() - t0 < 5 and mock_server.metric("requests_aborted_total") == before:
        time.sleep(0.05)
    assert mock_server.metric("requests_aborted_total") == before + 1
    assert mock_server.metric("num_requests_running") == 0


@pytest.mark.skipif(embedded_model_path() is None, reason="this build ships no embedded model")
def test_embedded_model_session() -> None:
    srv = RemoteServer()  # no --model: the embedded model
    try:
        c = srv.client()
        model = c.models.list().data[0].id
        r = c.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello!"}], max_tokens=48
        )
        assert (
            r.choices[0].finish_reason in ("stop", "length")
            and r.usage
            and r.usage.completion_tokens > 0
        )
        tools: Any = [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Get a weather.",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            }
        ]
        ask = [{"role": "user", "content": "Please get the weather in Paris."}]
        r = c.chat.completions.create(
            model=model, messages=ask, tools=tools, tool_choice="required", reasoning_effort="none"
        )
        calls = r.choices[0].message.tool_calls
        assert calls and calls[0].function.name == "get_weather"
        jsonschema.validate(
            json.loads(calls[0].function.arguments), tools[0]["function"]["parameters"]
        )
        r = c.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "A person."}],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "p", "strict": True, "schema": SCHEMA},
            },
        )
        jsonschema.validate(json.loads(r.choices[0].message.content or ""), SCHEMA)
        stream = c.chat.completions.create(
            model=model, messages=ask, tools=tools, stream=True, reasoning_effort="none"
        )
        assert list(stream)[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        srv.stop()


def test_serve_errors_are_one_line(tmp_path: Any) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run(
        [sys.executable, "-m", "quicksilver.cli", "serve", "--model", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert (
        r.returncode == 2
        and "Traceback" not in r.stderr
        and len(r.stderr.strip().splitlines()) == 1
    )
    if embedded_model_path() is None:
        r = subprocess.run(
            [sys.executable, "-m", "quicksilver.cli", "serve", "--port", str(free_port())],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert (
            r.returncode == 2
            and "no embedded model" in r.stderr
            and len(r.stderr.strip().splitlines()) == 1
        )


def test_block_causal_server_fim_and_prefix_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """A block-causal checkpoint: FIM through the infilling tokens, and a resent conversation served
    partly from the cross-request prefix cache (usage.prompt_tokens_details.cached_tokens, /metrics)."""
    from quicksilver.models.init import init_model

    ckpt = init_model(
        tmp_path_factory.mktemp("ckpt") / "tiny-block-2k",
        "tiny",
        seed=1,
        attention="block_causal",
        block_size=16,
        max_seq_len=2048,
    )
    srv = RemoteServer("--model", str(ckpt), "--served-model-name", "blk")
    try:
        c = srv.client()
        r = c.completions.create(model="blk", prompt="1, 2, 3, ", suffix=", 6, 7", max_tokens=8)
        assert r.choices[0].finish_reason in ("stop", "length")
        convo = [
            {"role": "system", "content": "You are a careful assistant. " * 8},
            {"role": "user", "content": "Plan a trip to Oslo."},
        ]
        first = c.chat.completions.create(
            model="blk", messages=convo, max_tokens=8, reasoning_effort="none"
        )
        again = c.chat.completions.create(
            model="blk", messages=convo, max_tokens=8, reasoning_effort="none"
        )
        assert first.usage and again.usage and again.usage.prompt_tokens_details
        assert (again.usage.prompt_tokens_details.cached_tokens or 0) >= 16
        assert srv.metric("prefix_cache_hits_total") >= 16
    finally:
        srv.stop()
