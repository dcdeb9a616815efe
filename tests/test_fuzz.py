"""A bounded schemathesis run over the whole OpenAPI surface (the app with the mock engine, in
process): valid and invalid requests generated from the schema; any 5xx fails, and so does a
server-fault error event inside a streamed 200 (after the first chunk an error can only be an
event).

Run with ``make test-fuzz`` (CI runs it after ``make test``). ``FUZZ_EXAMPLES`` sets the examples
per operation and mode (default 60: about 3,000 requests, two minutes on 2 shared cores); every response is
counted and the total printed, so a run can show how many requests it made.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis import GenerationMode

from quicksilver.server import ServerConfig, build_app, build_served_model
from quicksilver.suite.edit_format import CURSOR, NextEditRequest, apply_message, next_edit_message

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "60"))
# small limits keep each generated request cheap on the mock engine, the checks are the same (a
# tool without parameters is a free-form object canvas; at 8 calls of 64 tokens one request took
# ~1,000 steps, 10-13 s on a shared core: past the client's 10 s read timeout)
CFG = ServerConfig(
    mock=True,
    max_tokens=64,
    default_max_tokens=16,
    max_reasoning_tokens=16,
    max_tool_calls=2,
    json_object_tokens=16,
)
APP = build_app(build_served_model(CFG), CFG)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
    max_examples=EXAMPLES,
    no_shrink=True,
)
STATUSES: Counter[int] = Counter()
STREAMS = 0  # 200 responses whose event stream was read for errors


# error codes that mean the server failed, not the request (server/errors.py, generation.py)
SERVER_FAULTS = {"internal_error", "engine_error"}


def stream_faults(body: str) -> list[dict[str, Any]]:
    """The server-fault errors inside a streamed body: the chat/completions envelope
    (``data: {"error": ...}``), the Responses API's ``error`` event, or the Messages API's
    (``{"type": "error", "error": {"type": "api_error", ...}}``: a 500-class failure)."""
    faults = []
    for line in body.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        try:
            obj = json.loads(line[len("data: ") :])
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        err = obj if obj.get("type") == "error" else obj.get("error")
        if isinstance(err, dict) and isinstance(err.get("error"), dict):
            err = (
                {"code": "internal_error", **err["error"]}
                if err["error"].get("type") == "api_error"
                else {}
            )
        if isinstance(err, dict) and err.get("code") in SERVER_FAULTS:
            faults.append(err)
    return faults


def content_type(headers: Any) -> str:
    """The Content-Type of a response whose headers map names to a value or a list of values
    (schemathesis gives lists), whatever the name's case."""
    value = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    return ",".join(value) if isinstance(value, list) else str(value)


def test_content_type_reads_list_valued_headers() -> None:
    assert "text/event-stream" in content_type({"Content-Type": ["text/event-stream"]})
    assert content_type({"content-type": "application/json"}) == "application/json"


def test_stream_faults_sees_errors_inside_a_200_stream() -> None:
    chunk = 'data: {"choices": [{"delta": {"content": "hi"}}]}'
    internal = 'data: {"error": {"message": "internal error: KeyError", "code": "internal_error"}}'
    typed = 'event: error\ndata: {"type": "error", "code": "engine_error", "message": "x"}'
    anthropic = (
        'event: error\ndata: {"type": "error", "error": {"type": "api_error", "message": "x"}}'
    )
    busy = 'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "x"}}'
    refused = 'data: {"error": {"message": "busy", "code": "server_overloaded"}}'
    assert stream_faults("\n\n".join([chunk, "data: [DONE]"])) == []
    assert stream_faults("\n\n".join([chunk, refused, "data: [DONE]"])) == []
    assert len(stream_faults("\n\n".join([chunk, internal, "data: [DONE]"]))) == 1
    assert len(stream_faults("\n\n".join([chunk, typed]))) == 1
    assert len(stream_faults(anthropic)) == 1 and stream_faults(busy) == []


STREAMED = [  # a valid streamed request per streaming route: the check below reads real streams
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
    ("/v1/completions", {"prompt": "hi", "stream": True}),
    ("/v1/responses", {"input": "hi", "stream": True}),
    (
        "/v1/messages",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 32, "stream": True},
    ),
    (
        "/v1/apply/completions",
        {
            "messages": [{"role": "user", "content": apply_message("a = 1", "a = 2")}],
            "stream": True,
        },
    ),
    (
        "/v1/edit/completions",
        {
            "messages": [
                {
                    "role": "user",
                    "content": next_edit_message(
                        NextEditRequest([], "a.py", "", f"a = {CURSOR}1", "", "")
                    ),
                }
            ],
            "stream": True,
        },
    ),
]


def test_the_stream_check_reads_real_streams() -> None:
    """The in-stream check on bodies the fuzz may rarely generate (few random requests are valid
    streams): each streaming route's stream is read, is an event stream, and holds no fault."""
    from fastapi.testclient import TestClient

    with TestClient(APP) as c:
        for path, body in STREAMED:
            r = c.post(path, json=body)
            assert r.status_code == 200 and "text/event-stream" in content_type(r.headers), path
            assert "data: " in r.text and not stream_faults(r.text), (path, r.text[:300])
            assert r.text.count("data: ") >= 3, (path, r.text[:300])


@pytest.fixture(scope="module", autouse=True)
def report() -> object:
    yield
    total = sum(STATUSES.values())
    print(
        f"\nfuzz: {total} requests ({EXAMPLES} examples per operation and mode, "
        f"{STREAMS} streamed bodies read), statuses {dict(sorted(STATUSES.items()))}"
    )


@pytest.mark.fuzz
@schema.parametrize()
@settings(deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx(case: schemathesis.Case) -> None:
    global STREAMS
    response = case.call()
    STATUSES[response.status_code] += 1
    assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
    if "text/event-stream" in content_type(response.headers):
        STREAMS += 1
        faults = stream_faults(response.text)
        assert not faults, (case.as_curl_command(), faults)
