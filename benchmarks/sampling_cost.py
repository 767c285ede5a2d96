#!/usr/bin/env python
"""What each sampling option costs per decode step on the default model, at batch 1 and batch 16: tokens/s of
plain decoding (greedy, no option) against the same run with one option on (``top_k``, ``min_p``,
``repetition_penalty``, presence/frequency penalties, ``logit_bias``), and everything at once. Speculation off, so
every step is one forward and one choice per row; medians of ``--repeats`` interleaved runs, one torch thread.
Options that sample are compared with sampling at the same temperature alone, the others with greedy decoding.

    .venv/bin/python benchmarks/sampling_cost.py [--new 64] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version
from speculative import stdlib_prompts

OPTIONS = {
    "plain": {},
    "top_k=40 (T=0.8)": {"temperature": 0.8, "seed": 1, "top_k": 40},
    "min_p=0.05 (T=0.8)": {"temperature": 0.8, "seed": 1, "min_p": 0.05},
    "T=0.8 alone": {"temperature": 0.8, "seed": 1},
    "repetition_penalty=1.2": {"repetition_penalty": 1.2},
    "presence+frequency": {"presence_penalty": 0.5, "frequency_penalty": 0.3},
    "logit_bias (4 tokens)": {"logit_bias": {32: 1.0, 101: 0.5, 10: -1.0, 58: 2.0}},
    "all of them (T=0.8)": {"temperature": 0.8, "seed": 1, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.2,
                            "presence_penalty": 0.5, "frequency_penalty": 0.3, "logit_bias": {32: 1.0}},
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="24 new tokens, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.new, args.repeats = 24, 1
    torch.set_num_threads(1)
    from smile_llm import LanguageModel

    lm = LanguageModel.default(max_batch_size=16, max_seq_len=512)
    prompts = stdlib_prompts(16, 120)
    times: dict[tuple[int, str], list[float]] = {}
    for rep in range(args.repeats + 1):  # the first round warms up
        for batch in (1, 16):
            for name, options in OPTIONS.items():
                t0 = time.perf_counter()
                if batch == 1:
                    lm.generate(prompts[0], args.new, speculative_tokens=0, **options)
                else:
                    lm.generate_batch(prompts, args.new, speculative_tokens=0, **options)
                if rep:
                    times.setdefault((batch, name), []).append(time.perf_counter() - t0)
    print(f"sampling_cost: default model, {args.new} new tokens, plain decoding, 1 thread, medians of "
          f"{args.repeats}; torch {torch.__version__}; code {code_version()}")
    print(f"{'option':26} {'batch 1':>16} {'batch 16':>16}")
    worst = 0.0
    for name in OPTIONS:
        cells = []
        for batch in (1, 16):
            peer = "T=0.8 alone" if "temperature" in OPTIONS[name] and name != "T=0.8 alone" else "plain"
            t, base = statistics.median(times[(batch, name)]), statistics.median(times[(batch, peer)])
            cost = t / base - 1
            if name not in ("plain", "T=0.8 alone"):
                worst = max(worst, cost)
            cells.append(f"{t * 1e3:8.0f} ms {cost:+6.1%}")
        print(f"{name:26} {cells[0]:>16} {cells[1]:>16}")
    print(f"headline: sampling options cost at most {worst:+.1%} of a plain decode run (goal < 5%)")
    lm.close()


if __name__ == "__main__":
    main()
