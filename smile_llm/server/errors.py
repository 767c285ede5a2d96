"""Errors as an OpenAI-compatible server returns them: an ``{"error": {"message", "type", "param",
"code"}}`` object with the status that says whose fault it is. Client input is never a 500: a bad
field is 400 naming it (``param``), a missing or wrong key 401, an unknown model or path 404, a
method the path does not take 405, a body that does not arrive in time 408, a body or prompt over
its limit 413, a body that is not JSON 415, a full queue 429 (with ``Retry-After``), loading or
draining 503."""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from ..errors import ConstraintError, EngineShutdownError, RequestTypeError

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
         415: "invalid_request_error", 429: "rate_limit_error", 499: "invalid_request_error",
         503: "service_unavailable", 500: "server_error"}


class ApiError(Exception):
    """An error the server answers with ``status`` and an OpenAI error object; ``param`` names the
    request field at fault, ``headers`` go with the response (``Retry-After``)."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_model_error(exc: BaseException, renames: dict[str, str] | None = None) -> ApiError:
    """The API error of what the model raised for a request: a bad field (ValueError, TypeError,
    ConstraintError with its field, a constraint the engine could not follow while generating) is
    400, a closed or draining model 503; anything else is the server's own failure (500, its type
    named, no internals). ``renames``: request fields named otherwise in the API (the grammar a
    ``tool_choice`` forces is the ``tool_choice``'s)."""
    if isinstance(exc, ConstraintError):
        field = (renames or {}).get(exc.field, exc.field)
        message = str(exc)
        if field != exc.field and message.startswith(exc.field + ":"):
            message = field + message[len(exc.field):]
        return ApiError(400, message, param=field)
    if isinstance(exc, (ValueError, RequestTypeError, TypeError)):
        return ApiError(400, str(exc), param=field_of(str(exc)))
    if isinstance(exc, EngineShutdownError):
        return ApiError(503, "the server is shutting down; retry on another replica")
    return ApiError(500, f"the request failed: {type(exc).__name__}: {exc}")


def field_of(message: str) -> str | None:
    """The field a model error message starts with (``"temperature must be ..."``), if any."""
    head = message.split(" ", 1)[0].rstrip(":")
    return head if head.replace("_", "").isalnum() and head.islower() else None
