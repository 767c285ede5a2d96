"""``smile-llm serve``'s life as a process, each promise of docs/server.md checked from outside:

- SIGTERM drains on the open socket: while a stream runs, ``/health`` and new requests get 503 (not a refused
  connection), the stream ends whole, and the process exits 0;
- a stream still running when the drain timeout passes ends with a 503 error event and ``[DONE]``, without a
  traceback in the log; a second signal exits at once;
- the access log writes one JSON line per request at the default log level;
- a port in use, an empty key file and a ``config.json`` nested 100,000 deep are refused before anything loads
  (exit status 2, one line);
- a hostile constraint (a flat chain of 3,000 ``$ref``s, which once crashed the process inside the grammar
  engine) is a 400, and the server keeps serving."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from .conftest import free_port

pytest.importorskip("uvicorn")
STARTED_S = 120  # the most a start (the shipped model's load) may take on a loaded machine


class Served:
    """A ``smile-llm serve`` process on ``port``; its output is collected on a thread."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int) -> None:
        self.proc, self.url = proc, f"http://127.0.0.1:{port}"
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + STARTED_S
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output
            time.sleep(0.05)

    def running(self) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5).text
        return float(next(line.split()[-1] for line in text.splitlines()
                          if line.startswith("smile_llm_num_requests_running ")))

    def wait_running(self, n: int = 1) -> None:
        deadline = time.monotonic() + 60
        while self.running() < n:
            assert time.monotonic() < deadline, "the request never ran"
            time.sleep(0.02)


@contextmanager
def serve(*args: str, port: int | None = None) -> Iterator[Served]:
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "smile_llm", "serve", "--port", str(port), "--threads", "1",
                             "--served-model-name", "m", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={k: v for k, v in os.environ.items() if k != "SMILE_LLM_API_KEY"})
    served = Served(proc, port)
    try:
        yield served
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        served.reader.join(10)


def stream_events(url: str, body: dict[str, Any], out: list[Any]) -> None:
    """POST a streamed completion; append (status, [event data]) or the exception to ``out``."""
    try:
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
            out.append((r.status_code, [line[6:] for line in r.iter_lines() if line.startswith("data: ")]))
    except httpx.HTTPError as exc:
        out.append(exc)


LONG = {"model": "m", "prompt": "def f(x):\n", "temperature": 1.0, "seed": 3, "ignore_eos": True,
        "stream": True}


def start_streams(s: Served, n: int, max_tokens: int) -> tuple[list[threading.Thread], list[Any]]:
    """``n`` long streams on ``s``, once all run (bounded); their threads and where they put their results."""
    results: list[Any] = []
    threads = [threading.Thread(target=stream_events, args=(s.url, {**LONG, "max_tokens": max_tokens}, results))
               for _ in range(n)]
    for t in threads:
        t.start()
    s.wait_running(n)
    return threads, results


def test_sigterm_drains_on_the_open_socket_and_logs_every_request() -> None:
    with serve("--drain-timeout", "60") as s:
        s.wait_ready()
        (t,), results = start_streams(s, 1, 600)
        s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while httpx.get(s.url + "/health", timeout=10).status_code == 200:  # until the signal is handled
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert t.is_alive(), "the stream ended before the drain began: nothing was tested"
        while t.is_alive():  # the socket answers while the stream runs
            r = httpx.get(s.url + "/health", timeout=10)
            assert r.status_code == 503 and r.json()["error"]["message"] == "the server is draining"
            refused = httpx.post(s.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10)
            assert refused.status_code == 503
            time.sleep(0.05)
        t.join()
        assert s.proc.wait(60) == 0, s.output
    status, events = results[0]
    assert status == 200 and events[-1] == "[DONE]" and len(events) > 2
    assert all("error" not in json.loads(e) for e in events[:-1])
    logged = [json.loads(line) for line in s.lines if line.startswith("{")]
    paths = [(e["method"], e["path"], e["status"]) for e in logged]
    assert ("POST", "/v1/completions", 200) in paths and ("GET", "/health", 503) in paths, s.output
    assert ("POST", "/v1/completions", 503) in paths
    assert all(set(e) == {"request_id", "method", "path", "status", "seconds"} for e in logged)


def test_the_drain_timeout_ends_streams_with_an_error_event() -> None:
    with serve("--drain-timeout", "1") as s:
        s.wait_ready()
        threads, results = start_streams(s, 2, 1800)
        s.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(60)
        assert s.proc.wait(60) == 0, s.output
    assert len(results) == 2
    for status, events in results:
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        error = json.loads(events[-2])["error"]
        assert error["type"] == "service_unavailable" and "drain timeout" in error["message"]
    assert "Traceback" not in s.output and "Cancel" not in s.output, s.output


def test_a_second_signal_exits_at_once() -> None:
    with serve("--drain-timeout", "60") as s:
        s.wait_ready()
        (t,), _ = start_streams(s, 1, 1800)
        s.proc.send_signal(signal.SIGINT)
        time.sleep(0.3)
        assert s.proc.poll() is None  # draining
        s.proc.send_signal(signal.SIGINT)
        assert s.proc.wait(15) == 128 + signal.SIGINT
        t.join(30)


def test_a_port_in_use_is_refused_before_the_model_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        t0 = time.monotonic()
        with serve(port=port) as s:
            assert s.proc.wait(60) == 2
        assert time.monotonic() - t0 < 30
    assert f"cannot listen on 127.0.0.1:{port}" in s.output and "loaded" not in s.output, s.output


def test_an_empty_key_file_refuses_to_start(tmp_path: Path) -> None:
    empty = tmp_path / "key"
    empty.write_text("\n")
    with serve("--api-key-file", str(empty)) as s:
        assert s.proc.wait(60) == 2
    assert "holds no key" in s.output and len(s.lines) == 1, s.output


def test_a_hostile_constraint_is_400_and_the_server_survives() -> None:
    chain = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(3000)}
    chain["d3000"] = {"type": "integer"}
    schema = {"$defs": chain, "$ref": "#/$defs/d0"}
    body = {"model": "m", "prompt": "x", "max_tokens": 4,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}}
    with serve() as s:
        s.wait_ready()
        r = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["param"] == "json_schema", r.text
        ok = httpx.post(s.url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2}, timeout=60)
        assert ok.status_code == 200 and s.proc.poll() is None
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(60) == 0
