#!/usr/bin/env python
"""``n = 8`` samples of one prompt against 8 separate requests for it, on the default model (one torch thread).

- ``n=8``: ``generate(prompt, n=8)``: the samples share the prompt's KV (sample 0 computes it, the others bind on
  the cached pages and recompute only the part after the last full page).
- ``8 requests, no reuse``: ``generate_batch([prompt] * 8)`` with prefix reuse switched off, so each request
  computes its own prompt (what a server without a prefix cache does with 8 identical requests).
- ``8 requests, reuse``: the same with prefix reuse on (in-batch prefix sharing makes them wait for one prefill).

Each run starts cold: every repeat uses a fresh prompt (a different stdlib module), so nothing is cached from an
earlier run. Reported: wall time (medians of ``--repeats`` interleaved runs), the prompt positions computed and the
pages the pool held at the end (the prompt pages are shared once, the rows' own pages apart).

    .venv/bin/python benchmarks/n_samples.py [--prompt-bytes 1500] [--new 32] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version
from speculative import stdlib_prompts

N = 8
RUNS = ("n=8", "8 requests, no reuse", "8 requests, reuse")


def run(lm: Any, name: str, prompt: str, new: int) -> tuple[float, int]:
    """Seconds and prompt positions computed for one cold run."""
    lm.pool.prefix_reuse_enabled = name != "8 requests, no reuse"
    t0 = time.perf_counter()
    if name == "n=8":
        outs = lm.generate(prompt, new, n=N, temperature=0.8, seed=7)
    else:
        outs = lm.generate_batch([prompt] * N, new, temperature=0.8, seed=7)
    took = time.perf_counter() - t0
    assert len(outs) == N
    computed = sum(len(c.prompt_tokens) - c.stats["cached_tokens"] for c in outs)
    lm.pool.prefix_reuse_enabled = True
    return took, computed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt-bytes", type=int, default=1500)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="600-byte prompts, 16 new tokens, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.prompt_bytes, args.new, args.repeats = 600, 16, 1
    torch.set_num_threads(1)
    from smile_llm import LanguageModel

    lm = LanguageModel.default(max_batch_size=N, max_seq_len=2048)
    prompts = stdlib_prompts(len(RUNS) * (args.repeats + 1), args.prompt_bytes)
    times: dict[str, list[float]] = {}
    computed: dict[str, int] = {}
    for rep in range(args.repeats + 1):  # the first round warms up
        for i, name in enumerate(RUNS):
            took, positions = run(lm, name, prompts[rep * len(RUNS) + i], args.new)
            if rep:
                times.setdefault(name, []).append(took)
                computed[name] = positions
    tokens = len(lm.encode(prompts[0]))
    print(f"n_samples: default model, {N} samples of a ~{tokens}-token prompt, {args.new} new tokens each, T=0.8, "
          f"MTP speculation on, 1 thread, medians of {args.repeats}; torch {torch.__version__}; "
          f"code {code_version()}")
    print(f"{'run':24} {'wall':>10} {'prompt positions computed':>27} {'vs n=8':>8}")
    base = statistics.median(times["n=8"])
    for name in RUNS:
        t = statistics.median(times[name])
        print(f"{name:24} {t * 1e3:7.0f} ms {computed[name]:>27} {t / base:7.2f}x")
    ratio = statistics.median(times["8 requests, no reuse"]) / base
    print(f"headline: n=8 samples {ratio:.2f}x faster than 8 separate requests without prefix reuse; prompt "
          f"positions computed {computed['n=8']} vs {computed['8 requests, no reuse']}")
    lm.close()


if __name__ == "__main__":
    main()
