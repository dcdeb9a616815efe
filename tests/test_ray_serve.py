"""``serve --replicas 2`` on a local Ray instance: two CPU replicas of the embedded model behind one
endpoint, driven by the official ``openai`` client. Both replicas serve; temperature-0 answers equal
the single-process server's; a conversation's turns stay on one replica while different ones
spread; a cancelled stream frees its replica; the API key holds; shutdown is clean. Bounded: one
Ray start for the module (about 15 s of the 60 s budget)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from inprocess import serving
from quicksilver.server.config import ServerConfig
from quicksilver.server.scale import ray_serve  # ray[serve] is in [dev]: `make test` installs it

KEY = "ray-key"
SYSTEM = "You are a careful assistant. Answer briefly and use the tools when they help. " * 3
TAG = "x-quicksilver-replica"
pytestmark = pytest.mark.timeout(120)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cfg(**kw: Any) -> ServerConfig:
    return ServerConfig(ar_twin=False, threads=1, api_key=KEY, **kw)


@pytest.fixture(scope="module")
def ray_url() -> Iterator[str]:
    port = _port()
    t0 = time.perf_counter()
    ray_serve.start(_cfg(replicas=2, port=port))
    assert time.perf_counter() - t0 < 45, "Ray Serve took too long to come up"
    yield f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    ray_serve.stop()
    assert time.perf_counter() - t0 < 20
    with pytest.raises(httpx.HTTPError):  # nothing listens any more: the shutdown was clean
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=60)


async def _chat(client: openai.AsyncOpenAI, messages: list[Any]) -> tuple[str, str]:
    raw = await client.chat.completions.with_raw_response.create(
        model="quicksilver", messages=messages, max_tokens=12, temperature=0
    )
    return raw.parse().choices[0].message.content or "", raw.headers.get(TAG, "")


def _conversation(i: int) -> list[Any]:
    return [
        {"role": "system", "content": f"Conversation {i}. {SYSTEM}"},
        {"role": "user", "content": f"What is {i} plus {i + 3}?"},
    ]


@pytest.mark.slow  # a Ray cluster: ~30 s to start (make test-slow, CI)
def test_replicas_answer_like_one_process_and_route_by_prefix(ray_url: str) -> None:
    prompts = [_conversation(i) for i in range(8)]

    async def spread() -> list[tuple[str, str]]:
        client = _client(ray_url)
        return list(await asyncio.gather(*(_chat(client, m) for m in prompts)))

    served = asyncio.run(spread())
    assert len({tag for _, tag in served}) == 2, (
        "both replicas serve; different conversations spread"
    )
    with serving(_cfg()) as one:

        async def single() -> list[str]:
            client = _client(one)
            return [(await _chat(client, m))[0] for m in prompts[:4]]

        reference = asyncio.run(single())
    assert [text for text, _ in served[:4]] == reference  # temperature 0: same answers as 1 process

    async def turns() -> set[str]:
        client, messages, tags = _client(ray_url), _conversation(100), set()
        for turn in range(3):
            text, tag = await _chat(client, messages)
            tags.add(tag)
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": f"And now turn {turn}?"},
            ]
        return tags

    assert len(asyncio.run(turns())) == 1, "a conversation's turns stay on one replica"


def _replica_metrics(url: str, tag: str) -> str:
    """/metrics of replica ``tag`` (the router sends idle probes to either replica)."""
    for _ in range(40):
        r = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        if r.headers[TAG] == tag:
            return r.text
    raise AssertionError(f"/metrics never reached replica {tag}")


def _value(metrics: str, name: str) -> float:
    m = re.search(rf"^quicksilver:{name}\{{[^}}]*\}} (\S+)$", metrics, re.M)
    return float(m.group(1)) if m else 0.0


@pytest.mark.slow  # the same Ray cluster (make test-slow, CI)
def test_cancelled_stream_frees_its_replica_and_key_holds(ray_url: str) -> None:
    assert httpx.get(ray_url + "/health").status_code == 200  # open route
    denied = httpx.post(ray_url + "/v1/chat/completions", json={"messages": []})
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    body = {
        "model": "quicksilver",
        "messages": [{"role": "user", "content": "Write a long story about a lighthouse."}],
        "max_tokens": 320,
        "ignore_eos": True,  # runs until cancelled (seconds), never ends early on its own
        "temperature": 0,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream(
        "POST", ray_url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    ) as r:
        tag = r.headers[TAG]
        next(r.iter_lines())  # the stream has started; the client leaves
    deadline = time.time() + 20
    while True:
        text = _replica_metrics(ray_url, tag)
        if (
            _value(text, "requests_aborted_total") >= 1
            and _value(text, "num_requests_running") == 0
        ):
            break
        held = [ln for ln in text.splitlines() if "aborted" in ln or "running" in ln]
        assert time.time() < deadline, f"the cancelled request still holds its replica: {held}"
        time.sleep(0.5)


def test_bad_scale_out_flags_are_one_line_errors() -> None:
    from quicksilver.errors import QuicksilverError

    with pytest.raises(QuicksilverError, match="--routing must be one of"):
        ray_serve.build_ray_app(_cfg(replicas=2, routing="nearest"))
    with pytest.raises(QuicksilverError, match="does not combine with --replicas"):
        ray_serve.build_ray_app(_cfg(replicas=2, tensor_parallel=2))
    with pytest.raises(QuicksilverError, match="--min-replicas"):
        ray_serve.build_ray_app(_cfg(replicas=2, min_replicas=5, max_replicas=3))
    auto = ray_serve._scaling(_cfg(replicas=2, min_replicas=1, max_replicas=8))
    assert auto["autoscaling_config"]["initial_replicas"] == 2
