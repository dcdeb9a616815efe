"""Errors in the OpenAI envelope ``{"error": {"message", "type", "param", "code"}}`` with their status."""

from __future__ import annotations

import re
from typing import Any

from fastapi.responses import JSONResponse

REJECTED = {400: "invalid", 429: "too_many", 503: "overloaded"}  # APIError status -> reason counted
_ADDR = re.compile(r" at 0x[0-9a-fA-F]+")


class APIError(Exception):
    """An error that becomes one HTTP response (or one SSE error event mid-stream)."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(
    message: str, type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {
        "error": {"message": _ADDR.sub("", message), "type": type, "param": param, "code": code}
    }


def error_response(err: APIError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def overloaded(message: str) -> APIError:
    return APIError(503, message, "server_error", None, "server_overloaded", {"Retry-After": "1"})


def too_many(message: str) -> APIError:
    return APIError(
        429, message, "rate_limit_error", None, "rate_limit_exceeded", {"Retry-After": "1"}
    )


def internal_error(e: BaseException) -> APIError:
    """An unexpected failure, named by its type only (never a traceback or a message with paths)."""
    return APIError(
        500, f"internal error: {type(e).__name__}", "server_error", None, "internal_error"
    )
