"""``serve``: run the API of a model on uvicorn. The address is taken first (a port in use is an
OSError before the model loads); the server then listens at once and answers 503 while the model
loads.

SIGTERM (or Ctrl-C) drains: the listening socket stays open and answers new requests and
``/health`` with 503 (a load balancer sees the drain), while the requests in flight run to their
end for up to ``settings.drain_timeout_s`` seconds; any still running then end with a 503 (a
stream with an error event and ``[DONE]``), and the process exits 0. A second signal exits at
once (status 128 + the signal's number)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import uvicorn

from .access_log import configure_logging
from .app import create_app
from .connections import listening_socket, uvicorn_config
from .settings import ServerSettings
from .state import ServerState

if TYPE_CHECKING:
    from ..language_model import LanguageModel

log = logging.getLogger("smile_llm.server")
POLL_S = 0.05  # how often the drain looks at the requests in flight
CUT_GRACE_S = 5.0  # how long requests cut at the end of a drain have to send their last event
CUT_REASON = "the server stopped before the request finished (its drain timeout passed)"


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, run on a thread (the main thread drives the model); the main thread's
    signal handlers call ``drain`` (see the module docstring)."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain_started = threading.Event()

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        if self._drain_started.is_set():  # a signal before the loop ran
            self.loop.create_task(self._drain())
        await super().serve(sockets)

    def drain(self) -> None:
        """Start draining (from any thread; once)."""
        if self._drain_started.is_set():
            return
        self._drain_started.set()
        loop = self.loop
        if loop is not None:
            try:
                loop.call_soon_threadsafe(lambda: loop.create_task(self._drain()))
            except RuntimeError:  # the loop already ended
                self.should_exit = True

    async def _drain(self) -> None:
        state = self.state
        state.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + state.settings.drain_timeout_s
        while state.busy and loop.time() < deadline:
            await asyncio.sleep(POLL_S)
        if state.busy:
            log.warning("drain timeout: ending %d requests with 503", len(state.generations))
            await state.cut(CUT_REASON)
            grace = loop.time() + CUT_GRACE_S
            while state.generations and loop.time() < grace:
                await asyncio.sleep(POLL_S)
        self.should_exit = True


def serve(load: Callable[[], Any], settings: ServerSettings, host: str = "127.0.0.1",
          port: int = 8000, log_level: str = "info") -> int:
    """Serve the model ``load()`` returns at ``host``:``port`` until SIGTERM or SIGINT; 0 after a
    clean drain, 1 when the model failed to load (the error is logged). OSError, before anything
    loads, when the address cannot be taken. uvicorn runs on a thread and answers 503 while the
    model loads on the calling (main) thread, which then drives the model's serving loop
    (``ServingLoop.drive_here``) until uvicorn has drained."""
    sock = listening_socket(host, port)
    configure_logging(log_level)
    app = create_app(None, settings)
    state: ServerState = app.state.smile
    config = uvicorn_config(app, settings, host, port, log_level,
                            timeout_graceful_shutdown=int(CUT_GRACE_S))
    server = _DrainingServer(config, state)
    model: LanguageModel | None = None
    signals = [0]

    def on_signal(signum: int, _frame: Any) -> None:
        signals[0] += 1
        if signals[0] > 1:
            log.warning("a second signal: exiting now")
            os._exit(128 + signum)
        log.info("draining (a second signal exits at once)")
        server.drain()

    def stop_driving() -> None:
        if model is not None:
            model.serving_loop.stop_thread(wait=False)

    def run_http() -> None:
        try:
            server.run(sockets=[sock])
        finally:  # drained: the main thread stops driving and closes the model
            stop_driving()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    http = threading.Thread(target=run_http, name="smile-llm-http", daemon=True)
    http.start()
    log.info("listening on http://%s:%d", host, port)
    try:
        try:
            model = load()
        except Exception as exc:  # noqa: BLE001 - reported, and the server stops
            log.error("the model failed to load: %s: %s", type(exc).__name__, exc)
            server.should_exit = True
            http.join()
            return 1
        state.model = model
        log.info("model loaded; serving %s", settings.model_name)
        if http.is_alive():
            model.serving_loop.drive_here()
        http.join()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
        if model is not None:
            model.close()
