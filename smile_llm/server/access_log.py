"""The server's request ids and access log, as a plain ASGI middleware (``RequestLog``), and the
loggers' handlers (``configure_logging``).

A plain ASGI middleware, not Starlette's ``BaseHTTPMiddleware``: that one hands the app a receive
channel of its own, on which ``Request.is_disconnected()`` never turns true, so a request whose
client left would run to its end. This one passes the connection's own channel through.

Each request gets an id (its ``X-Request-Id`` header when it has one, else a new one) in
``scope["state"]["rid"]`` (``request.state.rid``) and on the response's ``X-Request-Id``; a failure
of the app's own (an exception no handler answered) becomes a 500 OpenAI error object and is
logged with its traceback. When the response ends, logger ``smile_llm.server.access`` writes one
JSON line: ``{"request_id", "method", "path", "status", "seconds"}``.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import uuid
from typing import Any

from .errors import ApiError

log = logging.getLogger("smile_llm.server")
access = logging.getLogger("smile_llm.server.access")
Scope = dict[str, Any]


class RequestLog:
    """ASGI middleware: request ids, the access log and a 500 for a failure of the app's own."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        rid = headers.get(b"x-request-id", b"").decode("latin-1")[:128] or uuid.uuid4().hex
        scope.setdefault("state", {})["rid"] = rid
        t0 = time.perf_counter()
        status = [0]

        async def send_with_id(message: Any) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = [*message.get("headers", ()),
                                      (b"x-request-id", rid.encode("latin-1"))]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:  # noqa: BLE001 - a bug of ours: a 500 error object, logged
            log.exception("request %s failed", rid)
            if status[0] == 0:
                error = ApiError(500, f"internal error: {type(exc).__name__}")
                await error.response()(scope, receive, send_with_id)
        finally:
            access.info(json.dumps({"request_id": rid, "method": scope.get("method"),
                                    "path": scope.get("path"), "status": status[0] or None,
                                    "seconds": round(time.perf_counter() - t0, 4)}))


def configure_logging(level: str) -> None:
    """Give the server's loggers a handler on standard error at ``level`` (uvicorn configures
    only its own): ``smile_llm.server`` as ``LEVEL: message``, and the access log
    (``smile_llm.server.access``) as bare JSON lines. Idempotent."""
    numeric = logging.getLevelName(level.upper()) if isinstance(level, str) else level
    if not isinstance(numeric, int):
        numeric = logging.INFO
    for logger, fmt in ((log, "%(levelname)s:     %(message)s"), (access, "%(message)s")):
        logger.setLevel(numeric)
        if not any(getattr(h, "smile_llm", False) for h in logger.handlers):
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter(fmt))
            handler.smile_llm = True  # type: ignore[attr-defined]
            logger.addHandler(handler)
    access.propagate = False
