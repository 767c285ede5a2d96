"""A local Ray instance (``num_cpus=2``) with Serve's HTTP proxy on a free loopback port, for the ``ray``-marked
tests; one per module (``serve_app`` deploys an application at ``/`` and deletes it afterwards). Skipped without
the ray extra."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ..server.conftest import free_port


class RayServe:
    """The running instance: ``url`` is Serve's HTTP proxy, ``metrics_url`` Ray's metrics export."""

    def __init__(self, port: int, metrics_port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"

    def run(self, app: Any, name: str = "smile-llm") -> None:
        from ray import serve

        serve.run(app, name=name, route_prefix="/")

    def running(self, name: str = "smile-llm") -> int:
        """How many model replicas Serve reports running (and none in another state)."""
        from ray import serve

        states = serve.status().applications[name].deployments["ModelReplica"].replica_states
        return int(states.get("RUNNING", 0)) if set(states) == {"RUNNING"} else -1


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def ray_serve() -> Iterator[RayServe]:
    ray = pytest.importorskip("ray", reason="needs the ray extra")
    from ray import serve

    port, metrics_port = free_port(), free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             _metrics_export_port=metrics_port)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield RayServe(port, metrics_port)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
