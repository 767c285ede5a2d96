"""A live server for the HTTP tests: the shipped byte-level model (with its ChatML chat template) behind
``create_app`` on uvicorn, on a free loopback port, in a thread of the test process (so tests can read the model's
pool directly); one with an API key."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from smile_llm import LanguageModel  # noqa: E402
from smile_llm.server import ServerSettings, create_app  # noqa: E402
from smile_llm.server.connections import uvicorn_config  # noqa: E402

KEY = "sk-test-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LiveServer:
    """uvicorn serving ``app`` on a thread, configured as ``smile-llm serve`` configures it (the bounded h11
    protocol and the settings' connection limits); ``url`` its base URL."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(app, app.state.smile.settings, "127.0.0.1", self.port, "warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the test server did not start within 30 s")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="session")
def chat_model() -> Iterator[LanguageModel]:
    model = LanguageModel.default(max_batch_size=8, max_seq_len=2048)
    yield model
    model.close()


@pytest.fixture(scope="session")
def live(chat_model: LanguageModel) -> Iterator[LiveServer]:
    server = LiveServer(create_app(chat_model, ServerSettings(model_name="smile-test", max_queued=64)))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def keyed(chat_model: LanguageModel) -> Iterator[LiveServer]:
    server = LiveServer(create_app(chat_model, ServerSettings(model_name="smile-test", api_key=KEY)))
    yield server
    server.stop()


def wait_unbound(model: LanguageModel, timeout: float = 10.0) -> None:
    """Wait until no request is bound in the model's pool (bounded)."""
    deadline = time.monotonic() + timeout
    while model.pool.bound_request_count or model.serving_loop.num_running or model.serving_loop.num_waiting:
        if time.monotonic() > deadline:
            raise AssertionError(f"requests still bound after {timeout} s: {model.pool.bound_request_count}")
        time.sleep(0.01)
