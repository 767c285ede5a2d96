"""One HTTP request carried from the ingress to a model replica, and the app's answer carried back.

The ingress reads the client's request (``ProxiedRequest``) and sends it through a Ray Serve
handle; the replica runs it through its own copy of the OpenAI-compatible app (``call_app``) and
streams back a ``ResponseHead``, the body's chunks as the app sends them, and ``HEARTBEAT`` while
the app is busy and has nothing to send, so the ingress can tell a slow answer from a stuck
replica. No part of this reads the body's meaning but the routing fields."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

HEARTBEAT = b""  # sent while the app is busy and silent; never part of a body
HEARTBEAT_S = 2.0
CANCEL_WAIT_S = 5.0


@dataclass
class ProxiedRequest:
    """``method``, ``path``, ``query`` (bytes), ``headers`` (lower-case name, value pairs) and
    ``body`` of a client's request, with what routers read: ``prompt_token_ids`` (the prompt as
    the model sees it; None when it could not be worked out here, e.g. a malformed body) and
    ``prompt`` (its text, for text-prefix routers such as Ray Serve's
    ``PrefixCacheAffinityRouter``; the method and path for a request without one)."""

    method: str
    path: str
    query: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    prompt: str
    prompt_token_ids: list[int] | None = None
    routing: dict[str, Any] = field(default_factory=dict)  # the router's notes (its hashes)


@dataclass(frozen=True)
class ResponseHead:
    """The status and headers the app answered with."""

    status: int
    headers: list[tuple[bytes, bytes]]


async def call_app(app: Callable[..., Any], request: ProxiedRequest,
                   heartbeat_s: float = HEARTBEAT_S) -> AsyncIterator[ResponseHead | bytes]:
    """Run ``request`` through the ASGI ``app`` in this process: its ``ResponseHead``, then each
    non-empty body chunk, with ``HEARTBEAT`` after every ``heartbeat_s`` of silence. Closing the
    iterator early (the client left) tells the app the client disconnected, then cancels it.
    Whatever the app raises is raised here."""
    sent = asyncio.Queue[dict[str, Any] | None]()
    delivered = False
    finished = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await sent.put(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": request.method, "path": request.path, "raw_path": request.path.encode(),
             "root_path": "", "scheme": "http", "query_string": request.query,
             "headers": request.headers, "client": ("ingress", 0), "server": ("replica", 0)}
    task = asyncio.ensure_future(app(scope, receive, send))
    task.add_done_callback(lambda _: sent.put_nowait(None))
    try:
        while True:
            try:
                message = await asyncio.wait_for(sent.get(), heartbeat_s)
            except asyncio.TimeoutError:
                yield HEARTBEAT
                continue
            if message is None:
                task.result()
                return
            if message["type"] == "http.response.start":
                yield ResponseHead(message["status"], list(message.get("headers", [])))
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    finished.set()
    finally:
        finished.set()
        if not task.done():
            await asyncio.sleep(0)  # let the app see the disconnect first
            task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(task, CANCEL_WAIT_S)
