#!/usr/bin/env python
"""What the KV storage dtype costs in quality on the default model: bits per byte on stdlib text (teacher-forced, every
position attending through the pool's stored K/V) and greedy agreement with float32 KV, for
``from_pretrained(kv_dtype=...)`` = float32, bfloat16, fp8_e4m3 and fp8_e5m2 (scales 1.0), plus the KV bytes per
token. The default model computes in float32 throughout; only the stored K/V change.

    .venv/bin/python benchmarks/kv_dtype.py [--texts 4] [--bytes 1000] [--new 64] [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version
from speculative import stdlib_prompts

KINDS = ("float32", "bfloat16", "fp8_e4m3", "fp8_e5m2")


def bits_per_byte(lm, ids: list[int]) -> float:
    pool = lm.pool
    rid = pool.bind_request(ids, len(ids) + 1)
    pool.activate_step(rid)
    logits = lm.transformer(torch.tensor([ids]), np.array([0]), pool, lm.backend).logits[0, :-1]
    pool.unbind_request(rid)
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]), reduction="sum").item()
    return nll / math.log(2) / (len(ids) - 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--texts", type=int, default=4)
    p.add_argument("--bytes", type=int, default=1000)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="2 texts of 400 bytes, 32 new tokens")
    args = p.parse_args()
    if args.quick:
        args.texts, args.bytes, args.new = 2, 400, 32
    torch.set_num_threads(1)
    from smile_llm import LanguageModel

    texts = stdlib_prompts(args.texts + 8, args.bytes)[8:]  # not the prompts the other benchmarks use
    rows = {}
    reference: list[list[int]] = []
    for kind in KINDS:
        lm = LanguageModel.default(max_seq_len=args.bytes + args.new + 16, kv_dtype=kind, drafter=None)
        ids = [lm.encode(t) for t in texts]
        bpb = float(np.mean([bits_per_byte(lm, x) for x in ids]))
        greedy = [lm.generate(x[: args.bytes // 2], args.new).tokens for x in ids]
        if kind == "float32":
            reference = greedy
        same = sum(a == b for g, r in zip(greedy, reference) for a, b in zip(g, r))
        prefix = []
        for g, r in zip(greedy, reference):
            n = next((i for i, (a, b) in enumerate(zip(g, r)) if a != b), min(len(g), len(r)))
            prefix.append(n)
        total = sum(len(r) for r in reference)
        kv_bytes = 2 * lm.pool.num_layers * lm.pool.num_kv_heads * lm.pool.head_dim * lm.pool.dtype.itemsize
        rows[kind] = (bpb, same / max(total, 1), float(np.mean(prefix)), kv_bytes)
        lm.close()
    print(f"kv_dtype: default model, {args.texts} stdlib texts of {args.bytes} bytes, greedy {args.new} "
          f"tokens after their first half; torch {torch.__version__}; code {code_version()}")
    print(f"{'KV storage':12} {'bits/byte':>10} {'vs float32':>11} {'greedy agreement':>17} {'first divergence':>17} "
          f"{'KV bytes/token':>15}")
    base = rows["float32"][0]
    for kind, (bpb, agree, prefix, kv) in rows.items():
        print(f"{kind:12} {bpb:>10.4f} {bpb - base:>+11.4f} {agree:>17.1%} {prefix:>17.1f} {kv:>15,}")
    e4 = rows["fp8_e4m3"]
    print(f"headline: fp8_e4m3 KV: {e4[0] - base:+.4f} bits/byte vs float32, {e4[1]:.0%} greedy agreement, "
          f"{rows['float32'][3] / e4[3]:.0f}x fewer KV bytes")


if __name__ == "__main__":
    main()
