#!/usr/bin/env python
"""Decode time of the torch paged-attention backend on the CPU, against dense SDPA on the same K/V.

For B rows of ``ctx`` tokens (Hq 8, Hkv 2, head_dim 64, page_size 16, float32) written into a real KvCachePool, one
decode query per row: ``TorchBackend.run`` per layer after one ``plan`` per step (what a model pays per layer)
against ``torch.nn.functional.scaled_dot_product_attention`` on the same K/V already laid out densely as
``[B, Hq, ctx, D]`` (the peer: no paging, no gather, the GQA heads pre-expanded). Medians of ``--repeats``.

    .venv/bin/python benchmarks/reference_attention.py          # defaults (about 1 min)
    .venv/bin/python benchmarks/reference_attention.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from smile_llm.attention import TorchBackend
from smile_llm.cache import KvCachePool

HQ, HKV, D, PS = 8, 2, 64, 16


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def case(batch: int, ctx: int, repeats: int) -> tuple[float, float, float]:
    pool = KvCachePool(1, batch * ctx, HKV, D, PS)
    pool.prefix_reuse_enabled = False
    ids = [pool.bind_request([1], ctx) for _ in range(batch)]
    pool.activate_step(*ids)
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(batch, ctx, HKV, D, generator=gen), torch.randn(batch, ctx, HKV, D, generator=gen)
    pool.put(0, 0, k, v)
    q = torch.randn(batch, HQ, D, generator=gen)
    meta = pool.shared_flashinfer_metadata(ctx)
    backend = TorchBackend()
    plan_ms = median_ms(lambda: backend.plan(meta, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D), repeats)
    k_layer, v_layer = pool.key_layer(0).view(-1, PS, HKV, D), pool.value_layer(0).view(-1, PS, HKV, D)
    ours = median_ms(lambda: backend.run(q, k_layer, v_layer), repeats)
    dense_k = k.repeat_interleave(HQ // HKV, dim=2).transpose(1, 2).contiguous()  # [B, Hq, ctx, D]
    dense_v = v.repeat_interleave(HQ // HKV, dim=2).transpose(1, 2).contiguous()
    peer = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q[:, :, None], dense_k, dense_v),
                     repeats)
    out = backend.run(q, k_layer, v_layer)
    want = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], dense_k, dense_v)[:, :, 0]
    assert torch.allclose(out, want, atol=1e-4), "reference disagrees with SDPA"
    return plan_ms, ours, peer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    shapes = [(1, 1024), (1, 4096), (16, 1024), (16, 4096), (64, 1024), (64, 2048)]
    if args.quick:
        shapes, args.repeats = [(1, 1024), (16, 1024)], 3
    print(f"reference_attention: decode, Hq {HQ} Hkv {HKV} D {D}, page {PS}, float32, 1 thread, medians of "
          f"{args.repeats}; torch {torch.__version__}")
    print(f"{'B':>3} {'ctx':>5} {'plan ms':>8} {'run ms':>8} {'SDPA ms':>8} {'SDPA/run':>9}")
    ratios = []
    for batch, ctx in shapes:
        plan_ms, ours, peer = case(batch, ctx, args.repeats)
        ratios.append(peer / ours)
        print(f"{batch:>3} {ctx:>5} {plan_ms:>8.2f} {ours:>8.2f} {peer:>8.2f} {peer / ours:>9.2f}")
    print(f"headline: paged reference attention vs dense SDPA: SDPA/ours {min(ratios):.2f}-{max(ratios):.2f}x "
          f"(B=1 {ratios[0]:.2f}x)")


if __name__ == "__main__":
    main()
