"""Errors as an OpenAI-compatible server returns them: an ``{"error": {"message", "type", "param",
"code"}}`` object with the status that says whose fault it is. Client input is never a 500: a bad
field is 400 naming it (``param``), a missing or wrong key 401, an unknown model or path 404, a
method the path does not take 405, a body that does not arrive in time 408, a body or prompt over
its limit 413, a body that is not JSON 415, a full queue 429 (with ``Retry-After``), loading or
draining 503."""

from __future__ import annotations

import logging
from typing import Any

from fastapi.responses import JSONResponse

from ..errors import EngineShutdownError, RequestError

log = logging.getLogger("smile_llm.server")

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
    """The API error of what the model raised for a request. A ``RequestError`` (a bad field, a
    constraint the engine could not follow while generating) is 400 naming its ``field``, as the
    API names it (``renames``: ``max_new_tokens`` is ``max_tokens``, the grammar a ``tool_choice``
    forces is the ``tool_choice``'s), the message's leading field renamed alike; a closed or
    draining model is 503. Anything else is the server's own failure, whatever its type: 500, its
    type named and no internals, and logged with its traceback."""
    if isinstance(exc, RequestError):
        field = (renames or {}).get(exc.field, exc.field)
        return ApiError(400, exc.renamed(field), param=field)
    if isinstance(exc, EngineShutdownError):
        return ApiError(503, "the server is shutting down; retry on another replica")
    log.error("a request failed: %s: %s", type(exc).__name__, exc, exc_info=exc)
    return ApiError(500, f"the request failed: {type(exc).__name__}: {exc}")
