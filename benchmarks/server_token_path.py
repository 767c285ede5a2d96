#!/usr/bin/env python
"""The server's per-token path: the shipped model streamed in process against the same model through
``smile-llm serve``, at each concurrency of ``--concurrency``.

In process, the model is loaded as ``serve`` loads it (``ModelOptions.load``, ``--threads`` torch threads) and its
main thread drives the serving loop (``ServingLoop.drive_here``, as ``serve``'s main thread does); each of the
``c`` clients runs ``--requests`` requests one after the other (a request's done callback submits the next), and a
listener stamps every token as the serving loop produces it. Through HTTP, ``smile-llm serve`` runs as a process of
its own and ``c`` threads of this process, each with a kept-alive ``httpx`` client, stream
``POST /v1/chat/completions`` one after the other and stamp every chunk as it arrives. Every request is the same
kind on both sides: a chat prompt (distinct per request), ``--tokens`` greedy tokens with EOS ignored (so every
reply has exactly that many), streamed.

Per request: time to first token, and the inter-token latency as load generators define it (the time from the first
token to the last over the tokens after the first: guidellm's ``inter_token_latency``). Per run and side: its p50 and
p99 over the run's requests, output tokens/s (tokens over the run's wall time), and per token the CPU time of the
thread that drives the serving loop, of the serving process's other threads (uvicorn's event loop and its helpers:
the HTTP path), and the time the serving thread was runnable but waited for a CPU (the machine's other load, which on
a shared machine moves the wall-clock figures more than anything measured here). ``--runs`` runs, the sides
interleaved (their order alternating); the medians over runs are printed, with the ratios HTTP / in process.

``--baseline-tree DIR`` adds a third side: the server of another checkout (``PYTHONPATH=DIR``, for example a copy of
the package as it was before a change), measured in the same runs.

    .venv/bin/python benchmarks/server_token_path.py
    .venv/bin/python benchmarks/server_token_path.py --quick
    .venv/bin/python benchmarks/server_token_path.py --baseline-tree /tmp/before   # /tmp/before/smile_llm: a copy
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version, popen_server, stderr_tail  # noqa: E402

NAME = "smile-bench"


@dataclass
class Reply:
    """One request's client-side view: seconds from sending to the first token, the mean gap between its tokens
    after the first, and its token count."""

    ttft: float
    itl: float
    tokens: int


@dataclass
class Run:
    """One run of one side at one concurrency."""

    replies: list[Reply]
    seconds: float
    cpu_seconds: float  # CPU time of the process that served the run, all its threads
    serving_cpu_seconds: float  # the part of its main thread, which drives the serving loop
    serving_wait_seconds: float  # its main thread runnable but waiting for a CPU

    @property
    def tokens_per_s(self) -> float:
        return sum(r.tokens for r in self.replies) / self.seconds

    @property
    def serving_us_per_token(self) -> float:
        """CPU of the serving loop's thread per token (the model's work, and the listeners')."""
        return self.serving_cpu_seconds * 1e6 / sum(r.tokens for r in self.replies)

    @property
    def waiting_us_per_token(self) -> float:
        """Time per token the serving loop's thread waited for a CPU (the machine's load, not ours)."""
        return self.serving_wait_seconds * 1e6 / sum(r.tokens for r in self.replies)

    @property
    def other_us_per_token(self) -> float:
        """CPU of the process's other threads per token (the HTTP server's event loop and its helpers)."""
        return (self.cpu_seconds - self.serving_cpu_seconds) * 1e6 / sum(r.tokens for r in self.replies)

    def itl(self, q: float) -> float:
        return quantile([r.itl for r in self.replies], q)

    def ttft(self, q: float) -> float:
        return quantile([r.ttft for r in self.replies], q)


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of ``values`` (linear interpolation; p99 of a few values is close to the largest)."""
    xs = sorted(values)
    at = q * (len(xs) - 1)
    lo = int(at)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (at - lo)


def questions(count: int) -> list[list[dict[str, str]]]:
    topics = ["rivers", "compilers", "bread", "tides", "chess", "volcanoes", "trains", "bees", "glass", "orbits",
              "maps", "clocks", "paper", "salt", "bridges", "owls"]
    return [[{"role": "system", "content": "You are a helpful assistant who answers briefly."},
             {"role": "user", "content": f"Tell me something about {topics[i % len(topics)]} (question {i})."}]
            for i in range(count)]


# ---------------------------------------------------------------------------------------------- in process
class _Stamps:
    """A listener that stamps every token (on the serving loop's thread)."""

    def __init__(self) -> None:
        self.sent = time.perf_counter()
        self.first: float | None = None
        self.last = 0.0
        self.count = 0

    def on_token(self, token_id: int) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = now
        self.last = now
        self.count += 1

    def reply(self) -> Reply:
        assert self.first is not None and self.count > 1
        return Reply(self.first - self.sent, (self.last - self.first) / (self.count - 1), self.count)


def in_process(lm: Any, prompts: list[list[int]], concurrency: int, requests: int, tokens: int,
               speculative: int | None = None) -> Run:
    """``concurrency`` closed-loop clients of ``requests`` requests each, the calling (main) thread driving."""
    from smile_llm import SamplingParams

    params = SamplingParams(max_new_tokens=tokens, min_new_tokens=tokens, temperature=0.0,
                            speculative_tokens=speculative)
    replies: list[Reply] = []
    active = [concurrency]
    failures: list[BaseException] = []

    def start(slot: int, k: int) -> None:
        stamps = _Stamps()
        handle = lm.serving_loop.submit(lm.request(prompts[(slot * requests + k) % len(prompts)], params,
                                             listener=stamps))
        handle.add_done_callback(lambda h: finished(h, slot, k, stamps))

    def finished(handle: Any, slot: int, k: int, stamps: _Stamps) -> None:
        error = handle._error  # noqa: SLF001 - a done callback must not wait; the handle is settled
        if error is not None:
            failures.append(error)
        else:
            replies.append(stamps.reply())
        if k + 1 < requests and error is None:
            start(slot, k + 1)
            return
        active[0] -= 1
        if active[0] == 0:
            lm.serving_loop.stop_thread(wait=False)

    t0, before = time.perf_counter(), thread_times(os.getpid())
    for slot in range(concurrency):
        start(slot, 0)
    lm.serving_loop.drive_here()
    seconds, cpu = time.perf_counter() - t0, cpu_between(os.getpid(), before)
    if failures:
        raise RuntimeError(f"in-process request failed: {failures[0]!r}")
    return Run(replies, seconds, *cpu)


# ---------------------------------------------------------------------------------------------- over HTTP
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(port: int, threads: int, tree: str | None) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if tree is not None:
        env["PYTHONPATH"] = tree
    cmd = [sys.executable, "-m", "smile_llm", "serve", "--port", str(port), "--threads", str(threads),
           "--served-model-name", NAME, "--log-level", "warning"]
    return popen_server(cmd, env)


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = stderr_tail(proc)
            raise RuntimeError(f"the server exited: {err}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} not ready within {timeout} s")


def thread_times(pid: int) -> dict[int, tuple[float, float]]:
    """Seconds so far of each thread of process ``pid`` on a CPU and runnable but waiting for one (the machine's
    other load), by thread id (Linux: ``/proc/PID/task/TID/schedstat``, in nanoseconds)."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run_ns, wait_ns = (int(x) for x in (task / "schedstat").read_text().split()[:2])
        except (OSError, ValueError):  # a thread that just ended
            continue
        times[int(task.name)] = (run_ns / 1e9, wait_ns / 1e9)
    return times


def cpu_between(pid: int, before: dict[int, tuple[float, float]]) -> tuple[float, float, float]:
    """Since ``before`` (``thread_times(pid)``): CPU seconds of the process's threads alive now, of its main thread
    (the one driving the serving loop), and the main thread's seconds waiting for a CPU."""
    now = thread_times(pid)
    total = sum(run - before.get(tid, (0.0, 0.0))[0] for tid, (run, _) in now.items())
    main_run, main_wait = now[pid]
    return total, main_run - before[pid][0], main_wait - before[pid][1]


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stream_one(client: httpx.Client, url: str, messages: list[dict[str, str]], tokens: int,
               speculative: int | None = None) -> Reply:
    body = {"model": NAME, "messages": messages, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}, "speculative_tokens": speculative}
    sent = time.perf_counter()
    first: float | None = None
    last = 0.0
    count = 0
    with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            if chunk.get("usage"):
                count = chunk["usage"]["completion_tokens"]
            for choice in chunk["choices"]:
                if choice["delta"].get("content"):
                    if first is None:
                        first = now
                    last = now
    assert first is not None and count > 1, (first, count)
    return Reply(first - sent, (last - first) / (count - 1), count)


