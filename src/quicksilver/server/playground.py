"""The playground and the rules for browsers.

``router`` serves one page at ``/`` and ``/playground`` and its two assets under ``/playground/``,
all shipped inside the package (``static/``): no build step, nothing fetched from anywhere else
(the page's Content-Security-Policy allows its own origin only). The page holds no secret, so these
paths are open without the API key (``is_public``); the API calls it makes send the key the person
types in.

``install_browser_rules`` decides which web pages may call the API: the server's own origin always,
the ``--allowed-origins`` list through CORS (Starlette's ``CORSMiddleware``), and any other request
that carries an ``Origin`` header gets 403 in the OpenAI envelope before it reaches a route, so a
page elsewhere cannot spend this server's compute through a visitor's browser.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from .protocol.errors import APIError, error_response

STATIC = Path(__file__).parent / "static"
PAGE = "playground.html"
ASSETS = {
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
}
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


def is_public(path: str) -> bool:
    """The page and its assets need no API key (they hold none)."""
    return path in ("/", "/playground") or path.startswith("/playground/")


@router.get("/")
@router.get("/playground")
async def page() -> FileResponse:
    return FileResponse(STATIC / PAGE, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


@router.get("/playground/{name}")
async def asset(name: str) -> FileResponse:
    if name not in ASSETS:
        raise APIError(404, f"no playground asset {name!r}", "not_found_error")
    return FileResponse(STATIC / name, media_type=ASSETS[name], headers=PAGE_HEADERS)


def parse_origins(value: str | None) -> list[str]:
    """``--allowed-origins`` as a list: comma-separated, trailing slashes dropped; ``*`` is any."""
    return [o.strip().rstrip("/") for o in (value or "").split(",") if o.strip()]


def same_origin(origin: str, host: str) -> bool:
    """The page was served by this server (scheme aside: a TLS proxy may sit in front)."""
    return bool(host) and urlsplit(origin).netloc.lower() == host.lower()


class OriginCheck:
    """Pure ASGI middleware: a request with an ``Origin`` that is neither this server's nor allowed
    gets 403 (preflights included)."""

    def __init__(self, app: ASGIApp, allowed: list[str]) -> None:
        self.app, self.allowed = app, allowed

    def permits(self, origin: str, host: str) -> bool:
        return "*" in self.allowed or origin in self.allowed or same_origin(origin, host)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers", []))
            origin = headers.get(b"origin", b"").decode("latin-1")
            host = headers.get(b"host", b"").decode("latin-1")
            if origin and not self.permits(origin.rstrip("/"), host):
                err = APIError(
                    403,
                    f"cross-origin requests from {origin} are not allowed (see --allowed-origins)",
                    "invalid_request_error",
                    None,
                    "origin_not_allowed",
                )
                await error_response(err)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install_browser_rules(app: FastAPI, allowed_origins: str | None) -> None:
    """CORS for the allowed origins, then the origin check outside it (added last: runs first)."""
    allowed = parse_origins(allowed_origins)
    if allowed:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=allowed,
            allow_methods=["GET", "POST", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
            max_age=600,
        )
    app.add_middleware(OriginCheck, allowed=allowed)
