#!/usr/bin/env python
"""Synthetic multi-turn chat trace driving a real KvCachePool (radix prefix cache + paged KV buffers).

The trace: a few shared system prompts; a few hundred conversations, each bound to one system prompt and made of
several turns (user message, then response); the turns of different conversations are interleaved at random
(fixed seed; a conversation's turns stay in order). Turn t of a conversation sends the prompt
``system + u1 + r1 + ... + u_t`` and gets the response ``r_t``.

Per request (the way ``generate()`` drives the pool)::

    matched = pool.bind_with_prefix(prompt, len(prompt) + len(response))
    pool.put(0, matched, k, v)                   # the unmatched prompt part plus the response, real KV
    pool.finish_exclusive(prompt + response)     # inserts the written, page-aligned sequence into the tree

The KV layout is tiny (1 layer, 1 KV head, head_dim 8, float32) so the put is cheap but real: the pool only
inserts KV that was written (``kv_len``). K and V encode (token, position), so ``--check-every N`` can read the
whole window back and verify that the prefix pages the tree handed out hold the right tokens at the right
positions. The pool holds a fraction of the trace's unique tokens, so LRU eviction happens.

The same trace then runs with ``pool.prefix_reuse_enabled = False`` (the peer): every prompt token is computed.

Timing covers the pool calls only (bind, put, finish); building the per-request K/V tensors is outside it.
Wall-clock figures are medians over ``--repeats`` runs, reuse and peer interleaved; one extra run under tracemalloc
measures the Python-heap growth (the tree) and its peak.

    .venv/bin/python benchmarks/cache_trace.py            # defaults (~20 s on 2 cores)
    .venv/bin/python benchmarks/cache_trace.py --quick    # ~4 s
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import statistics
import sys
import time
import tracemalloc
from dataclasses import dataclass, field

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smile_llm.cache import KvCachePool  # noqa: E402
from bench_env import code_version  # noqa: E402

HEAD_DIM = 8


# ---------------------------------------------------------------------------------------------------- the trace
@dataclass
class Trace:
    sequences: list[np.ndarray]  # per conversation: the full token sequence (system + u1 + r1 + ...)
    requests: list[tuple[int, int, int]]  # (conversation, prompt_end, response_end), in arrival order
    ideal_matched: np.ndarray  # per request: the match an infinite cache would give (same page/last-token rules)
    unique_tokens: int  # tokens an infinite cache would hold: system prompts + every user/response token
    system_lens: list[int]


def page_floor(n: int, page: int) -> int:
    return (n // page) * page


def build_trace(args: argparse.Namespace) -> Trace:
    rng = np.random.default_rng(args.seed)
    systems = [rng.integers(0, args.vocab, int(rng.integers(args.system_len[0], args.system_len[1] + 1)),
                            dtype=np.int64) for _ in range(args.system_prompts)]
    sequences: list[np.ndarray] = []
    turn_bounds: list[list[tuple[int, int]]] = []
    conv_system: list[int] = []
    for _ in range(args.conversations):
        s = int(rng.integers(0, args.system_prompts))
        parts = [systems[s]]
        pos = len(systems[s])
        bounds = []
        for _ in range(int(rng.integers(args.turns[0], args.turns[1] + 1))):
            user = rng.integers(0, args.vocab, int(rng.integers(args.user_len[0], args.user_len[1] + 1)),
                                dtype=np.int64)
            resp = rng.integers(0, args.vocab, int(rng.integers(args.response_len[0], args.response_len[1] + 1)),
                                dtype=np.int64)
            parts += [user, resp]
            bounds.append((pos + len(user), pos + len(user) + len(resp)))
            pos += len(user) + len(resp)
        sequences.append(np.concatenate(parts))
        turn_bounds.append(bounds)
        conv_system.append(s)
    order = np.repeat(np.arange(args.conversations), [len(b) for b in turn_bounds])
    rng.shuffle(order)
    next_turn = [0] * args.conversations
    requests: list[tuple[int, int, int]] = []
    ideal = np.zeros(len(order), dtype=np.int64)
    own_inserted = [0] * args.conversations  # page-aligned tokens the conversation's last finish inserted
    system_seen = [False] * args.system_prompts
    ps = args.page_size
    for i, c in enumerate(order.tolist()):
        prompt_end, resp_end = turn_bounds[c][next_turn[c]]
        next_turn[c] += 1
        requests.append((c, prompt_end, resp_end))
        s = conv_system[c]
        shared = page_floor(len(systems[s]), ps) if system_seen[s] else 0
        ideal[i] = min(page_floor(prompt_end - 1, ps), max(own_inserted[c], shared))
        own_inserted[c] = page_floor(resp_end, ps)
        system_seen[s] = True
    unique = sum(len(x) for x in systems) + sum(len(seq) - len(systems[conv_system[c]])
                                                for c, seq in enumerate(sequences))
    return Trace(sequences, requests, ideal, unique, [len(x) for x in systems])


def kv_for(tokens: np.ndarray, start: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V ``[1, n, 1, HEAD_DIM]`` encoding (token, position): K = (tok, pos, 1, 0...), V = (-tok, pos + .5, ...)."""
    n = len(tokens)
    tok = torch.from_numpy(tokens).to(torch.float32)
    pos = torch.arange(start, start + n, dtype=torch.float32)
    k = torch.zeros(1, n, 1, HEAD_DIM)
    v = torch.zeros(1, n, 1, HEAD_DIM)
    k[0, :, 0, 0], k[0, :, 0, 1], k[0, :, 0, 2] = tok, pos, 1.0
    v[0, :, 0, 0], v[0, :, 0, 1] = -tok, pos + 0.5
    return k, v


