#!/usr/bin/env python
"""What the KV storage format costs in quality on the default model: bits per byte on stdlib text (teacher-forced,
every position attending through the pool's stored K/V) and greedy agreement with float32 KV over ``--texts``
prompts, for ``from_pretrained(kv_dtype=...)`` = float32, bfloat16, FP8 (e4m3, e5m2; scales 1.0), the packed low-bit
formats (nvfp4: groups of 16 channels of one token; int4, int3, int2: keys per channel, values per token; a page
quantized once complete), a per-layer mix (the first and last two layers bfloat16, the rest int4) and an asymmetric
one (keys FP8 e4m3, values nvfp4), plus the KV bytes per token as stored (a packed page's codes and scales). The
default model computes in float32 throughout; only the stored K/V change. Goals: 4-bit (nvfp4) within +0.02 bits
per byte of float32 with 7x fewer KV bytes; 2-bit within +0.10.

    .venv/bin/python benchmarks/kv_dtype.py [--texts 64] [--bytes 1000] [--new 64] [--quick]
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
from speculative import MODULES


def stdlib_texts(count: int, length: int) -> list[str]:
    """``length`` bytes of source from a line boundary near the middle of ``count`` standard-library modules, in
    name order, leaving out the modules the other benchmarks prompt with."""
    import os

    root = Path(os.__file__).parent
    out = []
    for path in sorted(root.glob("*.py")):
        if path.name in MODULES:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        start = text.find("\n", len(text) // 2) + 1
        if len(text) - start >= length:
            out.append(text[start : start + length])
        if len(out) == count:
            break
    return out

KINDS = ("float32", "bfloat16", "fp8_e4m3", "fp8_e5m2", "nvfp4", "int4", "int3", "int2", "mixed", "k fp8 / v nvfp4")


def kv_dtype_of(kind: str, num_layers: int) -> object:
    """The ``kv_dtype`` argument of a row of the table."""
    if kind == "mixed":
        return ["bfloat16" if i < 2 or i >= num_layers - 2 else "int4" for i in range(num_layers)]
    if kind == "k fp8 / v nvfp4":
        return {"k": "fp8_e4m3", "v": "nvfp4"}
    return kind


def kv_bytes_per_token(pool) -> float:
    """Bytes of one token's K and V over every layer, as stored."""
    layers = pool.layer_range
    return sum(pool.k_block_stride_bytes_for_layer(i) + pool.v_block_stride_bytes_for_layer(i)
               for i in layers) / pool.page_size


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
    p.add_argument("--texts", type=int, default=64)
    p.add_argument("--bytes", type=int, default=1000)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="2 texts of 400 bytes, 32 new tokens")
    args = p.parse_args()
    if args.quick:
        args.texts, args.bytes, args.new = 2, 400, 32
    torch.set_num_threads(1)
    from smile_llm import LanguageModel

    texts = stdlib_texts(args.texts, args.bytes)
    rows = {}
    reference: list[list[int]] = []
    layers = LanguageModel.default(max_seq_len=64, drafter=None).pool.num_layers
    for kind in KINDS:
        lm = LanguageModel.default(max_seq_len=args.bytes + args.new + 16,
                                   kv_dtype=kv_dtype_of(kind, layers), drafter=None)
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
        rows[kind] = (bpb, same / max(total, 1), float(np.mean(prefix)), kv_bytes_per_token(lm.pool))
        lm.close()
    print(f"kv_dtype: default model, {args.texts} stdlib texts of {args.bytes} bytes, greedy {args.new} "
          f"tokens after their first half; torch {torch.__version__}; code {code_version()}")
    print(f"{'KV storage':16} {'bits/byte':>10} {'vs float32':>11} {'greedy agreement':>17} {'first divergence':>17} "
          f"{'KV bytes/token':>15} {'vs float32':>11}")
    base, base_bytes = rows["float32"][0], rows["float32"][3]
    for kind, (bpb, agree, prefix, kv) in rows.items():
        print(f"{kind:16} {bpb:>10.4f} {bpb - base:>+11.4f} {agree:>17.1%} {prefix:>17.1f} {kv:>15,.1f} "
              f"{base_bytes / kv:>10.2f}x")
    nv, i2 = rows["nvfp4"], rows["int2"]
    print(f"headline: nvfp4 KV {nv[0] - base:+.4f} bits/byte vs float32 (goal <= +0.02) with "
          f"{base_bytes / nv[3]:.1f}x fewer KV bytes (goal 7x); int2 {i2[0] - base:+.4f} (goal <= +0.10)")


if __name__ == "__main__":
    main()
