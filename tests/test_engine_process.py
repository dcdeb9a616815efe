"""``serve --engine process``: the engine in its own process behind the same API (issue 24, item 12).

Over real sockets: replies, streams, log-probabilities and structured output equal the thread
design's; an engine-side refusal reaches the client as the thread design's status; a client that
hangs up cancels the request in the engine's process; a dead engine process fails its requests
and turns ``/health`` to 503; on the embedded model, greedy replies equal the thread design's."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from test_server_live import KEY, RemoteServer

AUTH = {"Authorization": f"Bearer {KEY}"}
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "point",
        "schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    },
}
BODIES: list[dict[str, Any]] = [
    {"messages": USER, "max_tokens": 24},
    {"messages": USER, "max_tokens": 16, "logprobs": True, "top_logprobs": 2},
    {"messages": USER, "max_tokens": 24, "response_format": SCHEMA},
    {"messages": USER, "max_tokens": 24, "n": 2, "temperature": 0.8, "seed": 3},
]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[RemoteServer, RemoteServer]]:
    thread = RemoteServer("--mock", "--mock-step-delay", "0.01")
    process = RemoteServer("--mock", "--mock-step-delay", "0.01", "--engine", "process")
    try:
        yield thread, process
    finally:
        thread.stop()
        process.stop()


def post(server: RemoteServer, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)


def strip(reply: dict[str, Any]) -> Any:
    return reply["choices"], reply["usage"]


def test_replies_equal_the_thread_design(servers: tuple[RemoteServer, RemoteServer]) -> None:
    thread, process = servers
    for body in BODIES:
        a, b = post(thread, body), post(process, body)
        assert a.status_code == b.status_code == 200, b.text
        assert strip(a.json()) == strip(b.json()), body
    assert post(process, BODIES[1]).json()["choices"][0]["logprobs"]["content"]  # sent back


def test_streams_equal_the_thread_design(servers: tuple[RemoteServer, RemoteServer]) -> None:
    def chunks(server: RemoteServer) -> list[Any]:
        body = {"messages": USER, "max_tokens": 24, "stream": True}
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60
        ) as r:
            lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "[DONE]"
        return [[c["delta"] for c in json.loads(x)["choices"]] for x in lines[:-1]]

    thread, process = servers
    assert "".join(d.get("content") or "" for ch in chunks(process) for d in ch) == "".join(
        d.get("content") or "" for ch in chunks(thread) for d in ch
    )


def test_a_hang_up_cancels_in_the_engine_process(
    servers: tuple[RemoteServer, RemoteServer],
) -> None:
    """Read to its end, this request takes ~3 s on the mock (450 tokens at 0.01 s a step)."""
    _, process = servers
    body = {"messages": USER, "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream(
        "POST", process.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60
    ) as r:
        for line in r.iter_lines():
            delta = (
                json.loads(line[6:])["choices"][0]["delta"] if line.startswith("data: {") else {}
            )
            if delta.get("content"):
                running = process.metric("num_requests_running")
                break  # hang up mid-stream
    assert running == 1  # the mirror of the child's gauges is live: the answer is being decoded
    deadline = time.time() + 1.0
    while time.time() < deadline and process.metric("num_requests_running") > 0:
        time.sleep(0.02)
    assert process.metric("num_requests_running") == 0  # the child dropped it


def _engine_pid(server_pid: int) -> int:
    for child in Path(f"/proc/{server_pid}/task/{server_pid}/children").read_text().split():
        cmd = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"multiprocessing" in cmd and b"resource_tracker" not in cmd:
            return int(child)
    raise AssertionError("no engine process")


@pytest.mark.slow  # two engine-process servers: ~15 s (make test-slow, CI)
def test_refusals_keep_their_status_and_a_dead_engine_fails_its_requests() -> None:
    """EngineOverloaded raised by ``engine.add`` in the child is the thread design's 503; then the
    child is killed mid-stream: the stream ends with an error event, ``/health`` and new requests
    get 503."""
    server = RemoteServer(
        "--mock", "--mock-step-delay", "0.05", "--max-batch", "1", "--max-waiting", "1",
        "--engine", "process",
    )  # fmt: skip
    try:
        body: dict[str, Any] = {"messages": USER, "max_tokens": 40, "ignore_eos": True}
        with ThreadPoolExecutor(8) as pool:
            codes = sorted(r.status_code for r in pool.map(lambda _: post(server, body), range(8)))
        assert codes[0] == 200 and codes[-1] == 503, codes
        assert set(codes) <= {200, 503}, codes

        body = {"messages": USER, "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60
        ) as r:
            lines: list[str] = []
            for line in r.iter_lines():
                lines.append(line)
                if '"content"' in line and not any('"content"' in ln for ln in lines[:-1]):
                    os.kill(_engine_pid(server.proc.pid), signal.SIGKILL)  # once, mid-stream
        data = [ln for ln in lines if ln.startswith("data: ")]
        assert any('"error"' in ln for ln in data) and data[-1] == "data: [DONE]", data[-3:]
        health = httpx.get(server.url + "/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "engine stopped"
        r = post(server, {"messages": USER})
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable", r.text
    finally:
        server.stop()


@pytest.mark.slow  # re-proves on the real model what the mock tests show (make test-slow)
def test_greedy_replies_equal_the_thread_design_on_the_embedded_model() -> None:
    prompts = ["What is 12 + 30?", "Tell me about rivers.", "Count to ten."]
    replies = []
    for mode in ("thread", "process"):
        server = RemoteServer("--no-ar-twin", "--engine", mode, "--threads", "1")
        try:
            with ThreadPoolExecutor(3) as pool:  # batched together
                out = pool.map(
                    lambda p, server=server: post(
                        server,
                        {"messages": [{"role": "user", "content": p}], "max_tokens": 48,
                         "reasoning_effort": "none", "temperature": 0},
                    ).json()["choices"][0]["message"]["content"],
                    prompts,
                )  # fmt: skip
                replies.append(list(out))
        finally:
            server.stop()
    assert replies[0] == replies[1] and all(replies[0])


@pytest.mark.slow  # an engine-process server and its drain: ~10 s (make test-slow, CI)
def test_ctrl_c_drains_before_the_engine_process_stops() -> None:
    """A terminal's Ctrl-C reaches the server and its engine process alike: the engine ignores it,
    the server drains (the open stream still ends normally), then stops the engine and exits 130 —
    also where it started with SIGINT ignored, as a shell's background job does (uvicorn's re-raise
    of the signal is then ignored too)."""
    ignore = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    server = RemoteServer(
        "--mock", "--mock-step-delay", "0.02", "--engine", "process", preexec_fn=ignore
    )
    engine = _engine_pid(server.proc.pid)
    body = {"messages": USER, "max_tokens": 48, "stream": True, "reasoning_effort": "none"}
    try:
        with httpx.stream(
            "POST", server.url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60
        ) as r:
            lines = r.iter_lines()
            data = [next(ln for ln in lines if ln.startswith("data: "))]
            for pid in (server.proc.pid, engine):
                os.kill(pid, signal.SIGINT)
            data += [ln for ln in lines if ln.startswith("data: ")]
        assert data[-1] == "data: [DONE]" and not any('"error"' in ln for ln in data), data[-3:]
        assert (
            server.proc.wait(20) == 130
        )  # the CLI's exit status for an interrupt, after the drain
        deadline = time.time() + 10
        while time.time() < deadline and Path(f"/proc/{engine}").exists():
            time.sleep(0.1)
        assert not Path(f"/proc/{engine}").exists()  # stopped with its server
    finally:
        server.stop()