def verify_window(pool: KvCachePool, seq: np.ndarray, end: int, request: int) -> None:
    """Read positions [0, end) back and compare with what the (token, position) encoding says they must hold."""
    k, v = pool.get(0, end)
    want_k, want_v = kv_for(seq[:end], 0)
    if not (torch.equal(k, want_k) and torch.equal(v, want_v)):
        bad = int(torch.nonzero((k != want_k).any(-1).any(-1).reshape(-1))[0])
        raise AssertionError(f"request {request}: KV read back at position {bad} holds token "
                             f"{k[0, bad, 0, 0].item():.0f} pos {k[0, bad, 0, 1].item():.0f}, want token "
                             f"{int(seq[bad])} pos {bad}")


# ---------------------------------------------------------------------------------------------------- one run
@dataclass
class RunResult:
    reuse: bool
    pool_seconds: float = 0.0
    wall_seconds: float = 0.0
    prompt_tokens: int = 0
    matched_tokens: int = 0
    computed_prompt_tokens: int = 0
    written_tokens: int = 0
    clamped: int = 0
    rejected: int = 0
    above_ideal: int = 0
    below_ideal: int = 0
    latency_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # bind + finish per request
    stats: dict = field(default_factory=dict)
    heap_growth: int = 0
    heap_peak: int = 0


