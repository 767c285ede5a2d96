#!/usr/bin/env python
"""Multi-turn chat on the hybrid default model: time to first token of turns 2+ with prefix reuse (DeltaNet state
snapshots at page-aligned prefix-tree nodes) against without (``state_snapshots=0``: every turn prefills the whole
conversation).

One conversation opens with ``--history-bytes`` of a stdlib module (the model is byte-level: bytes = tokens) and runs
``--turns`` turns of ``--new`` greedy tokens; turn t's prompt is turn t-1's prompt + its completion + a user line,
so every turn after the first carries a history of at least ``--history-bytes`` tokens. Time to first token is
``Completion.stats["prefill_s"]`` (bind to the first token; single stream, so nothing queues). Each repeat runs the
conversation on a fresh model with snapshots and on a fresh model without, interleaved; the outputs must be equal.
Reported: per-turn medians, the TTFT ratio over turns 2+, and the memory: DeltaNet state per request and per
snapshot, snapshots held, KV bytes per token and per page. One torch thread.

    .venv/bin/python benchmarks/hybrid_chat_ttft.py [--history-bytes 1000] [--turns 4] [--new 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version
from chat_reuse import USER_LINES
from speculative import stdlib_prompts


def conversation(opening: str, turns: int, new: int, snapshots: int | None, model: str | None):
    """Run the conversation on a fresh model; returns (completions, memory figures)."""
    from smile_llm import LanguageModel

    kwargs = {"max_batch_size": 1, "max_seq_len": 4096, "state_snapshots": snapshots, "drafter": None}
    lm = LanguageModel.from_pretrained(model, **kwargs) if model else LanguageModel.default(kind="hybrid", **kwargs)
    prompt = lm.encode(opening)
    done = []
    for t in range(turns):
        c = lm.generate(prompt, new)
        done.append(c)
        prompt = prompt + c.tokens + lm.encode(USER_LINES[t % len(USER_LINES)])
    pool = lm.pool
    (states,) = pool.state_pools
    stats = pool.stats()
    kv_token = 2 * pool.num_layers * pool.num_kv_heads * pool.head_dim * pool.dtype.itemsize
    memory = {"state_bytes": states.bytes_per_request, "snapshots": states.snapshots.cached_count,
              "snapshot_capacity": states.snapshot_capacity, "kv_bytes_per_token": kv_token,
              "page_size": pool.page_size, "cached_pages": stats["tree_pages"],
              "kv_layers": pool.num_layers, "layers": lm.config.num_hidden_layers}
    lm.close()
    return done, memory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--history-bytes", type=int, default=1000)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default=None, help="a hybrid checkpoint folder (default: the shipped hybrid model)")
    p.add_argument("--quick", action="store_true", help="500-byte history, 3 turns, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.history_bytes, args.turns, args.repeats = 500, 3, 1
    torch.set_num_threads(1)
    (opening,) = stdlib_prompts(1, args.history_bytes)
    conversation(opening[:200], 2, 4, None, args.model)  # warm-up
    ttft: dict[bool, list[list[float]]] = {True: [], False: []}
    outs = {}
    memory = {}
    for rep in range(args.repeats):
        for reuse in ((True, False) if rep % 2 == 0 else (False, True)):
            outs[reuse], mem = conversation(opening, args.turns, args.new, None if reuse else 0, args.model)
            ttft[reuse].append([c.stats["prefill_s"] for c in outs[reuse]])
            if reuse:
                memory = mem
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    same = [a.tokens for a in outs[True]] == [b.tokens for b in outs[False]]
    assert same, "outputs differ between prefix reuse on and off"
    on = [statistics.median(r[t] for r in ttft[True]) for t in range(args.turns)]
    off = [statistics.median(r[t] for r in ttft[False]) for t in range(args.turns)]
    print(f"hybrid_chat_ttft: hybrid default model, 1 conversation, {args.turns} turns after a "
          f"{args.history_bytes}-byte opening, {args.new} greedy tokens per turn, 1 thread, medians of "
          f"{args.repeats}; torch {torch.__version__}; code {code_version()}")
    print(f"{'turn':>4} {'prompt':>7} {'cached on':>10} {'TTFT on ms':>11} {'TTFT off ms':>12} {'ratio':>7}")
    for t, c in enumerate(outs[True]):
        print(f"{t + 1:>4} {c.stats['prompt_tokens']:>7} {c.stats['cached_tokens']:>10} {on[t] * 1e3:>11.1f} "
              f"{off[t] * 1e3:>12.1f} {off[t] / on[t]:>6.2f}x")
    later_on, later_off = sum(on[1:]), sum(off[1:])
    ratio = later_off / later_on
    m = memory
    snap_total = m["snapshots"] * m["state_bytes"]
    kv_page = m["kv_bytes_per_token"] * m["page_size"]
    print(f"memory: DeltaNet state {m['state_bytes']:,} bytes per request and per snapshot (= "
          f"{m['state_bytes'] / m['kv_bytes_per_token']:.0f} tokens of KV); KV {m['kv_bytes_per_token']:,} bytes per "
          f"token ({m['kv_layers']} of {m['layers']} layers keep KV), {kv_page:,} per page of {m['page_size']}")
    print(f"        after the conversation: {m['snapshots']} of {m['snapshot_capacity']} snapshots held "
          f"({snap_total:,} bytes) for {m['cached_pages']} cached pages ({m['cached_pages'] * kv_page:,} bytes of KV): "
          f"{snap_total / max(m['cached_pages'], 1):,.0f} snapshot bytes per cached page")
    print(f"outputs identical with and without snapshots: {'yes' if same else 'NO'}")
    print(f"headline: hybrid chat TTFT, turns 2-{args.turns} on >= {args.history_bytes}-token histories: "
          f"{ratio:.2f}x faster with state snapshots ({later_off * 1e3:.0f} ms -> {later_on * 1e3:.0f} ms)")


if __name__ == "__main__":
    main()
