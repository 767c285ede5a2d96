#!/usr/bin/env python
"""Time of one plain decode step of the default model (``LanguageModel.default()``, CPU, float32) at batch 1 and 8.

Two figures per batch size, both without speculation:

    forward   the target forward of one token per row, ``lm.transformer(tokens [B, 1], start, pool, backend)``,
              plus the greedy argmax of its logits, over rows bound with ``bind_requests(B, ...)`` whose first
              ``--context`` positions were prefilled; a run is ``--steps`` consecutive steps (positions
              ``context .. context + steps - 1``, rewritten by every run).
    generate  ``generate`` (B = 1) or ``generate_batch`` (B = 8) with ``speculative_tokens=0``, prefix reuse off:
              (time of ``1 + steps`` new tokens - time of 1 new token) / steps, so the prefill cancels out.
              Prompts are byte strings that decode past ``--steps`` tokens without an EOS (checked).

Each is reported as wall time and as CPU time of the calling thread (``time.thread_time``: the Python work of a step,
what a per-layer lock and re-validation cost, plus that thread's share of the kernels; it barely moves when other
processes hold the cores, which wall time does). Every figure is the median of ``--repeats`` runs, the two kinds'
runs interleaved; ``--threads`` torch threads (default 2). The script imports ``smile_llm`` from ``PYTHONPATH``
first, so the same script measures another tree:

    .venv/bin/python benchmarks/decode_step.py                          # this tree (~1 min on an idle machine)
    git archive HEAD | tar -x -C /tmp/before
    PYTHONPATH=/tmp/before .venv/bin/python benchmarks/decode_step.py   # the tree at HEAD
    .venv/bin/python benchmarks/decode_step.py --quick
    .venv/bin/python benchmarks/decode_step.py --kv-path   # only the KV path of one forward, on its own pool

``--kv-path`` times what a forward does to the pool, outside the model, on a pool of the default model's shape
(12 layers, 2 KV heads x 32, B=1, one thread, thread CPU, median of 15 x 200 forwards): per layer ``put`` plus the
locked ``key_layer``/``value_layer`` views (the path before ``kv_step``), and, where the tree has it,
``kv_step`` + per layer ``write``/``key_pages``/``value_pages`` + ``commit``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

import numpy as np
import torch

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # after PYTHONPATH
import smile_llm  # noqa: E402
from smile_llm.language_model import LanguageModel  # noqa: E402
from bench_env import code_version  # noqa: E402

PROMPT = "The paged KV cache keeps every request's keys and values in fixed pages of a static pool; "


def prompts(batch: int, context: int) -> list[list[int]]:
    """``batch`` distinct byte prompts of ``context`` tokens."""
    text = (PROMPT * (context // len(PROMPT) + 2)).encode()
    return [list(text[b : b + context]) for b in range(batch)]


def clocks() -> np.ndarray:
    """Wall and calling-thread CPU seconds."""
    return np.array([time.perf_counter(), time.thread_time()])


def time_forward(lm: LanguageModel, batch: int, context: int, steps: int) -> np.ndarray:
    """Wall and thread-CPU seconds per decode forward: a run of ``steps`` steps over rows prefilled to ``context``."""
    pool, dev = lm.pool, lm.pool.device
    pool.bind_requests(batch, context + steps)
    try:
        prompt = torch.tensor(prompts(batch, context), dtype=torch.int64, device=dev)
        out = lm.transformer(prompt, np.zeros(batch, dtype=np.int64), pool, lm.backend)
        first = out.logits[:, -1].argmax(-1, keepdim=True)
        t0 = clocks()
        tokens = first
        for i in range(steps):
            out = lm.transformer(tokens, np.full(batch, context + i, dtype=np.int64), pool, lm.backend)
            tokens = out.logits[:, -1].argmax(-1, keepdim=True)
        return (clocks() - t0) / steps
    finally:
        pool.unbind_requests()


def time_generate(lm: LanguageModel, batch: int, context: int, steps: int) -> np.ndarray:
    """Wall and thread-CPU seconds per plain decode step through ``generate``/``generate_batch`` (prefill
    subtracted)."""
    ps = prompts(batch, context)

    def run(new_tokens: int) -> np.ndarray:
        t0 = clocks()
        if batch == 1:
            done = [lm.generate(ps[0], max_new_tokens=new_tokens, speculative_tokens=0)]
        else:
            done = lm.generate_batch(ps, max_new_tokens=new_tokens, speculative_tokens=0)
        elapsed = clocks() - t0
        short = [len(c.tokens) for c in done if len(c.tokens) != new_tokens]
        if short:
            raise SystemExit(f"a prompt stopped early ({short} of {new_tokens} tokens); change PROMPT")
        return elapsed

    return (run(1 + steps) - run(1)) / steps


def time_kv_path() -> dict[str, float]:
    """Thread-CPU microseconds of one forward's KV path (see the module docstring), by path name."""
    from smile_llm.cache import KvCachePool

    layers, heads, dim = 12, 2, 32
    pool = KvCachePool(layers, 8192, heads, dim, 16)
    pool.prefix_reuse_enabled = False
    pool.bind_requests(1, 1024)
    k, v = torch.randn(1, 1, heads, dim), torch.randn(1, 1, heads, dim)
    paged = (-1, 16, heads, dim)

    def per_layer_put(pos: int) -> None:
        for layer in range(layers):
            pool.put(layer, pos, k, v)
            pool.key_layer(layer).view(paged)
            pool.value_layer(layer).view(paged)

    def handle(pos: int) -> None:
        kv = pool.kv_step(pos, 1)
        for layer in range(layers):
            kv.write(layer, k, v)
            kv.key_pages(layer)
            kv.value_pages(layer)
        kv.commit()

    paths = {"put per layer": per_layer_put}
    if hasattr(pool, "kv_step"):
        paths["kv_step handle"] = handle
    times: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(15):
        for name, fn in paths.items():
            t0 = time.thread_time()
            for i in range(200):
                fn(256 + i)
            times[name].append((time.thread_time() - t0) / 200 * 1e6)
    pool.close()
    return {name: float(np.median(t)) for name, t in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--context", type=int, default=256, help="prompt tokens written before the timed steps")
    p.add_argument("--steps", type=int, default=32, help="decode steps per timed run")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="16 steps, 3 repeats")
    p.add_argument("--kv-path", action="store_true", help="only the KV path of one forward (see above)")
    args = p.parse_args()
    if args.kv_path:
        torch.set_num_threads(1)
        print(f"decode_step --kv-path: smile_llm from {os.path.dirname(os.path.abspath(smile_llm.__file__))}, "
              f"load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for name, us in time_kv_path().items():
            print(f"{name:>15}: {us:.0f} us thread CPU per forward (12 layers, B=1)")
        return
    if args.quick:
        args.steps, args.repeats = 16, 3
    torch.set_num_threads(args.threads)
    lm = LanguageModel.default(cuda_graphs=False)
    lm.pool.prefix_reuse_enabled = False
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"decode_step: smile_llm from {os.path.dirname(os.path.abspath(smile_llm.__file__))} "
          f"({code_version()} of the benchmark's checkout), python {platform.python_version()}, "
          f"torch {torch.__version__}, {args.threads} threads, {os.cpu_count()} cpus (load average {load})")
    print(f"context {args.context}, {args.steps} steps per run, medians of {args.repeats} runs")
    print(f"{'B':>3} {'forward wall':>13} {'forward cpu':>12} {'generate wall':>14} {'generate cpu':>13}  (us/step)")
    figures = {}
    for batch in (1, 8):
        time_forward(lm, batch, args.context, 4)  # warm-up
        forward, generate = [], []
        for _ in range(args.repeats):
            forward.append(time_forward(lm, batch, args.context, args.steps))
            generate.append(time_generate(lm, batch, args.context, args.steps))
        f = np.median(np.array(forward), axis=0) * 1e6
        g = np.median(np.array(generate), axis=0) * 1e6
        figures[batch] = f
        print(f"{batch:>3} {f[0]:>13.0f} {f[1]:>12.0f} {g[0]:>14.0f} {g[1]:>13.0f}")
    lm.close()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"(load average at the end {load})")
    print(f"headline: plain decode forward {figures[1][0]:.0f} us wall / {figures[1][1]:.0f} us thread CPU at B=1, "
          f"{figures[8][0]:.0f} / {figures[8][1]:.0f} us at B=8")


if __name__ == "__main__":
    main()
