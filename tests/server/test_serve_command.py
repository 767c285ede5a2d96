"""``smile-llm serve`` as a process: it answers 503 while the model loads, then 200; SIGTERM while 8 streams run
gives every client a full answer (or a clean error) and the process exits 0 within its drain timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from .conftest import free_port

pytest.importorskip("uvicorn")


def test_sigterm_drains_eight_streams_and_exits_zero(tmp_path: Path) -> None:
    port = free_port()
    key_file = tmp_path / "key"
    key_file.write_text("sk-file-key\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "smile_llm", "serve", "--port", str(port), "--api-key-file", str(key_file),
         "--served-model-name", "m", "--threads", "1", "--drain-timeout", "60", "--log-level", "warning"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "SMILE_LLM_API_KEY": "ignored"})
    url = f"http://127.0.0.1:{port}"
    headers = {"authorization": "Bearer sk-file-key"}
    try:
        deadline = time.monotonic() + 120
        statuses = set()
        while True:
            try:
                r = httpx.get(url + "/health", timeout=5)
                statuses.add(r.status_code)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
            time.sleep(0.05)
        assert statuses <= {503, 200}
        results: list[object] = [None] * 8

        def one(i: int) -> None:
            body = {"model": "m", "prompt": f"def f{i}(x):\n", "max_tokens": 120, "temperature": 0, "stream": True,
                    "stream_options": {"include_usage": True}}
            try:
                with httpx.stream("POST", url + "/v1/completions", json=body, headers=headers, timeout=120) as r:
                    events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
                results[i] = (r.status_code, events)
            except httpx.HTTPError as exc:
                results[i] = exc

        threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        # SIGTERM once a stream is running (bounded): a stream refused before would test nothing
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            metrics = httpx.get(url + "/metrics", timeout=5).text
            running = [line for line in metrics.splitlines() if line.startswith("smile_llm_num_requests_running ")]
            if running and float(running[0].split()[-1]) >= 1:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(120)
        assert proc.wait(90) == 0
        for res in results:
            assert isinstance(res, tuple), res
            status, events = res
            if status == 200:  # a full answer: every chunk, the usage, [DONE]
                assert events[-1] == "[DONE]"
                usage = json.loads(events[-2])["usage"]
                text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-2])
                assert usage["completion_tokens"] > 0 and text
            else:  # refused cleanly while draining
                assert status == 503
        assert sum(1 for r in results if isinstance(r, tuple) and r[0] == 200) >= 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
