#!/usr/bin/env python
"""Many callers on one model: ``--threads`` Python threads each call ``lm.generate()`` at once (greedy, ``--new``
tokens, a different prompt each) against the same requests one after another from one thread, on the default
model, in the same process. The concurrent calls are batched on the model's one scheduler (continuous batching);
every output is checked equal to its sequential (solo) output. Prints the wall time of both and the throughput
ratio (sequential time / concurrent time; the goal is >= 4x at 16 threads), medians of ``--repeats``.

    .venv/bin/python benchmarks/concurrent_generate.py [--threads 16] [--new 64] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402
from speculative import stdlib_prompts  # noqa: E402


def run_concurrent(lm, prompts: list[str], new: int, spec: int | None) -> tuple[float, list[list[int]]]:
    out: list[list[int]] = [[] for _ in prompts]
    barrier = threading.Barrier(len(prompts) + 1)

    def call(i: int) -> None:
        barrier.wait()
        out[i] = lm.generate(prompts[i], new, speculative_tokens=spec).tokens

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, out


def run_sequential(lm, prompts: list[str], new: int, spec: int | None) -> tuple[float, list[list[int]]]:
    t0 = time.perf_counter()
    out = [lm.generate(p, new, speculative_tokens=spec).tokens for p in prompts]
    return time.perf_counter() - t0, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--prompt-bytes", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.threads, args.new, args.repeats = 8, 32, 1
    torch.set_num_threads(2)
    from smile_llm import LanguageModel

    print(f"code {code_version()}; torch threads {torch.get_num_threads()}; {args.threads} callers x {args.new} "
          f"greedy tokens, prompts of {args.prompt_bytes} bytes")
    lm = LanguageModel.default(max_batch_size=args.threads, max_seq_len=512)  # a pool sized for every caller
    lm.pool.prefix_reuse_enabled = False  # every run prefills its prompt, sequential and concurrent alike
    prompts = stdlib_prompts(args.threads, args.prompt_bytes)
    lm.generate(prompts[0], 8)  # warm-up
    ratios = {}
    for label, spec in (("speculative (model default k)", None), ("plain", 0)):
        seq_t, conc_t = [], []
        for _ in range(args.repeats):
            t, solo = run_sequential(lm, prompts, args.new, spec)
            seq_t.append(t)
            t, together = run_concurrent(lm, prompts, args.new, spec)
            conc_t.append(t)
            assert together == solo, "a concurrent caller's output differs from its solo output"
        s, c = statistics.median(seq_t), statistics.median(conc_t)
        tokens = args.threads * args.new
        ratios[label] = s / c
        print(f"{label:32s} sequential {s:6.2f} s ({tokens / s:6.1f} tok/s)  concurrent {c:6.2f} s "
              f"({tokens / c:6.1f} tok/s)  ratio {s / c:5.2f}x  outputs identical")
    print(f"scheduler preemptions: {lm.serving_loop.scheduler.preemptions}")
    lm.close()
    best = ratios["speculative (model default k)"]
    print(f"headline: {args.threads} threads calling generate() at once: {best:.2f}x the sequential throughput "
          f"(speculative), {ratios['plain']:.2f}x (plain); outputs identical to solo")


if __name__ == "__main__":
    main()
