#!/usr/bin/env python
"""Replicas on Ray Serve: the cache-aware router against Ray Serve's default power-of-two router and Ray Serve LLM's
``PrefixCacheAffinityRouter``, on one multi-tenant chat trace, in the same run, on one local Ray instance.

The trace: ``--tenants`` system prompts (distinct, about ``--system-chars`` characters each) and ``--conversations``
conversations spread over them, ``--turns`` turns each (a short user message, then the answer, greedy,
``--max-tokens`` tokens, streamed with usage). ``--concurrency`` clients each run whole conversations, sending a
turn as soon as the previous answer is complete. The order is seeded: every configuration gets the same requests.

Configurations: one replica with the KV pool of one (the same replica as below), one replica with the pool of two
(``2 x --max-batch-size``: the whole cache of two replicas in one, which no router can split better; the hit rate
the goal is measured against), then two replicas under each router. Each replica is the shipped dense model with
one torch thread and a KV pool of ``--max-batch-size`` x ``--max-seq-len`` tokens, so the trace's working set
overflows one replica's cache and the routers' choices matter. Reported per configuration (the median over
``--runs`` runs, each on freshly started replicas): the prefix-cache hit rate (cached prompt tokens over prompt
tokens, from each answer's ``usage``), mean and p99 time to first token, output tokens per second and requests per
second. Goal: the cache router's hit rate at least 0.9 of one replica's with the pool of two.

Faults: the trace again under the cache router, with one replica killed after a third of its requests: the share of
requests completed (the rest end with a clean error: the clients do not retry), and the recovery time (from the kill
until Ray Serve reports two replicas running again).

    .venv/bin/python benchmarks/scale_out.py
    .venv/bin/python benchmarks/scale_out.py --quick
"""

from __future__ import annotations

import argparse
import json
import queue
import random
import socket
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

APP = "bench"
ROUTERS = ("pow2", "prefix", "cache")


@dataclass
class Result:
    """What one request measured (``ok``: a complete answer)."""

    ok: bool
    prompt: int = 0
    cached: int = 0
    output: int = 0
    ttft: float | None = None


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0

    def figures(self) -> dict[str, float]:
        done = [r for r in self.results if r.ok]
        ttfts = sorted(r.ttft for r in done if r.ttft is not None)
        return {"hit_rate": sum(r.cached for r in done) / max(1, sum(r.prompt for r in done)),
                "ttft_mean_ms": 1000 * statistics.fmean(ttfts) if ttfts else float("nan"),
                "ttft_p99_ms": 1000 * ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] if ttfts else float("nan"),
                "output_tok_s": sum(r.output for r in done) / self.seconds,
                "requests_s": len(done) / self.seconds,
                "completed": len(done) / max(1, len(self.results))}


def trace(args: argparse.Namespace) -> list[tuple[str, list[str]]]:
    """(system prompt, user messages) per conversation, in a seeded order."""
    rng = random.Random(args.seed)
    words = ("policy account invoice shipment refund warranty schedule contract ticket order product region "
             "customer support billing delivery manager report account-id priority escalation").split()
    systems = []
    for t in range(args.tenants):
        text = f"You are the assistant of tenant {t}. "
        while len(text) < args.system_chars:
            text += " ".join(rng.choice(words) for _ in range(8)) + ". "
        systems.append(text)
    conversations = []
    for c in range(args.conversations):
        users = [f"Question {k} of conversation {c}: " + " ".join(rng.choice(words) for _ in range(6))
                 for k in range(args.turns)]
        conversations.append((systems[c % args.tenants], users))
    rng.shuffle(conversations)
    return conversations


def one_turn(client: httpx.Client, messages: list[dict[str, str]], max_tokens: int) -> tuple[Result, str]:
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0, text, result = time.perf_counter(), "", Result(ok=False)
    try:
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                return result, ""
            done = False
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        return result, ""
                    if event.get("usage"):
                        u = event["usage"]
                        result.prompt, result.output = u["prompt_tokens"], u["completion_tokens"]
                        result.cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                    for choice in event.get("choices", []):
                        piece = choice.get("delta", {}).get("content")
                        if piece:
                            if result.ttft is None:
                                result.ttft = time.perf_counter() - t0
                            text += piece
            result.ok = done
    except httpx.HTTPError:
        pass
    return result, text


def drive(url: str, conversations: list[tuple[str, list[str]]], args: argparse.Namespace,
          on_request: Any = None) -> Run:
    """Run the trace with ``args.concurrency`` clients; ``on_request(n)`` after each request ends."""
    todo: queue.Queue[tuple[str, list[str]]] = queue.Queue()
    for c in conversations:
        todo.put(c)
    run, lock = Run(), threading.Lock()

    def client() -> None:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(300.0)) as http:
            while True:
                try:
                    system, users = todo.get_nowait()
                except queue.Empty:
                    return
                messages = [{"role": "system", "content": system}]
                for user in users:
                    messages.append({"role": "user", "content": user})
                    result, answer = one_turn(http, messages, args.max_tokens)
                    with lock:
                        run.results.append(result)
                        n = len(run.results)
                    if on_request is not None:
                        on_request(n)
                    if not result.ok:
                        break  # (the conversation cannot go on without its answer)
                    messages.append({"role": "assistant", "content": answer})

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(3600)
    run.seconds = time.perf_counter() - t0
    return run


