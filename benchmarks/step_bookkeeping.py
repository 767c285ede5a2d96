#!/usr/bin/env python
"""Per-step pool bookkeeping of decode and speculative verify, against context length.

A decode step of a model on this pool does, outside its kernels::

    pool.activate_step(*ids)                      # the same cohort as the last step: keeps the step CSR
    pool.prepare_decode_graph_step(L + 1, L)      # step CSR (reuse / bump / rebuild) + fixed [B] write index
    pool.seal_length(L + 1)                       # what attention may see

and a speculative round of W = drafts + 1 tokens does ``prepare_verify_graph_step(L + W, L, W)`` (fixed verify CSR
+ [B*W] write index) then ``truncate_to(L + accepted, L + W)``. None of this may grow with the context: the CSR is
rebuilt only when a page boundary is crossed (once every ``page_size`` decode steps), otherwise bumped in place.
The script times a run of ``--steps`` consecutive steps (so page-boundary rebuilds are included at their real rate)
for B in {1, 16, 64} and contexts {1k, 8k, 32k}, medians of ``--repeats`` runs, and prints cost(ctx)/cost(1k).
Goal: cost(32k)/cost(1k) <= 1.5.

    .venv/bin/python benchmarks/step_bookkeeping.py            # defaults (about 1 min)
    .venv/bin/python benchmarks/step_bookkeeping.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from smile_llm.cache import KvCachePool

PAGE = 16


def make_pool(batch: int, ctx: int, steps: int) -> tuple[KvCachePool, list[int]]:
    capacity = ctx + 5 * steps + 32  # room for a verify window of 4 tokens per step
    pool = KvCachePool(1, batch * capacity, 1, 8, PAGE)
    pool.prefix_reuse_enabled = False
    ids = [pool.bind_request([1], capacity) for _ in range(batch)]
    pool.activate_step(*ids)
    pool.put(0, 0, torch.zeros(batch, ctx, 1, 8), torch.zeros(batch, ctx, 1, 8))  # the context is written
    return pool, ids


def time_decode(batch: int, ctx: int, steps: int) -> float:
    pool, ids = make_pool(batch, ctx, steps)
    pool.decode_graph_buffers = True
    t0 = time.perf_counter()
    for length in range(ctx, ctx + steps):
        pool.activate_step(*ids)
        pool.prepare_decode_graph_step(length + 1, length)
        pool.seal_length(length + 1)
    elapsed = time.perf_counter() - t0
    pool.check_invariants()
    pool.close()
    return elapsed / steps


def time_verify(batch: int, ctx: int, steps: int, window: int = 4) -> float:
    pool, ids = make_pool(batch, ctx, steps)
    length = ctx
    t0 = time.perf_counter()
    for i in range(steps):
        pool.activate_step(*ids)
        pool.prepare_verify_graph_step(length + window, length, window)
        accepted = 1 + i % window  # 1..W tokens kept, like real acceptance
        pool.truncate_to(length + accepted, length + window)
        length += accepted
    elapsed = time.perf_counter() - t0
    pool.check_invariants()
    pool.close()
    return elapsed / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=256, help="consecutive steps per timed run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="fewer steps and repeats, contexts 1k and 8k")
    args = p.parse_args()
    torch.set_num_threads(1)
    contexts = [1024, 8192, 32768]
    if args.quick:
        args.steps, args.repeats, contexts = 64, 3, [1024, 8192]
    print(f"step_bookkeeping: page_size {PAGE}, {args.steps} consecutive steps per run, medians of {args.repeats} "
          f"runs; torch {torch.__version__}")
    print(f"{'kind':8} {'B':>3} {'ctx':>6} {'us/step':>9} {'vs 1k':>7}")
    worst = 0.0
    for kind, fn in (("decode", time_decode), ("verify", time_verify)):
        for batch in (1, 16, 64):
            base = None
            for ctx in contexts:
                us = statistics.median(fn(batch, ctx, args.steps) for _ in range(args.repeats)) * 1e6
                base = base or us
                ratio = us / base
                worst = max(worst, ratio)
                print(f"{kind:8} {batch:>3} {ctx:>6} {us:>9.1f} {ratio:>7.2f}")
    print(f"worst cost(ctx)/cost(1k): {worst:.2f} (goal <= 1.5)")
    print(f"headline: step bookkeeping worst cost(ctx)/cost(1k) {worst:.2f} (goal <= 1.5)")


if __name__ == "__main__":
    main()
