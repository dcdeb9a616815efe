"""Tool calls scored through the server's own request path (``quicksilver eval --tool-choice``).

The task suite's ``tool_call`` verifier normally scores the decoder's raw reply. An agent reaches the
model through ``/v1/chat/completions`` instead, where ``tool_choice: "required"`` (or a named
function) decodes the call on a structured canvas — the call's skeleton is fixed and only the
name and argument slots are decoded, grammar-checked against the tools' JSON schemas — while
``"auto"`` parses whatever the model wrote. This runs the held-out ``call`` turns through the real
app in-process (FastAPI's test client: no socket, same code as ``quicksilver serve``) and scores
the returned ``tool_calls`` with the same verifier.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..server import ServerConfig, build_app, build_served_model
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
