"""Server-sent events: one event's framing, chat/completion chunks, the guard that turns an error
mid-stream into one error event (the same envelope as an HTTP error), and the response class that
decides admission before its first byte and notices a client going away."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator

import anyio
from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..metrics import Metrics
from .errors import REJECTED, APIError, error_response, internal_error
from .messages import error_envelope


def sse(obj: dict[str, object]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def sse_chunk(
    cid: str, kind: str, created: int, model: str, choice: dict[str, object], include_usage: bool
) -> str:
    """One streamed chunk with a single choice; ``usage: null`` on every chunk when the client asked for
    a usage chunk at the end (the OpenAI convention)."""
    obj: dict[str, object] = {
        "id": cid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if include_usage:
        obj["usage"] = None
    return sse(obj)


def error_events(err: APIError, kind: str) -> list[str]:
    """The stream's last events for an error: the envelope then ``[DONE]`` (chat, completions), or
    the Responses API's typed ``error`` event."""
    if kind == "messages":
        data = error_envelope(err.status, err.message)
        return [f"event: error\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"]
    if kind == "responses":
        e = err.body()["error"]
        data = {
            "type": "error",
            "sequence_number": 0,
            **{k: e[k] for k in ("code", "message", "param")},
        }
        return [f"event: error\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"]
    return [sse(err.body()), "data: [DONE]\n\n"]


async def sse_guard(
    gen: AsyncGenerator[str, None], metrics: Metrics, kind: str = "chat"
) -> AsyncGenerator[str, None]:
    """Wraps a stream: an error mid-stream becomes its error events; a client that goes away (the
    response task is cancelled) closes the inner generator, which cancels the engine requests."""
    finished = False
    try:
        async with contextlib.aclosing(gen) as inner:
            async for chunk in inner:
                yield chunk
        finished = True
    except Exception as e:  # an APIError keeps its message; anything else never shows a traceback
        finished = True
        if isinstance(e, APIError) and e.status in (429, 503):  # refused after the stream began
            metrics.inc("requests_rejected_total", reason="overloaded")
        for ev in error_events(e if isinstance(e, APIError) else internal_error(e), kind):
            yield ev
    finally:
        if not finished:
            metrics.inc("requests_aborted_total")


class SSEResponse(StreamingResponse):
    """A streaming response that always listens for the client going away (Starlette only does so
    for ASGI < 2.4; otherwise it notices on the next failed send, which may be many steps later when
    steps commit no final text). On disconnect the body iterator is cancelled, which cancels the
    engine requests.

    Admission is decided before the first byte: the stream's first chunk is awaited before the
    status line, and the streams yield nothing until every choice has been submitted to the engine
    — so a refusal (a full engine queue) is a real 503/429 with ``Retry-After``, not a 200 whose
    first event is an error."""

    def __init__(
        self, gen: AsyncGenerator[str, None], metrics: Metrics, kind: str = "chat"
    ) -> None:
        super().__init__(
            gen,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self.raw, self.metrics, self.kind = gen, metrics, kind

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tg:

            async def stream() -> None:
                try:
                    first: str | None = await self.raw.__anext__()
                except StopAsyncIteration:
                    first = None
                except APIError as e:
                    if e.status in REJECTED:
                        self.metrics.inc("requests_rejected_total", reason=REJECTED[e.status])
                    await error_response(e)(scope, receive, send)
                    tg.cancel_scope.cancel()
                    return
                self.body_iterator = sse_guard(_resume(first, self.raw), self.metrics, self.kind)
                try:
                    await self.stream_response(send)
                except OSError:
                    pass
                tg.cancel_scope.cancel()

            tg.start_soon(stream)
            await self.listen_for_disconnect(receive)
            tg.cancel_scope.cancel()


async def _resume(first: str | None, rest: AsyncGenerator[str, None]) -> AsyncGenerator[str, None]:
    """The stream again, its first chunk (already awaited) included."""
    async with contextlib.aclosing(rest) as inner:
        if first is not None:
            yield first
            async for chunk in inner:
                yield chunk
