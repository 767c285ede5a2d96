"""``serve``: run the API of a model on uvicorn. The server listens at once and answers 503 while
the model loads (``load`` runs on a thread). SIGTERM (or Ctrl-C) stops admitting: new requests and
``/health`` get 503, in-flight requests and streams run to their end for up to
``settings.drain_timeout_s`` seconds, then the process exits 0."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

import uvicorn

from .app import ServerState, create_app
from .settings import ServerSettings

log = logging.getLogger("smile_llm.server")


class _DrainingServer(uvicorn.Server):
    """uvicorn's server, marking the app as draining on the first exit signal."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.state.draining = True
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:  # drained here: exit 0, not by the signal uvicorn re-raises
            self._captured_signals = [s for s in self._captured_signals if s != sig]


def serve(load: Callable[[], Any], settings: ServerSettings, host: str = "127.0.0.1",
          port: int = 8000, log_level: str = "info") -> int:
    """Serve the model ``load()`` returns at ``host``:``port`` until a signal ends it; 0 after a
    clean drain, 1 when the model failed to load (the error is logged)."""
    app = create_app(None, settings)
    state: ServerState = app.state.smile
    failed: list[BaseException] = []
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level,
                            timeout_graceful_shutdown=int(settings.drain_timeout_s) or None)
    server = _DrainingServer(config, state)

    def loading() -> None:
        try:
            state.model = load()
            log.info("model loaded; serving %s", settings.model_name)
        except BaseException as exc:  # noqa: BLE001 - reported, and the server stops
            failed.append(exc)
            log.error("the model failed to load: %s: %s", type(exc).__name__, exc)
            server.should_exit = True

    threading.Thread(target=loading, name="smile-llm-load", daemon=True).start()
    server.run()
    model = state.model
    if model is not None:
        model.close()
    return 1 if failed else 0
