"""The suite scored through the server's own request paths: tool calls (``quicksilver eval
--tool-choice``) and edits (``quicksilver eval --routes``).

The task suite's ``tool_call`` verifier normally scores the decoder's raw reply. An agent reaches the
model through ``/v1/chat/completions`` instead, where ``tool_choice: "required"`` (or a named
function) decodes the call on a structured canvas — the call's skeleton is fixed and only the
name and argument slots are decoded, grammar-checked against the tools' JSON schemas — while
``"auto"`` parses whatever the model wrote. This runs the held-out ``call`` turns through the real
app in-process (FastAPI's test client: no socket, same code as ``quicksilver serve``) and scores
the returned ``tool_calls`` with the same verifier.

The edit tasks go to Mercury Edit's routes (``/v1/apply/completions``, ``/v1/edit/completions``) on
the app ``make run`` serves: the default model with its companions, so a request naming no model
reaches the edit model, as a client's would. The reply the route returns (unwrapped) is what the
task's verifier scores; tokens per pass and tok/s are the route's own.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..server import ServerConfig, build_app, build_served_model
from ..server.twin import build_companions
from ..suite.render import to_openai_messages
from ..suite.tasks import get_task
from ..suite.tasks.tool_call import ToolCall

CHOICES = ("auto", "required")


def reply_from_message(message: dict[str, Any]) -> str:
    """The assistant message as the task's reply text: its calls in the model's tag format, then
    any content (the verifier accepts a call turn only if nothing but one call is there)."""
    calls = "".join(
        f'<tool_call>{{"name": {json.dumps(c["function"]["name"])}, '
        f'"arguments": {c["function"]["arguments"] or "{}"}}}</tool_call>'
        for c in message.get("tool_calls") or []
    )
    return calls + (message.get("content") or "")


def served_tool_calls(
    model: str | Path,
    choice: str,
    limit: int,
    seed: int,
    threshold: float = 0.9,
    phrasing: str = "templated",
) -> dict[str, Any]:
    """Accuracy and parseable rate of the held-out call turns served with ``tool_choice=choice``."""
    from fastapi.testclient import TestClient

    if choice not in CHOICES:
        raise ConfigError(f"--tool-choice must be one of {', '.join(CHOICES)}, got {choice!r}")
    task = get_task("tool_call")
    assert isinstance(task, ToolCall)  # its parseable() scores a call turn
    items = [it for it in task.test_items(limit, seed, phrasing) if it.stratum == "call"]
    cfg = ServerConfig(model=str(model))
    served = build_served_model(cfg)
    if served.attention == "causal":
        raise ConfigError(
            "--tool-choice evaluates the served diffusion decoder; this is an AR model"
        )
    correct = parseable = failed = 0
    with TestClient(build_app(served, cfg)) as client:
        for it in items:
            body = {
                "model": served.name,
                "messages": to_openai_messages(it.messages or []),
                "tools": it.tools,
                "tool_choice": choice,
                "temperature": 0,
                "reasoning_effort": "none",
                "parallel_tool_calls": False,  # a call turn of the task is exactly one call
                "threshold": threshold,
            }
            r = client.post("/v1/chat/completions", json=body)
            if r.status_code != 200:
                failed += 1
                continue
            reply = reply_from_message(r.json()["choices"][0]["message"])
            correct += bool(task.verify(it, reply))
            parseable += bool(task.parseable(it, reply))
    n = max(len(items), 1)
    return {
        "tool_choice": choice,
        "n": len(items),
        "accuracy": correct / n,
        "parseable": parseable / n,
        "failed": failed,
        "threshold": threshold,
    }


# the edit tasks and the route each is served on
EDIT_ROUTES = {
    "apply_edit": "/v1/apply/completions",
    "apply_edit_made_up": "/v1/apply/completions",
    "next_edit": "/v1/edit/completions",
    "next_edit_made_up": "/v1/edit/completions",
}


def edit_body(messages: list[dict[str, Any]], max_tokens: int, model: str | None) -> dict[str, Any]:
    """An edit route's request for a task's chat prompt: the user message alone (the route keeps
    the system prompt), greedy."""
    user = [m for m in to_openai_messages(messages) if m["role"] == "user"]
    body: dict[str, Any] = {"messages": user, "max_tokens": max_tokens, "temperature": 0}
    return body | ({"model": model} if model else {})


def served_edits(
    tasks: list[str],
    limit: int,
    seed: int,
    phrasing: str = "templated",
    model: str | None = None,
    checkpoint: str | Path | None = None,
) -> dict[str, dict[str, Any]]:
    """Exact-match accuracy, tokens per pass and tok/s per request of the edit tasks through their
    routes, on the server ``checkpoint`` makes (default: the embedded models, as ``make run``),
    each request naming ``model`` (default: none, the route's own choice)."""
    from fastapi.testclient import TestClient

    unknown = [t for t in tasks if t not in EDIT_ROUTES]
    if unknown:
        raise ConfigError(f"--routes scores {', '.join(EDIT_ROUTES)}; not {', '.join(unknown)}")
    cfg = ServerConfig(model=str(checkpoint) if checkpoint else None)
    served = build_served_model(cfg)
    app = build_app(served, cfg, build_companions(cfg, served.name))
    out: dict[str, dict[str, Any]] = {}
    with TestClient(app) as client:
        for name in tasks:
            out[name] = _route_scores(client, name, limit, seed, phrasing, model)
    return out


def _route_scores(
    client: Any, name: str, limit: int, seed: int, phrasing: str, model: str | None
) -> dict[str, Any]:
    task = get_task(name)
    items = [it for it in task.test_items(limit, seed, phrasing) if it.is_chat]
    correct = failed = tokens = nfe = 0
    speeds: list[float] = []
    served_by = ""
    for it in items:
        t0 = time.perf_counter()
        body = edit_body(it.messages or [], task.max_answer_tokens + 8, model)
        r = client.post(EDIT_ROUTES[name], json=body)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            failed += 1
            continue
        rep = r.json()
        served_by = rep["model"]
        correct += bool(task.verify(it, rep["choices"][0]["message"]["content"] or ""))
        tokens += rep["usage"]["completion_tokens"]
        nfe += rep["diffusion"]["nfe"]
        speeds.append(rep["usage"]["completion_tokens"] / dt)
    speeds.sort()
    return {
        "n": len(items),
        "accuracy": correct / max(len(items), 1),
        "failed": failed,
        "tpf": round(tokens / nfe, 2) if nfe else 0.0,
        "tok_s_median": round(speeds[len(speeds) // 2], 1) if speeds else 0.0,
        "model": served_by,
        "phrasing": phrasing,
    }
