"""A local Ray instance (``num_cpus=2``) with Serve's HTTP proxy on a free loopback port, for the ``ray``-marked
tests; one per module. Ray runs in a driver process of its own (``ray_driver.py``), so this process never starts
Ray's core worker; the fixture talks to it one JSON line at a time, every reply awaited for a bounded time. Skipped
without the ray extra."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..server.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]
REPLY_TIMEOUT_S = 300.0


class RayServe:
    """The running instance: ``url`` is Serve's HTTP proxy, ``metrics_url`` Ray's metrics export."""

    def __init__(self) -> None:
        port, metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.scale_out.ray_driver", str(port),
                                      str(metrics_port)], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self._reply()  # {"ready": true}

    def _reply(self) -> Any:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + REPLY_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None:
                raise AssertionError(f"the Ray driver did not answer (exit {self.proc.poll()})")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("{"):
                    reply = json.loads(line)
                    if "error" in reply:
                        raise AssertionError(f"the Ray driver failed: {reply['error']}\n{reply['trace']}")
                    return reply.get("result")

    def call(self, op: str, **fields: Any) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def run(self, options: dict[str, Any], settings: dict[str, Any] | None = None, **app: Any) -> None:
        """Deploy ``application(ModelOptions(**options), ServerSettings(**settings), **app)`` at ``/``."""
        self.call("run", options=options, settings=settings or {}, app=app)

    def running(self) -> int:
        """How many model replicas Serve reports running (-1 while any is in another state)."""
        return int(self.call("running"))

    def close(self) -> None:
        """Quit the driver (it shuts Serve and Ray down), bounded."""
        try:
            if self.proc.poll() is None:
                assert self.proc.stdin is not None
                self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(30)


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_serve() -> Iterator[RayServe]:
    pytest.importorskip("ray.serve", reason="needs the ray extra")
    instance = RayServe()
    try:
        yield instance
    finally:
        instance.close()
