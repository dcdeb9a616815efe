"""Every HTTP request's life in one pure-ASGI middleware: admission, body, deadline, drain, crash.

In order, for each request:

1. **Draining** (after SIGTERM/SIGINT): a new generating request gets 503 + ``Retry-After``.
2. **Body**: read whole before any slot is taken, within ``body_timeout`` seconds (408 after; a
   socket that sends headers and no body holds nothing but its socket) and ``max_body_bytes``
   (413, also for chunked bodies that declare no length).
3. **Admission**: at most ``max_concurrent`` generating requests are open (429 + ``Retry-After``).
4. **Deadline**: the app runs in a cancel scope that ends it after ``request_timeout`` seconds, or
   when a drain runs out of time. Cancelling frees the engine requests (the handlers' ``finally``
   cancel them). The client still gets a proper ending: a 504/503 envelope if nothing was sent
   yet, or — mid-stream — one SSE error event and ``data: [DONE]``.
5. **Crash**: an exception nothing handled becomes an enveloped 500 (or an error event mid-stream),
   logged once with the request id; the connection stays usable.

Every refusal is counted in ``requests_rejected_total`` with its reason.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from typing import Any

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..config import ServerConfig
from ..metrics import Metrics
from ..protocol.errors import APIError, error_response, too_many
from .drain import Drain, InFlight, draining_error

log = logging.getLogger("quicksilver.server")
BODY_METHODS = ("POST", "PUT", "PATCH")


class _Disconnected(Exception):
    """The client went away while its body was being read."""


def _too_large(limit: int) -> APIError:
    return APIError(
        413,
        f"the request body is larger than {limit} bytes",
        "invalid_request_error",
        None,
        "request_too_large",
    )


def _ended(reason: str, timeout: float) -> APIError:
    if reason == "shutdown":
        return draining_error()
    return APIError(
        504,
        f"the request ran past this server's request timeout of {timeout:g} s",
        "server_error",
        None,
        "request_timeout",
    )


def _crash(rid: str, exc: BaseException) -> APIError:
    return APIError(
        500,
        f"internal error: {type(exc).__name__} (request id {rid})",
        "server_error",
        None,
        "internal_error",
    )


class Lifecycle:
    """The middleware (``state``: the app's ``ServerState``, for its drain and metrics)."""

    def __init__(self, app: ASGIApp, config: ServerConfig, state: Any) -> None:
        self.app, self.cfg = app, config
        self.drain: Drain = state.drain
        self.metrics: Metrics = state.metrics

    def reject(self, reason: str) -> None:
        self.metrics.inc("requests_rejected_total", reason=reason)

    async def _body(self, receive: Receive) -> bytes:
        limit, parts, seen = self.cfg.max_body_bytes, [], 0
        with anyio.fail_after(self.cfg.body_timeout):
            while True:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    raise _Disconnected
                chunk = msg.get("body", b"")
                seen += len(chunk)
                if seen > limit:
                    raise _too_large(limit)
                parts.append(chunk)
                if not msg.get("more_body", False):
                    return b"".join(parts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        state = scope.setdefault("state", {})  # the Guard's id when it ran first (the app's order)
        rid = state.get("request_id") or headers.get(b"x-request-id", b"").decode("latin-1")[:64]
        rid = state["request_id"] = rid or uuid.uuid4().hex
        generating = scope["method"] == "POST" and scope["path"].startswith("/v1/")
        if generating and self.drain.draining:
            self.reject("draining")
            await error_response(draining_error())(scope, receive, send)
            return
        if scope["method"] in BODY_METHODS:
            try:
                declared = int(headers.get(b"content-length", b"0") or 0)
            except ValueError:
                declared = 0
            try:
                if declared > self.cfg.max_body_bytes:
                    raise _too_large(self.cfg.max_body_bytes)
                body = await self._body(receive)
            except _Disconnected:
                return
            except APIError as e:
                self.reject("too_large")
                await error_response(e)(scope, receive, send)
                return
            except TimeoutError:
                self.reject("body_timeout")
                msg = f"the request body did not arrive within {self.cfg.body_timeout:g} s"
                await error_response(APIError(408, msg, code="request_timeout"))(
                    scope, receive, send
                )
                return
            receive = replay(body, receive)
        if not generating:
            await self._run(scope, receive, send, rid)
            return
        if len(self.drain.inflight) >= self.cfg.max_concurrent:
            self.reject("too_many")
            open_now = len(self.drain.inflight)
            await error_response(
                too_many(f"{open_now} requests are open; the limit is {self.cfg.max_concurrent}")
            )(scope, receive, send)
            return
        await self._run(scope, receive, send, rid, track=True)

    async def _run(
        self, scope: Scope, receive: Receive, send: Send, rid: str, track: bool = False
    ) -> None:
        started, sse, finished = False, False, False

        async def watched(msg: Message) -> None:
            nonlocal started, sse, finished
            if msg["type"] == "http.response.start":
                started = True
                ctype = dict(msg.get("headers", [])).get(b"content-type", b"")
                sse = ctype.startswith(b"text/event-stream")
            elif msg["type"] == "http.response.body" and not msg.get("more_body", False):
                finished = True
            await send(msg)

        timeout = self.cfg.request_timeout if track else 0.0
        cancel = anyio.CancelScope(deadline=anyio.current_time() + timeout if timeout else math.inf)
        flight = InFlight(cancel)
        if track:
            self.drain.inflight.add(flight)
        error: APIError | None = None
        try:
            with cancel:
                await self.app(scope, receive, watched)
            if cancel.cancelled_caught:
                reason = flight.ended_by or "timeout"
                self.reject("shutdown" if reason == "shutdown" else "timeout")
                error = _ended(reason, timeout)
        except Exception as e:  # the catch-all: logged once, answered in the envelope
            log.error("request %s failed", rid, exc_info=e)
            error = _crash(rid, e)
        finally:
            if track:
                self.drain.inflight.discard(flight)
        if error is None or finished:
            return
        try:
            if not started:
                await error_response(error)(scope, receive, send)
            elif sse:  # (a started JSON response just ends: uvicorn closes the connection)
                event = f"data: {json.dumps(error.body())}\n\ndata: [DONE]\n\n".encode()
                await send({"type": "http.response.body", "body": event, "more_body": False})
        except OSError:
            pass  # the client is gone as well


def replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the body already read, then the client's later messages
    (the disconnect the handlers listen for)."""
    sent = False

    async def inner() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return inner
