"""``serve``: run the API of a model on uvicorn. The server listens at once and answers 503 while
the model loads. SIGTERM (or Ctrl-C) stops admitting: new requests and ``/health`` get 503,
in-flight requests and streams run to their end for up to ``settings.drain_timeout_s`` seconds,
then the process exits 0."""

from __future__ import annotations

import logging
import math
import signal
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from .app import ServerState, create_app
from .settings import ServerSettings

log = logging.getLogger("smile_llm.server")


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, run on a thread (the main thread drives the model); the main thread's
    signal handlers call ``drain``."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    def drain(self) -> None:
        """Stop admitting (503) and let uvicorn finish the in-flight requests, then exit."""
        self.state.draining = True
        self.should_exit = True


def serve(load: Callable[[], Any], settings: ServerSettings, host: str = "127.0.0.1",
          port: int = 8000, log_level: str = "info") -> int:
    """Serve the model ``load()`` returns at ``host``:``port`` until SIGTERM or SIGINT; 0 after a
    clean drain, 1 when the model failed to load (the error is logged). uvicorn runs on a thread
    and answers 503 while the model loads on the calling (main) thread, which then drives the
    model's serving loop (``ServingLoop.drive_here``) until uvicorn has drained."""
    app = create_app(None, settings)
    state: ServerState = app.state.smile
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            # bounded: 0 drains nothing (None would wait for ever)
                            timeout_graceful_shutdown=math.ceil(max(settings.drain_timeout_s, 0.0)))
    server = _DrainingServer(config, state)
    model: Any = None

    def stop_driving() -> None:
        if model is not None:
            model.server.stop_thread(wait=False)

    def run_http() -> None:
        try:
            server.run()
        finally:  # drained: the main thread stops driving and closes the model
            stop_driving()

    previous = {sig: signal.signal(sig, lambda *_: server.drain())
                for sig in (signal.SIGTERM, signal.SIGINT)}
    http = threading.Thread(target=run_http, name="smile-llm-http", daemon=True)
    http.start()
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
            model.server.drive_here()
        http.join()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if model is not None:
            model.close()
