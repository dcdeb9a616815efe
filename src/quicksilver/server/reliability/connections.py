"""Bounded request heads: a connection that does not finish sending a request's headers within
``header_timeout`` seconds is closed.

uvicorn times out only idle keep-alive connections, and only after a first response: a socket that
connects and sends nothing, or half a request line and some headers (a slowloris), holds a
connection and its file descriptor forever, and 64 of them can keep real clients out. uvicorn has no
setting for this, so ``HeadTimeoutH11`` extends its h11 protocol class (passed through
``uvicorn.Config(http=...)``): a deadline starts when the connection opens or, on a kept-alive one,
when the next request's first byte arrives, and it is not pushed back by more bytes — only a
complete head (h11 leaves its ``IDLE`` state) disarms it. The body has its own bound
(``body_timeout``, reliability/lifecycle.py).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("quicksilver.server")


class HeadTimeoutH11(H11Protocol):
    """uvicorn's h11 protocol with a deadline on every request head."""

    header_timeout = 10.0  # seconds; set per server by ``protocol_with_header_timeout``

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _watch_head(self) -> None:
        """Arm the deadline while a head is awaited and none is armed; disarm once one is in."""
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            self._disarm()
        elif self._head_deadline is None and (self.cycle is None or self.cycle.response_complete):
            self._head_deadline = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.info("closing a connection that sent no complete request head in time")
            self.transport.close()


def protocol_with_header_timeout(seconds: float) -> type[HeadTimeoutH11]:
    """The protocol class for one server's ``header_timeout``."""
    return type("HeadTimeoutH11", (HeadTimeoutH11,), {"header_timeout": seconds})