def over_http(url: str, pid: int, conversations: list[list[dict[str, str]]], concurrency: int, requests: int,
              tokens: int, speculative: int | None = None) -> Run:
    replies: list[Reply] = []
    failures: list[BaseException] = []

    def client(slot: int) -> None:
        try:
            with httpx.Client(timeout=120) as c:
                for k in range(requests):
                    replies.append(stream_one(c, url, conversations[(slot * requests + k) % len(conversations)],
                                              tokens, speculative))
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(concurrency)]
    t0, before = time.perf_counter(), thread_times(pid)
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seconds, cpu = time.perf_counter() - t0, cpu_between(pid, before)
    if failures:
        raise RuntimeError(f"HTTP request failed: {failures[0]!r}")
    return Run(replies, seconds, *cpu)


# ---------------------------------------------------------------------------------------------- main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,4", help="comma-separated concurrencies (default 1,4)")
    p.add_argument("--requests", type=int, default=4, help="requests per client per run (default 4)")
    p.add_argument("--tokens", type=int, default=64, help="tokens per reply (default 64)")
    p.add_argument("--runs", type=int, default=5, help="interleaved runs; medians are reported (default 5)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads, in process and in the server (default 1: steadier on a shared machine)")
    p.add_argument("--baseline-tree", default=None, metavar="DIR",
                   help="also serve the smile_llm package found in DIR (PYTHONPATH=DIR), labelled 'baseline'")
    p.add_argument("--speculative-tokens", type=int, default=None, metavar="K",
                   help="drafts per round (default: the model's; 0: plain decoding, one token and one chunk per step)")
    p.add_argument("--quick", action="store_true", help="2 runs of 2 requests per client, 32 tokens")
    args = p.parse_args()
    if args.quick:
        args.runs, args.requests, args.tokens = 2, 2, 32
    levels = [int(c) for c in args.concurrency.split(",")]

    from smile_llm.server.model_options import ModelOptions

    load = os.getloadavg()[0]
    print(f"server_token_path: smile_llm {code_version()}, {os.cpu_count()} cpus (load average {load:.1f}), "
          f"{args.threads} torch threads; {args.tokens} greedy tokens per streamed chat reply, EOS ignored, "
          f"{'the default drafts' if args.speculative_tokens is None else f'{args.speculative_tokens} drafts'}; "
          f"{args.requests} requests per client, {args.runs} interleaved runs (medians)")
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    sides = ["in process", "HTTP"] + (["baseline"] if args.baseline_tree else [])
    try:
        for side, tree in (("HTTP", None), ("baseline", args.baseline_tree)):
            if side in sides:
                port = free_port()
                servers[side] = (start_server(port, args.threads, tree), f"http://127.0.0.1:{port}")
        lm = ModelOptions(threads=args.threads).load()
        conversations = questions(max(levels) * args.requests)
        prompts = [lm.encode_chat(m, True) for m in conversations]
        for side, (proc, url) in servers.items():
            wait_ready(url, proc)
            over_http(url, proc.pid, conversations, 1, 2, args.tokens, args.speculative_tokens)  # warm-up
        in_process(lm, prompts, 1, 2, args.tokens, args.speculative_tokens)

        runs: dict[tuple[str, int], list[Run]] = {(s, c): [] for s in sides for c in levels}
        for r in range(args.runs):
            for c in levels:
                order = sides if r % 2 == 0 else sides[::-1]
                for side in order:
                    if side == "in process":
                        run = in_process(lm, prompts, c, args.requests, args.tokens, args.speculative_tokens)
                    else:
                        proc, url = servers[side]
                        run = over_http(url, proc.pid, conversations, c, args.requests, args.tokens,
                                        args.speculative_tokens)
                    runs[(side, c)].append(run)
            print(f"  run {r + 1}/{args.runs} done", flush=True)
    finally:
        for proc, _ in servers.values():
            stop_server(proc)

    def med(side: str, c: int, f: Any) -> float:
        return statistics.median(f(run) for run in runs[(side, c)])

    columns = {"ITL p50 ms": lambda run: run.itl(0.5) * 1e3, "ITL p99 ms": lambda run: run.itl(0.99) * 1e3,
               "TTFT p50 ms": lambda run: run.ttft(0.5) * 1e3, "out tok/s": lambda run: run.tokens_per_s,
               "serve us/tok": lambda run: run.serving_us_per_token,
               "other us/tok": lambda run: run.other_us_per_token,
               "queued us/tok": lambda run: run.waiting_us_per_token}
    figures = {(side, c): {name: med(side, c, f) for name, f in columns.items()} for side in sides for c in levels}
    print()
    print(f"{'c':>3} {'side':<11}" + "".join(f"{name:>13}" for name in columns))
    for c in levels:
        for side in sides:
            print(f"{c:>3} {side:<11}" + "".join(f"{figures[(side, c)][name]:>13.2f}" for name in columns))
    print()
    print("per token: serve us/tok, CPU of the thread driving the serving loop; other us/tok, CPU of the process's "
          "other threads (HTTP);\nqueued us/tok, time the serving thread was runnable but waited for a CPU (the "
          "machine's other load)")
    print()
    print("ratios over in process (ITL and CPU: lower is better; out tok/s: higher is better)")
    parts = []
    for c in levels:
        base = figures[("in process", c)]
        for side in sides[1:]:
            f = figures[(side, c)]
            print(f"  c={c} {side:<9} ITL p50 {f['ITL p50 ms'] / base['ITL p50 ms']:.2f}x, "
                  f"ITL p99 {f['ITL p99 ms'] / base['ITL p99 ms']:.2f}x, "
                  f"out tok/s {f['out tok/s'] / base['out tok/s']:.2f}x, "
                  f"serving thread CPU {f['serve us/tok'] / base['serve us/tok']:.2f}x")
        f = figures[("HTTP", c)]
        parts.append(f"c={c} ITL p50 {f['ITL p50 ms']:.2f} ms vs {base['ITL p50 ms']:.2f} in process "
                     f"({f['ITL p50 ms'] / base['ITL p50 ms']:.2f}x), out tok/s "
                     f"{f['out tok/s'] / base['out tok/s']:.2f}x")
    print("headline: server token path: " + "; ".join(parts))

if __name__ == "__main__":
    main()
