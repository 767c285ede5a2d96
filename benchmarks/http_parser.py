#!/usr/bin/env python
"""What serving through uvicorn's h11 parser costs against its httptools parser, at concurrency 16.

``smile-llm serve`` parses HTTP with h11 (``smile_llm/server/connections.py``): httptools drops the body of a
request that offers an upgrade the server declines, which Java's own HttpClient does on every plain-http request
(``Upgrade: h2c``). This measures the price. Each server is a process of its own serving the shipped model's app
(``create_app``) with the same settings, one with ``connections.uvicorn_config`` (bounded h11), the other with
uvicorn's httptools protocol; the load comes from this process, ``--concurrency`` threads each with a kept-alive
``httpx`` client:

- ``tokenize``: ``POST /tokenize`` of a short prompt (no model work: the HTTP path's own cost), requests/s;
- ``chat``: ``POST /v1/chat/completions``, ``--output-tokens`` greedy tokens each, plain JSON, output tokens/s;
- ``stream``: the same streamed (server-sent events), output tokens/s.

Each workload runs ``--repeats`` times per server, the servers interleaved; the medians and the ratio h11 /
httptools are printed (1.0: no cost).

    .venv/bin/python benchmarks/http_parser.py
    .venv/bin/python benchmarks/http_parser.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVER = """
import sys, uvicorn
from smile_llm import LanguageModel
from smile_llm.server import ServerSettings, create_app
from smile_llm.server.connections import uvicorn_config
import torch
torch.set_num_threads(int(sys.argv[3]))
model = LanguageModel.default(max_batch_size=16, max_seq_len=1024)
settings = ServerSettings(model_name="m", max_queued=1024, max_connections=1024)
app = create_app(model, settings)
if sys.argv[1] == "h11":
    config = uvicorn_config(app, settings, "127.0.0.1", int(sys.argv[2]), "warning")
else:
    config = uvicorn.Config(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning", http="httptools")
uvicorn.Server(config).run()
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(parser: str, threads: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", SERVER, parser, str(port), str(threads)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the {parser} server did not start")
        time.sleep(0.1)


def one(client: httpx.Client, url: str, kind: str, tokens: int, i: int) -> int:
    """One request of ``kind``; the output tokens it brought (1 for tokenize)."""
    if kind == "tokenize":
        r = client.post(url + "/tokenize", json={"prompt": f"def f{i}(x):"})
        r.raise_for_status()
        return 1
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": f"Write function {i}."}],
                            "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if kind == "chat":
        r = client.post(url + "/v1/chat/completions", json=body)
        r.raise_for_status()
        return int(r.json()["usage"]["completion_tokens"])
    body.update(stream=True, stream_options={"include_usage": True})
    got = 0
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got = json.loads(line[6:]).get("usage", {}).get("completion_tokens", got) or got
    return got


def rate(url: str, kind: str, concurrency: int, per_thread: int, tokens: int) -> float:
    """Units per second (requests for tokenize, output tokens otherwise) of ``concurrency`` threads."""
    counts = [0] * concurrency
    errors: list[BaseException] = []

    def run(t: int) -> None:
        with httpx.Client(timeout=300) as client:
            try:
                for i in range(per_thread):
                    counts[t] += one(client, url, kind, tokens, t * per_thread + i)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(counts) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokenize-requests", type=int, default=40, help="per thread")
    ap.add_argument("--chat-requests", type=int, default=2, help="per thread")
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.tokenize_requests, args.chat_requests, args.output_tokens = 1, 10, 1, 8
    print(f"smile_llm {code_version()}, load average {os.getloadavg()[0]:.2f}, concurrency {args.concurrency}, "
          f"{args.repeats} repeats, servers interleaved")
    servers = {name: start(name, args.threads) for name in ("h11", "httptools")}
    try:
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for kind, n in (("tokenize", args.tokenize_requests), ("chat", args.chat_requests),
                            ("stream", args.chat_requests)):
                for name, (_, url) in servers.items():
                    results.setdefault((kind, name), []).append(
                        rate(url, kind, args.concurrency, n, args.output_tokens))
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    print(f"{'workload':<10} {'unit':<18} {'h11':>10} {'httptools':>10} {'h11/httptools':>14}")
    ratios = {}
    for kind, unit in (("tokenize", "requests/s"), ("chat", "output tokens/s"), ("stream", "output tokens/s")):
        h11, ht = (statistics.median(results[(kind, name)]) for name in ("h11", "httptools"))
        ratios[kind] = h11 / ht
        print(f"{kind:<10} {unit:<18} {h11:>10.1f} {ht:>10.1f} {ratios[kind]:>14.2f}")
    print("headline: h11 / httptools at concurrency "
          f"{args.concurrency}: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))


if __name__ == "__main__":
    main()
