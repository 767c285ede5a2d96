#!/usr/bin/env python
"""What each sampling option costs per decode step on the default model, at batch 1 and batch 16.

A decode step is one forward of the batch plus the choice of every row's next token (``choice.choose_next``: the
processors, the warpers, the draws). The option's cost is the extra time of that choice over greedy choice, as a
share of a whole plain greedy step at the same batch size:

- the plain step: ``generate_batch`` with plain decoding, the median time per decode step over ``--repeats`` runs;
- the choice: ``choose_next`` on real ``RequestRow`` rows (64 tokens of history each) with the option on, the best of
  5 rounds of ``--iters`` calls (the choice is microseconds; its best round is stable on a noisy machine, where
  whole-run timings vary by +-10%).

    .venv/bin/python benchmarks/sampling_cost.py [--iters 200] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version
from speculative import stdlib_prompts

OPTIONS = {
    "greedy (plain)": {},
    "T=0.8": {"temperature": 0.8, "seed": 1},
    "top_k=40 (T=0.8)": {"temperature": 0.8, "seed": 1, "top_k": 40},
    "min_p=0.05 (T=0.8)": {"temperature": 0.8, "seed": 1, "min_p": 0.05},
    "top_p=0.9 (T=0.8)": {"temperature": 0.8, "seed": 1, "top_p": 0.9},
    "repetition_penalty=1.2": {"repetition_penalty": 1.2},
    "presence+frequency": {"presence_penalty": 0.5, "frequency_penalty": 0.3},
    "logit_bias (4 tokens)": {"logit_bias": {32: 1.0, 101: 0.5, 10: -1.0, 58: 2.0}},
    "min_new_tokens=32": {"min_new_tokens": 32},
    "logprobs=5": {"logprobs": 5},
    "all of them (T=0.8)": {"temperature": 0.8, "seed": 1, "top_k": 40, "min_p": 0.05, "top_p": 0.9,
                            "repetition_penalty": 1.2, "presence_penalty": 0.5, "frequency_penalty": 0.3,
                            "logit_bias": {32: 1.0}, "min_new_tokens": 32, "logprobs": 5},
}
BATCHES = (1, 16)


def step_seconds(lm, prompts: list[str], batch: int, repeats: int) -> float:
    """Median seconds per plain greedy decode step of ``batch`` rows."""
    per_step = []
    for _ in range(repeats + 1):  # the first run warms up
        out = lm.generate_batch([prompts[b % len(prompts)] for b in range(batch)], 64, speculative_tokens=0)
        per_step.append(statistics.median(c.stats["decode_s"] / max(1, len(c.tokens) - 1) for c in out))
    return statistics.median(per_step[1:])


def choice_seconds(lm, prompts: list[str], batch: int, options: dict, iters: int) -> float:
    """Best-of-5 seconds of one ``choose_next`` over ``batch`` rows with ``options`` (64 tokens of history)."""
    from smile_llm.sampling.next_tokens import choose_next
    from smile_llm.serving.request import RequestHandle, SamplingParams

    def row(b: int) -> Any:
        request = lm.serving_context.request(prompts[b % len(prompts)], SamplingParams(1000, **options))
        return lm.serving_context.row(RequestHandle(b + 1, request, lm.serving_loop), b + 1, 0, 4096)

    seqs = [row(b) for b in range(batch)]
    gen = torch.Generator().manual_seed(0)
    for s in seqs:
        for t in torch.randint(0, lm.config.vocab_size, (64,), generator=gen).tolist():
            s.push(t)
    logits = torch.randn(batch, lm.config.vocab_size, generator=gen) * 4
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters):
            choose_next(seqs, logits)
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="50 iterations, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.iters, args.repeats = 50, 1
    torch.set_num_threads(1)
    from smile_llm import LanguageModel

    lm = LanguageModel.default(max_batch_size=16, max_seq_len=512)
    prompts = stdlib_prompts(16, 120)
    step = {b: step_seconds(lm, prompts, b, args.repeats) for b in BATCHES}
    choice = {(b, name): choice_seconds(lm, prompts, b, o, args.iters) for b in BATCHES for name, o in OPTIONS.items()}
    print(f"sampling_cost: default model, plain decode step (forward + choice) at batch 1 and 16, 1 thread; step: "
          f"median of {args.repeats} runs, choice: best of 5 x {args.iters}; torch {torch.__version__}; "
          f"code {code_version()}")
    print(f"plain greedy step: batch 1 {step[1] * 1e3:.2f} ms, batch 16 {step[16] * 1e3:.2f} ms")
    print(f"{'option':24} {'choice b=1':>11} {'cost b=1':>9} {'choice b=16':>12} {'cost b=16':>10}")
    worst = 0.0
    for name in OPTIONS:
        cells = []
        for b in BATCHES:
            extra = choice[(b, name)] - choice[(b, "greedy (plain)")]
            cost = extra / step[b]
            if name != "greedy (plain)":
                worst = max(worst, cost)
            cells.append(f"{choice[(b, name)] * 1e6:8.0f} us {cost:+8.1%}")
        print(f"{name:24} {cells[0]:>21} {cells[1]:>23}")
    print(f"headline: sampling options cost at most {worst:+.1%} of a plain greedy decode step (goal < 5%)")
    lm.close()


if __name__ == "__main__":
    main()