def deploy(args: argparse.Namespace, replicas: int, router: str, name: str, pool: int = 1) -> None:
    from ray import serve

    from smile_llm.server.model_options import ModelOptions
    from smile_llm.server.replicas.ray_app import application
    from smile_llm.server.settings import ServerSettings

    # (on the CPU a replica's KV pool holds max_batch_size x max_seq_len tokens)
    options = ModelOptions(max_batch_size=pool * args.max_batch_size, max_seq_len=args.max_seq_len, threads=1)
    kwargs = {"imbalanced_threshold": 8} if router == "prefix" else {}
    serve.run(application(options, ServerSettings(), replicas, router, cpus_per_replica=1.0,
                          router_kwargs=kwargs), name=name, route_prefix="/")


def running(name: str) -> int:
    from ray import serve

    states = serve.status().applications[name].deployments["ModelReplica"].replica_states
    return int(states.get("RUNNING", 0)) if set(states) == {"RUNNING"} else -1


def killed_run(url: str, conversations: list[tuple[str, list[str]]], args: argparse.Namespace,
               name: str) -> tuple[Run, float]:
    """The trace with one replica killed after a third of its requests; the recovery time."""
    import ray

    total = args.conversations * args.turns
    kill_at: dict[str, float] = {}

    def on_request(n: int) -> None:
        if n == total // 3 and not kill_at:
            kill_at["t"] = time.monotonic()
            with httpx.Client(base_url=url, timeout=60) as c:
                victim = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}).headers[
                    "x-smile-llm-replica"]
            ray.kill(ray.get_actor(f"SERVE_REPLICA::{name}#ModelReplica#{victim}", namespace="serve"),
                     no_restart=True)

    run = drive(url, conversations, args, on_request)
    deadline = time.monotonic() + 600
    while running(name) != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    return run, time.monotonic() - kill_at["t"]


def summary_cost(pages: int, page_size: int = 16, seed: int = 0) -> tuple[float, float, int]:
    """Milliseconds for a replica's complete summary of a radix tree of about ``pages`` pages (conversations of 64
    pages sharing 8 system prompts of 16), the first time and once the nodes remember their hashes; the hashes."""
    import numpy as np

    from smile_llm.cache.radix import RadixCache

    rng = np.random.default_rng(seed)
    tree, slot = RadixCache(page_size), 0
    systems = [rng.integers(0, 50_000, 16 * page_size) for _ in range(8)]
    while len(tree) < pages * page_size:
        seq = np.concatenate([systems[int(rng.integers(0, 8))], rng.integers(0, 50_000, 48 * page_size)])
        tree.insert(seq.tolist(), list(range(slot, slot + len(seq))))
        slot += len(seq)
    t0 = time.perf_counter()
    n = len(tree.page_prefix_hashes())
    t1 = time.perf_counter()
    tree.page_prefix_hashes()
    return 1000 * (t1 - t0), 1000 * (time.perf_counter() - t1), n


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tenants", type=int, default=8)
    p.add_argument("--system-chars", type=int, default=1200)
    p.add_argument("--conversations", type=int, default=48)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-batch-size", type=int, default=4, help="per replica (its KV pool: this x --max-seq-len)")
    p.add_argument("--max-seq-len", type=int, default=2048)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="a small trace, one run")
    args = p.parse_args()
    if args.quick:
        args.conversations, args.turns, args.runs = 16, 3, 1
    import ray
    from ray import serve

    port = free_port()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    url = f"http://127.0.0.1:{port}"
    conversations = trace(args)
    configs = [("1 replica", 1, "cache", 1), ("1 replica, pool of two", 1, "cache", 2)] + [
        (f"2 replicas, {r}", 2, r, 1) for r in ROUTERS]
    figures: dict[str, list[dict[str, float]]] = {c[0]: [] for c in configs}
    try:
        for run_index in range(args.runs):
            for label, replicas, router, pool in configs:
                name = f"{APP}-{router}-{replicas}-{pool}-{run_index}"
                deploy(args, replicas, router, name, pool)
                figures[label].append(drive(url, conversations, args).figures())
                serve.delete(name)
                print(f"run {run_index + 1}/{args.runs} {label}: {figures[label][-1]}", flush=True)
        name = f"{APP}-kill"
        deploy(args, 2, "cache", name)
        killed, recovery = killed_run(url, conversations, args, name)
        serve.delete(name)
    finally:
        serve.shutdown()
        ray.shutdown()
    print(f"\n{args.tenants} tenants, {args.conversations} conversations x {args.turns} turns, "
          f"{args.concurrency} clients, {args.max_tokens} tokens per answer; medians of {args.runs} runs")
    print(f"{'configuration':24} {'hit rate':>9} {'TTFT mean':>10} {'TTFT p99':>9} {'out tok/s':>10} {'req/s':>7}")
    medians = {}
    for label, *_ in configs:
        m = {k: statistics.median(f[k] for f in figures[label]) for k in figures[label][0]}
        medians[label] = m
        print(f"{label:24} {m['hit_rate']:9.3f} {m['ttft_mean_ms']:8.0f}ms {m['ttft_p99_ms']:7.0f}ms "
              f"{m['output_tok_s']:10.1f} {m['requests_s']:7.2f}")
    single = medians["1 replica, pool of two"]["hit_rate"]
    for router in ROUTERS:
        ratio = medians[f"2 replicas, {router}"]["hit_rate"] / single
        print(f"hit rate, 2 replicas {router} / 1 replica with the pool of two: {ratio:.3f}"
              + ("  (goal >= 0.9)" if router == "cache" else ""))
    for pages in (1_000, 10_000, 60_000):
        cold, warm, n = summary_cost(pages)
        print(f"complete summary of a tree of {n} pages: {cold:.1f} ms the first time, {warm:.1f} ms after")
    k = killed.figures()
    print(f"one replica killed after a third of the trace (cache router): {k['completed']:.1%} of "
          f"{len(killed.results)} requests completed; recovery (two replicas running again) {recovery:.1f} s")


if __name__ == "__main__":
    main()
