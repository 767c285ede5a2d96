#!/usr/bin/env python
"""The compiled forward (``from_pretrained(compile=True)``) against this project's eager forward, same weights, same
process, on the shipped models (``--kinds``, default dense and hybrid; CPU, float32).

Per kind and side (eager, compiled), each the median of ``--repeats`` runs with the sides' runs interleaved:

    decode B=1     plain decode through ``generate`` (``speculative_tokens=0``): (time of ``1 + steps`` new tokens -
                   time of 1 new token) / steps, so the prefill cancels out; thread CPU and wall milliseconds per step
    decode B=8     the same through ``generate_batch`` of 8 prompts, per step
    prefill 512    a 512-token prompt, its pages evicted first: milliseconds to the first token
    speculative    ``generate`` with the model's default draft count (MTP), ``steps`` tokens: tokens/s

plus the compile cost: ``from_pretrained`` and ``warm_up`` in a fresh process with an empty inductor cache (cold), then
again in a second process on that cache (warm): the seconds ``compile_stats`` reports and the variants made. The
ratios are compiled / eager (below 1 is faster for times, above 1 for tokens/s). ``--threads`` torch threads
(default 1: thread CPU time is then the whole step's work, and the figure barely moves with the machine's load).

    .venv/bin/python benchmarks/compiled_forward.py
    .venv/bin/python benchmarks/compiled_forward.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # after PYTHONPATH
from smile_llm.language_model import LanguageModel  # noqa: E402
from bench_env import code_version  # noqa: E402

TEXT = ("The paged KV cache keeps every request's keys and values in fixed pages of a static pool; a radix tree "
        "over the pages finds the longest cached prefix of a new prompt. ")

COLD_SCRIPT = """
import json, sys, time
import torch
from smile_llm.language_model import LanguageModel
torch.set_num_threads(int(sys.argv[2]))
t0 = time.perf_counter()
lm = LanguageModel.default(sys.argv[1], compile=True)
loaded = time.perf_counter() - t0
stats = lm.warm_up()
print(json.dumps({**stats, "load_and_warm_up": time.perf_counter() - t0, "load": loaded}))
"""


def prompts(batch: int, length: int) -> list[list[int]]:
    """``batch`` distinct byte prompts of ``length`` tokens."""
    text = (TEXT * (length // len(TEXT) + 2)).encode()
    return [list(text[b * 7: b * 7 + length]) for b in range(batch)]


def clocks() -> np.ndarray:
    return np.array([time.perf_counter(), time.thread_time()])


def decode(lm: LanguageModel, batch: int, steps: int) -> np.ndarray:
    """Wall and thread-CPU seconds per plain decode step at ``batch`` rows (prefill subtracted)."""
    ps = prompts(batch, 64)

    def run(new: int) -> np.ndarray:
        t0 = clocks()
        if batch == 1:
            lm.generate(ps[0], new, speculative_tokens=0, min_new_tokens=new)
        else:
            lm.generate_batch(ps, new, speculative_tokens=0, min_new_tokens=new)
        return clocks() - t0

    return (run(1 + steps) - run(1)) / steps


def prefill(lm: LanguageModel, length: int) -> np.ndarray:
    """Wall and thread-CPU seconds to the first token of a ``length``-token prompt, nothing of it cached."""
    lm.pool.evict(lm.pool.num_slots)
    t0 = clocks()
    lm.generate(prompts(1, length)[0], 1, speculative_tokens=0)
    return clocks() - t0


def speculative(lm: LanguageModel, steps: int) -> float:
    """Tokens/s of one stream with the model's default drafts."""
    t0 = time.perf_counter()
    out = lm.generate(prompts(1, 64)[0], steps, min_new_tokens=steps)
    return len(out.tokens) / (time.perf_counter() - t0)


def compile_cost(kind: str, threads: int) -> list[dict[str, float]]:
    """The cold and the warm start's ``compile_stats`` (and load + warm-up seconds), in fresh processes."""
    runs = []
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "PYTHONPATH": os.pathsep.join(sys.path)}
        for _ in range(2):
            done = subprocess.run([sys.executable, "-c", COLD_SCRIPT, kind, str(threads)], env=env,
                                  capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise SystemExit(done.stderr[-3000:])
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return runs


def measure(kind: str, args: argparse.Namespace) -> None:
    sides = {"eager": LanguageModel.default(kind, compile=False),
             "compiled": LanguageModel.default(kind, compile=True)}
    for lm in sides.values():
        lm.warm_up()
        lm.generate_batch(prompts(8, 64), 4, speculative_tokens=0)  # the variants of every measure
        lm.generate(prompts(1, 64)[0], 8)
    rows: dict[str, dict[str, list[float]]] = {s: {} for s in sides}

    def add(side: str, name: str, value: float) -> None:
        rows[side].setdefault(name, []).append(value)

    for r in range(args.repeats):
        for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
            lm = sides[side]
            for batch in (1, 8):
                wall, cpu = decode(lm, batch, args.steps)
                add(side, f"decode B={batch} thread ms/step", cpu * 1e3)
                add(side, f"decode B={batch} wall ms/step", wall * 1e3)
            wall, cpu = prefill(lm, 512)
            add(side, "prefill 512 thread ms", cpu * 1e3)
            add(side, "prefill 512 wall ms", wall * 1e3)
            add(side, "speculative tokens/s", speculative(lm, args.steps))
    stats = sides["compiled"].compile_stats
    for lm in sides.values():
        lm.close()

    print(f"\n{kind} model ({args.repeats} interleaved runs, medians; compiled: {stats['compiled_variants']} "
          f"variants)")
    print(f"  {'measure':<30} {'eager':>10} {'compiled':>10} {'ratio':>7}")
    for name in rows["eager"]:
        e, c = (float(np.median(rows[s][name])) for s in ("eager", "compiled"))
        print(f"  {name:<30} {e:>10.2f} {c:>10.2f} {c / e:>7.2f}")
    if not args.no_compile_cost:
        cold, warm = compile_cost(kind, args.threads)
        for label, run in (("cold cache", cold), ("warm cache", warm)):
            print(f"  start, {label}: {run['compile_seconds']:.1f} s compiling ({run['compiled_variants']} "
                  f"variants), {run['load_and_warm_up']:.1f} s load + warm-up")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kinds", default="dense,hybrid")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=48, help="decode steps per measure")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-compile-cost", action="store_true", help="skip the cold and warm start processes")
    p.add_argument("--quick", action="store_true", help="the dense model, 2 runs of 8 steps, no start processes")
    args = p.parse_args()
    if args.quick:
        args.kinds, args.repeats, args.steps, args.no_compile_cost = "dense", 2, 8, True
    torch.set_num_threads(args.threads)
    print(f"compiled_forward: smile_llm {code_version()}, torch {torch.__version__}, {os.cpu_count()} cpus "
          f"(load average {os.getloadavg()[0]:.1f}), {args.threads} torch threads, {args.steps} steps per measure")
    for kind in args.kinds.split(","):
        measure(kind, args)


if __name__ == "__main__":
    main()