def run_trace(trace: Trace, num_slots: int, args: argparse.Namespace, reuse: bool,
              trace_malloc: bool = False) -> RunResult:
    pool = KvCachePool(1, num_slots, 1, HEAD_DIM, page_size=args.page_size, dtype=torch.float32)
    pool.prefix_reuse_enabled = reuse
    res = RunResult(reuse)
    lat = np.zeros(len(trace.requests), dtype=np.int64)
    perf = time.perf_counter_ns
    gc.collect()
    if trace_malloc:
        tracemalloc.start()
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
    wall0 = perf()
    pool_ns = 0
    for i, (c, prompt_end, resp_end) in enumerate(trace.requests):
        seq = trace.sequences[c]
        prompt = seq[:prompt_end]
        if prompt_end > num_slots:  # bind_with_prefix raises ValueError: even the prompt does not fit
            res.rejected += 1
            continue
        t0 = perf()
        matched = pool.bind_with_prefix(prompt, resp_end)
        t1 = perf()
        end = min(resp_end, pool.request_capacity)
        res.clamped += end < resp_end
        k, v = kv_for(seq[matched:end], matched)
        t2 = perf()
        pool.put(0, matched, k, v)
        t3 = perf()
        if args.check_every and (i + 1) % args.check_every == 0:
            verify_window(pool, seq, end, i)
            pool.check_invariants()
        t4 = perf()
        pool.finish_exclusive(seq[:resp_end])
        t5 = perf()
        lat[i] = (t1 - t0) + (t5 - t4)
        pool_ns += (t1 - t0) + (t3 - t2) + (t5 - t4)
        res.prompt_tokens += prompt_end
        res.matched_tokens += matched
        res.computed_prompt_tokens += prompt_end - matched
        res.written_tokens += end - matched
        if reuse:
            res.above_ideal += matched > trace.ideal_matched[i]
            res.below_ideal += matched < trace.ideal_matched[i]
    res.wall_seconds = (perf() - wall0) / 1e9
    if trace_malloc:
        cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        res.heap_growth, res.heap_peak = cur - base, peak - base
    res.pool_seconds = pool_ns / 1e9
    res.latency_ns = lat
    pool.check_invariants()
    res.stats = pool.stats()
    pool.close()
    return res


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--system-prompts", type=int, default=4, help="shared system prompts")
    p.add_argument("--system-len", type=int, nargs=2, default=(1024, 2048), metavar=("MIN", "MAX"))
    p.add_argument("--conversations", type=int, default=500)
    p.add_argument("--turns", type=int, nargs=2, default=(2, 10), metavar=("MIN", "MAX"))
    p.add_argument("--user-len", type=int, nargs=2, default=(16, 256), metavar=("MIN", "MAX"))
    p.add_argument("--response-len", type=int, nargs=2, default=(16, 384), metavar=("MIN", "MAX"))
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--pool-fraction", type=float, default=0.25,
                   help="pool size as a fraction of the trace's unique tokens (< 1 forces eviction)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per mode (medians are printed)")
    p.add_argument("--check-every", type=int, default=0, metavar="N",
                   help="every N requests: read the window back and verify it, and check_invariants() "
                        "(0: only check_invariants at the end of each run)")
    p.add_argument("--no-peer", action="store_true", help="skip the prefix_reuse_enabled=False peer")
    p.add_argument("--no-tracemalloc", action="store_true", help="skip the extra run under tracemalloc")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads (0: torch's default); the K/V copies here are tiny")
    p.add_argument("--quick", action="store_true", help="a few-second run: 80 conversations of 2-6 turns")
    args = p.parse_args(argv)
    if args.quick:
        args.conversations, args.turns = 80, (2, 6)
    return args


def fmt_ms(ns: float) -> str:
    return f"{ns / 1e3:.1f} us"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    trace = build_trace(args)
    n_req = len(trace.requests)
    prompt_total = sum(p for _, p, _ in trace.requests)
    num_slots = max(args.page_size, page_floor(int(trace.unique_tokens * args.pool_fraction), args.page_size))
    max_seq = max(len(s) for s in trace.sequences)
    print(f"cache_trace: smile_llm {code_version()}, python {platform.python_version()}, "
          f"torch {torch.__version__}, "
          f"{os.cpu_count()} cpus (load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}), "
          f"{torch.get_num_threads()} torch threads")
    print(f"trace: seed {args.seed}, {args.system_prompts} system prompts of {min(trace.system_lens)}-"
          f"{max(trace.system_lens)} tokens, {args.conversations} conversations, {n_req} requests, "
          f"{prompt_total:,} prompt tokens, {trace.unique_tokens:,} unique tokens, longest sequence {max_seq} "
          f"(built in {time.perf_counter() - t0:.1f} s)")
    print(f"pool: page_size {args.page_size}, {num_slots:,} slots ({num_slots // args.page_size:,} pages) = "
          f"{num_slots / trace.unique_tokens:.0%} of the unique tokens; layout 1 layer x 1 KV head x "
          f"head_dim {HEAD_DIM}, float32")
    if max_seq > num_slots:
        print("  warning: the longest sequence does not fit the pool; such requests are clamped")

    runs: dict[bool, list[RunResult]] = {True: [], False: []}
    modes = [True] if args.no_peer else [True, False]
    for rep in range(args.repeats):
        for reuse in (modes if rep % 2 == 0 else modes[::-1]):
            runs[reuse].append(run_trace(trace, num_slots, args, reuse))
    for reuse in modes:  # the counters of a seeded trace must not change between runs
        keys = {(r.matched_tokens, r.stats["prefix_evict_tokens"], r.clamped) for r in runs[reuse]}
        if len(keys) != 1:
            print(f"  WARNING: runs with reuse={reuse} disagree on counters: {sorted(keys)}")

    r = runs[True][0]
    st = r.stats
    pool_s = statistics.median(x.pool_seconds for x in runs[True])
    wall_s = statistics.median(x.wall_seconds for x in runs[True])
    p50 = statistics.median(float(np.percentile(x.latency_ns, 50)) for x in runs[True])
    p99 = statistics.median(float(np.percentile(x.latency_ns, 99)) for x in runs[True])
    print(f"\nwith prefix reuse (median of {args.repeats} runs; times are the pool calls bind+put+finish):")
    served = n_req - r.rejected
    print(f"  requests/s            {served / pool_s:,.0f}   ({pool_s:.2f} s in pool calls, "
          f"{wall_s:.2f} s wall incl. building K/V)")
    print(f"  prompt tokens/s       {r.prompt_tokens / pool_s:,.0f}")
    print(f"  bind+finish latency   p50 {fmt_ms(p50)}, p99 {fmt_ms(p99)}")
    print(f"  prefix hit rate       {st['prefix_hit_rate']:.4f} (stats), matched/prompt tokens "
          f"{r.matched_tokens / r.prompt_tokens:.4f} ({r.matched_tokens:,} / {r.prompt_tokens:,}); "
          f"infinite-cache ideal {trace.ideal_matched.sum() / prompt_total:.4f}")
    print(f"  evicted tokens        {st['prefix_evict_tokens']:,} (inserted {st['prefix_insert_tokens']:,}, "
          f"cached at end {st['cached_tokens']:,})")
    print(f"  KV tokens written     {r.written_tokens:,}; clamped requests {r.clamped}"
          + (f"; {r.rejected} requests skipped (prompt longer than the pool)" if r.rejected else ""))
    if r.above_ideal:
        print(f"  ERROR: {r.above_ideal} requests matched MORE than an infinite cache could")
    print(f"  requests below ideal  {r.below_ideal} (misses caused by eviction)")
    if st["prefix_evict_tokens"] == 0 and r.below_ideal:
        print("  ERROR: no eviction happened, yet some requests matched less than the ideal")

    if not args.no_peer:
        q = runs[False][0]
        peer_s = statistics.median(x.pool_seconds for x in runs[False])
        peer_p50 = statistics.median(float(np.percentile(x.latency_ns, 50)) for x in runs[False])
        print(f"\npeer: prefix_reuse_enabled = False (same trace, same process, median of {args.repeats} runs):")
        print(f"  requests/s            {served / peer_s:,.0f}   ({peer_s:.2f} s in pool calls; bind+finish p50 "
              f"{fmt_ms(peer_p50)})")
        ratio = q.computed_prompt_tokens / max(r.computed_prompt_tokens, 1)
        print(f"  prompt tokens computed {q.computed_prompt_tokens:,} without reuse vs "
              f"{r.computed_prompt_tokens:,} with reuse: ratio {ratio:.2f}x")
        print(f"  KV tokens written      {q.written_tokens:,} without reuse vs {r.written_tokens:,} with reuse")

    print("\nmemory:")
    if not args.no_tracemalloc:
        m = run_trace(trace, num_slots, args, True, trace_malloc=True)
        cached = m.stats["cached_tokens"]
        print(f"  tracemalloc (reuse run): Python heap grew {m.heap_growth / 2**20:.1f} MiB by the end "
              f"(tree of {cached:,} cached tokens: {m.heap_growth / max(cached, 1):.1f} B/token; key+value arrays "
              f"alone are 16 B/token), peak {m.heap_peak / 2**20:.1f} MiB above the start")
    kv_bytes = 2 * num_slots * HEAD_DIM * 4
    print(f"  KV buffers {kv_bytes / 2**20:.1f} MiB (torch, not traced); maxrss "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB (whole process, incl. the trace)")
    if not args.no_peer:
        print(f"headline: cache trace hit rate {r.stats['prefix_hit_rate']:.3f}, {ratio:.2f}x fewer prompt tokens "
              f"computed with reuse, {served / statistics.median(x.pool_seconds for x in runs[True]):,.0f} "
              f"requests/s in pool calls")
    print("check_invariants: passed at the end of every run"
          + (f", and every {args.check_every} requests with the KV read back and verified" if args.check_every
             else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
