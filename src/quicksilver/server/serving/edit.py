"""Mercury Edit's routes on the chat path: ``/v1/apply/completions`` and ``/v1/edit/completions``.

An edit request becomes the chat completion it means (``EditServing.to_chat``): the route's system
prompt (kept server-side, ``suite/edit_format.py``), the one user message with its sections parsed
and rendered again in the layout the model was trained on (text outside the sections is dropped; a
missing section is a 400 naming it), no tools and no reasoning phase (``reasoning_effort: none``).
The chat serving plans and runs it, so streaming, usage, limits, cancellation, the prefix cache and
the ``diffusing`` view are chat's. Replies are the bare code: a reply the model wrapped in
``<|updated_code|>`` ... ``<|/updated_code|>`` loses the wrapper (``Unwrap``), in the JSON response
and in the stream alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from ...suite.edit_format import (
    APPLY_SYSTEM,
    NEXT_EDIT_SYSTEM,
    UPDATED,
    FormatError,
    apply_message,
    next_edit_message,
    parse_apply,
    parse_next_edit,
)
from ..protocol.chat import ChatCompletionRequest, TextPart
from ..protocol.edit import EditCompletionRequest
from ..protocol.errors import bad_request
from ..protocol.sse import sse
from .chat import OpenAIServingChat, chat_request

OPEN, CLOSE = f"<|{UPDATED}|>", f"<|/{UPDATED}|>"


def _apply(text: str) -> str:
    r = parse_apply(text)
    return apply_message(r.original, r.update)


@dataclass(frozen=True)
class EditRoute:
    """One edit route: its metrics label, its system prompt, its user message re-rendered from
    the parsed sections (``FormatError`` names a missing one), and the sampling settings a request
    that is silent on them gets."""

    endpoint: str
    system: str
    render: Callable[[str], str]
    defaults: dict[str, float]


# Inception's documented defaults for mercury-edit (../shared/reference/edit_endpoints.md); its
# presence_penalty (1.0 on next-edit) is not applied: no decoder here has penalties
APPLY = EditRoute("apply", APPLY_SYSTEM, _apply, {"temperature": 0.0, "top_p": 1.0})
NEXT_EDIT = EditRoute(
    "edit",
    NEXT_EDIT_SYSTEM,
    lambda t: next_edit_message(parse_next_edit(t)),
    {"temperature": 0.3, "top_p": 0.8},
)
PASSED = set(EditCompletionRequest.model_fields) - {"messages"}  # the fields chat reads as is
# Inception's ids for its edit model: on these routes they name whichever model edits here
EDIT_ALIASES = ("mercury-edit", "mercury-edit-2")


def _text(content: str | list[TextPart] | None, where: str) -> str:
    if isinstance(content, str):
        return content
    for j, p in enumerate(content or []):
        if p.type != "text" or p.text is None:
            raise bad_request(
                f"content parts of type {p.type!r} are not supported", f"{where}[{j}]"
            )
    return "".join(p.text or "" for p in content or [])


class Unwrap:
    """One choice's reply without an ``<|updated_code|>`` wrapper, fed as it streams: text is held
    back only while it may still be the opening tag (at the start) or the closing one (at the end).
    On a complete reply it agrees with ``edit_format.strip_wrapper``; a wrapped reply cut short
    (``length``) loses its opening tag too, and anything after a closing tag is dropped."""

    def __init__(self) -> None:
        self.buf = ""
        self.wrapped: bool | None = None  # None: not decided yet
        self.closed = False

    def feed(self, text: str) -> str:
        self.buf += text
        if self.wrapped is None:
            s = self.buf.lstrip()
            if len(s) <= len(OPEN) and OPEN.startswith(s):
                return ""  # still maybe the opening tag (or the newline after it)
            self.wrapped = s.startswith(OPEN)
            if not self.wrapped:
                out, self.buf = self.buf, ""
                return out
            self.buf = s[len(OPEN) :].removeprefix("\n")
        return self._body()

    def _body(self) -> str:
        if self.closed:
            self.buf = ""
            return ""
        at = self.buf.find(CLOSE)
        if at >= 0:
            out, self.buf, self.closed = self.buf[:at].removesuffix("\n"), "", True
            return out
        keep = next(
            (
                k
                for k in range(min(len(self.buf), len(CLOSE) + 1), 0, -1)
                if ("\n" + CLOSE).startswith(self.buf[-k:]) or CLOSE.startswith(self.buf[-k:])
            ),
            0,
        )
        out, self.buf = self.buf[: len(self.buf) - keep], self.buf[len(self.buf) - keep :]
        return out

    def end(self) -> str:
        """What is still held back when the choice finishes."""
        out = self.buf
        if self.closed or (self.wrapped is None and out.lstrip() == OPEN):
            out = ""
        self.buf = ""
        return out


def unwrap(text: str) -> str:
    u = Unwrap()
    return u.feed(text) + u.end()


class EditServing:
    """Builds on the chat serving: the same planner and runners, the chat completion's shapes."""

    def __init__(self, chat: OpenAIServingChat) -> None:
        self.chat = chat

    def to_chat(self, req: EditCompletionRequest, route: EditRoute) -> ChatCompletionRequest:
        """The request as the chat completion it is planned as (a 400 for a message it cannot
        carry: not exactly one user message, a missing section)."""
        roles = [m.role for m in req.messages]
        if roles != ["user"]:
            raise bad_request(
                f"send exactly one user message holding the tagged sections, got roles {roles} "
                "(the system prompt is kept server-side)",
                "messages",
            )
        where = "messages[0].content"
        try:
            text = route.render(_text(req.messages[0].content, where))
        except FormatError as e:
            raise bad_request(str(e), where, "missing_section") from None
        body = req.model_dump(include=PASSED) | {
            "messages": [
                {"role": "system", "content": route.system},
                {"role": "user", "content": text},
            ],
            "reasoning_effort": "none",
        }
        for key, value in route.defaults.items():
            if body.get(key) is None:
                body[key] = value
        if body.get("model") in EDIT_ALIASES:
            body["model"] = None  # the serving picked for the alias answers it
        return chat_request(body, "messages")

    async def create(
        self, req: EditCompletionRequest, route: EditRoute, arrival: float
    ) -> dict[str, Any]:
        chat = await asyncio.to_thread(self.to_chat, req, route)
        out = await self.chat.create(chat, arrival)
        for ch in out["choices"]:
            msg = ch["message"]
            if isinstance(msg.get("content"), str):
                msg["content"] = unwrap(msg["content"])
        return out

    def stream(
        self, req: EditCompletionRequest, route: EditRoute, arrival: float
    ) -> AsyncGenerator[str, None]:
        return self._unwrapped(self.chat.stream(self.to_chat(req, route), arrival))

    async def _unwrapped(self, events: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
        """Chat's stream with each choice's content deltas through its ``Unwrap``; what one holds
        back comes out as a content chunk just before that choice's finishing chunk."""
        cuts: dict[int, Unwrap] = {}
        async with contextlib.aclosing(events) as inner:
            async for ev in inner:
                obj = json.loads(ev[6:]) if ev.startswith("data: {") else {}
                if not obj.get("choices"):  # [DONE], usage, errors
                    yield ev
                    continue
                ch = obj["choices"][0]
                cut = cuts.setdefault(ch["index"], Unwrap())
                delta = ch.get("delta") or {}
                if "content" in delta and "role" not in delta:
                    delta["content"] = cut.feed(delta["content"])
                    if delta["content"]:
                        yield sse(obj)
                    continue
                if ch.get("finish_reason") is not None and (rest := cut.end()):
                    held = {"index": ch["index"], "delta": {"content": rest}, "logprobs": None}
                    yield sse(obj | {"choices": [held | {"finish_reason": None}]})
                yield ev
