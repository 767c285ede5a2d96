"""How the server accepts HTTP connections: uvicorn's h11 protocol with the bounds a server facing
the network needs (``uvicorn_config``).

**Why h11.** Java's own ``java.net.http.HttpClient`` at its defaults (what LangChain4j and Spring AI
use) offers an HTTP/2 upgrade on every plain ``http://`` request: ``Connection: Upgrade,
HTTP2-Settings`` and ``Upgrade: h2c``. A server that does not switch protocols must answer the
request as HTTP/1.1, body included. uvicorn's httptools parser stops at such a request's head and
drops its body (the app saw an empty body: 400 on every POST); its h11 parser reads the request
whole and the upgrade is ignored, as RFC 9110 allows. The cost of h11 against httptools is in
benchmarks/README.md.

**Bounds** (``ConnectionLimits``, from ``ServerSettings``; each a ``serve`` flag):

- a request head (request line and headers) of at most ``max_header_bytes`` (h11's incomplete-event
  limit): a larger one is a 431 error object and the connection closes;
- a request head must arrive within ``header_timeout_s`` of the connection opening or of the first
  byte of a kept-alive connection's next request (a slow or silent client is disconnected);
- an idle kept-alive connection closes after ``keep_alive_timeout_s``;
- at most ``max_connections`` open at once: one more is answered 503 and closed at once.

The body's read time is bounded by the app (``app.read_raw_body``: ``body_timeout_s``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
from dataclasses import dataclass
from typing import Any, cast

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("smile_llm.server")


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may cost (see the module docstring)."""

    max_header_bytes: int
    header_timeout_s: float
    max_connections: int


def error_bytes(status: int, reason: str, message: str) -> bytes:
    """A whole HTTP/1.1 response carrying an OpenAI error object, that closes the connection."""
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error"
                                 if status < 500 else "service_unavailable",
                                 "param": None, "code": None}}).encode()
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


LINGER_S = 1.0  # how long a refused connection's unread input is read and dropped before closing


def linger(transport: asyncio.Transport, response: bytes) -> None:
    """Send ``response``, end the connection's output, and close it after ``LINGER_S``: closing at
    once with input unread would reset the connection, and the client could lose the response."""
    transport.write(response)
    if transport.can_write_eof():
        transport.write_eof()
    asyncio.get_running_loop().call_later(LINGER_S, transport.close)


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a head deadline, a connection cap, OpenAI error objects for
    malformed requests, and an h2c upgrade offer ignored quietly (it is on every request of Java's
    HttpClient; other unsupported upgrades still log uvicorn's warning)."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._accepted = False  # counted in uvicorn's connections (refused ones never are)
        self._dropping = False  # answered and lingering: its input is dropped
        self._head_timer: asyncio.TimerHandle | None = None
        self._head = bytearray()  # the start of the request head arriving, up to the limit

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._dropping = True
            refusal = error_bytes(503, "Service Unavailable", f"the server holds "
                                  f"{self.limits.max_connections} connections, its limit; "
                                  "retry later")
            linger(cast(asyncio.Transport, transport), refusal)
            return
        super().connection_made(cast(asyncio.Transport, transport))
        self._accepted = True
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_timer()
        if self._accepted:
            super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._dropping or self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE and self._head_too_long(data):
            self._disarm_head_timer()
            self._dropping = True
            linger(self.transport, error_bytes(431, "Request Header Fields Too Large",
                                               "the request head is over the limit of "
                                               f"{self.limits.max_header_bytes} bytes"))
            return
        super().data_received(data)
        if self.transport.is_closing():
            self._disarm_head_timer()
        elif self.conn.their_state is h11.IDLE:  # the next request's head is not all here yet
            if self._head_timer is None:
                self._arm_head_timer()
        else:
            self._head.clear()
            self._disarm_head_timer()

    def _head_too_long(self, data: bytes) -> bool:
        """Whether the head arriving (``data`` added) passes ``max_header_bytes``: its end is not
        within the limit. (h11's own limit bounds only a head that arrives in pieces.)"""
        limit = self.limits.max_header_bytes
        self._head += data[: limit + 4 - len(self._head)]
        end = self._head.find(b"\r\n\r\n")
        return end + 4 > limit if end >= 0 else len(self._head) > limit

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.debug("closed a connection that sent no complete request head within %g s",
                      self.limits.header_timeout_s)
            self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timer for the idle connection
        self._disarm_head_timer()

    def _unsupported_upgrade_warning(self) -> None:
        if self._get_upgrade() != b"h2c":
            super()._unsupported_upgrade_warning()

    def send_400_response(self, msg: str) -> None:
        self.transport.write(error_bytes(400, "Bad Request", f"malformed HTTP request: {msg}"))
        self.transport.close()


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host``:``port`` (IPv6 when ``host`` has a colon), ready for
    ``uvicorn.Server.run(sockets=[...])``; OSError when the address is taken or not ours."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def uvicorn_config(app: Any, settings: Any, host: str = "127.0.0.1", port: int = 8000,
                   log_level: str = "info", **overrides: Any) -> uvicorn.Config:
    """The uvicorn configuration of ``app`` under ``settings`` (a ``ServerSettings``): the bounded
    h11 protocol, its limits and the keep-alive timeout. ``overrides``: other ``uvicorn.Config``
    arguments."""
    limits = ConnectionLimits(settings.max_header_bytes, settings.header_timeout_s,
                              settings.max_connections)
    protocol = functools.partial(BoundedH11Protocol, limits=limits)
    return uvicorn.Config(app, host=host, port=port, log_level=log_level,
                          http=cast(Any, protocol),
                          h11_max_incomplete_event_size=settings.max_header_bytes,
                          timeout_keep_alive=max(1, round(settings.keep_alive_timeout_s)),
                          **overrides)
