#!/usr/bin/env python
"""A multi-turn chat trace on the default model through ``InferenceEngine``: prefix reuse on against off.

``--conversations`` conversations (default 8), each opened by a ``--system-bytes`` slice of a different stdlib
module (the default model is byte-level: bytes = tokens), run ``--turns`` turns (default 4). Turn t's prompt is
turn t-1's prompt + its completion + a new user line; the turns of all conversations are submitted together to
one engine (max batch = the number of conversations), then the next turn. Greedy, ``--new`` tokens per turn.

The same trace runs on a fresh model with prefix reuse (the default) and on a fresh model with
``lm.pool.prefix_reuse_enabled = False``, interleaved, ``--repeats`` times. Reported: prefill tokens computed
(sum of prompt_tokens - cached_tokens over ``Completion.stats``), tokens saved, wall time (median) and time saved;
the outputs of both runs are checked identical. One torch thread. Saves ``results/chat_reuse.png``.

    .venv/bin/python benchmarks/chat_reuse.py
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

USER_LINES = ["\n# user: continue, and add a docstring\n", "\n# user: now handle the empty case\n",
              "\n# user: rename the variables to be clearer\n", "\n# user: add a test for it\n",
              "\n# user: what about unicode input?\n", "\n# user: make it faster\n"]


def run_trace(systems: list[str], turns: int, new: int, reuse: bool, seq_len: int):
    from smile_llm import LanguageModel
    from smile_llm.engine import InferenceEngine, SamplingParams

    lm = LanguageModel.default(max_batch_size=len(systems), max_seq_len=seq_len)
    lm.pool.prefix_reuse_enabled = reuse
    params = SamplingParams(max_new_tokens=new)
    prompts = [lm.encode(s) for s in systems]
    done = []
    t0 = time.perf_counter()
    with InferenceEngine(lm, max_batch_size=len(systems)) as engine:
        for t in range(turns):
            handles = [engine.submit(p, params) for p in prompts]
            results = [h.result() for h in handles]
            done.append(results)
            prompts = [p + c.tokens + lm.encode(USER_LINES[(i + t) % len(USER_LINES)])
                       for i, (p, c) in enumerate(zip(prompts, results))]
    wall = time.perf_counter() - t0
    lm.close()
    return wall, done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system-bytes", type=int, default=400)
    p.add_argument("--new", type=int, default=24)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="4 conversations x 3 turns, 1 repeat")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    if args.quick:
        args.conversations, args.turns, args.repeats = 4, 3, 1
    torch.set_num_threads(1)
    systems = stdlib_prompts(args.conversations, args.system_bytes)
    assert len(systems) == args.conversations, "not enough stdlib modules for the conversations"
    seq_len = args.system_bytes + args.turns * (args.new + 64) + 64
    run_trace(systems[:2], 1, 8, True, seq_len)  # warm-up
    walls: dict[bool, list[float]] = {True: [], False: []}
    outs = {}
    for rep in range(args.repeats):
        for reuse in (True, False):
            wall, outs[reuse] = run_trace(systems, args.turns, args.new, reuse, seq_len)
            walls[reuse].append(wall)
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    same = all(a.tokens == b.tokens for ta, tb in zip(outs[True], outs[False]) for a, b in zip(ta, tb))
    assert same, "outputs differ between reuse on and off"

    def prefill(turns):
        return sum(c.stats["prompt_tokens"] - c.stats["cached_tokens"] for turn in turns for c in turn)

    prompt_total = sum(c.stats["prompt_tokens"] for turn in outs[True] for c in turn)
    gen_total = sum(len(c.tokens) for turn in outs[True] for c in turn)
    on, off = prefill(outs[True]), prefill(outs[False])
    w_on, w_off = statistics.median(walls[True]), statistics.median(walls[False])
    per_turn_on = [sum(c.stats["prompt_tokens"] - c.stats["cached_tokens"] for c in turn) for turn in outs[True]]
    per_turn_off = [sum(c.stats["prompt_tokens"] - c.stats["cached_tokens"] for c in turn) for turn in outs[False]]
    print(f"chat_reuse: default model through InferenceEngine, {args.conversations} conversations x {args.turns} "
          f"turns ({args.system_bytes}-byte stdlib openings), {args.new} greedy new tokens per turn, 1 thread, "
          f"medians of {args.repeats}; torch {torch.__version__}; code {code_version()}")
    print(f"requests {args.conversations * args.turns}, prompt tokens {prompt_total:,}, generated tokens "
          f"{gen_total:,}")
    print(f"{'':22} {'reuse on':>10} {'reuse off':>10}")
    print(f"{'prefill tokens':22} {on:>10,} {off:>10,}")
    print(f"{'  per turn':22} {per_turn_on!s:>10}  {per_turn_off}")
    print(f"{'wall s':22} {w_on:>10.2f} {w_off:>10.2f}")
    print(f"tokens saved {off - on:,} ({(off - on) / max(off, 1):.0%} of the prefill; {off / max(on, 1):.2f}x fewer "
          f"computed); time saved {w_off - w_on:.2f} s ({(w_off - w_on) / w_off:.0%}, {w_off / w_on:.2f}x faster)")
    print(f"outputs identical between reuse on and off: {'yes' if same else 'NO'}")
    print(f"headline: chat {args.conversations}x{args.turns}: {off / max(on, 1):.2f}x fewer prefill tokens "
          f"({off:,} -> {on:,}), wall {w_off / w_on:.2f}x faster ({w_off:.2f} s -> {w_on:.2f} s)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    xs = list(range(1, args.turns + 1))
    a.bar([x - 0.2 for x in xs], per_turn_off, width=0.4, label="reuse off", color="grey")
    a.bar([x + 0.2 for x in xs], per_turn_on, width=0.4, label="reuse on", color="C2")
    a.set_xlabel("turn")
    a.set_ylabel("prefill tokens computed (all conversations)")
    a.set_xticks(xs)
    a.legend()
    b.bar(["reuse off", "reuse on"], [w_off, w_on], color=["grey", "C2"])
    b.set_ylabel("wall s (whole trace, median)")
    fig.suptitle(f"{args.conversations} conversations x {args.turns} turns, default model, CPU 1 thread")
    fig.tight_layout()
    fig.savefig(out / "chat_reuse.png", dpi=110)
    print(f"wrote {out / 'chat_reuse.png'}")


if __name__ == "__main__":
    main()
