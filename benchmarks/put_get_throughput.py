#!/usr/bin/env python
"""KvCachePool.put / get throughput as a ratio to raw ``index_copy_`` / ``index_select`` on the same buffers.

For each shape (B active rows writing S positions starting at ``ctx - S``, then reading positions ``[0, ctx)``) and
dtype, a pool of 1 layer x 8 KV heads x head_dim 128 (page_size 16) is bound with ``bind_requests(B, ctx + 16)``.
Each "ours" variant is timed against a raw-torch peer doing the same data movement on the same pool buffers with a
precomputed index (``idx = torch.from_numpy(pool.window_slot_indices(start, S))``)::

    raw put:  K.index_copy_(0, idx, k.reshape(-1, H, D)); V.index_copy_(0, idx, v.reshape(-1, H, D))
    raw get:  K.index_select(0, idx).view(B, L, H, D);    V.index_select(0, idx).view(B, L, H, D)

where ``K``/``V`` are ``pool.key_cache[0]``/``pool.value_cache[0]`` taken once (the cheapest raw call). Variants:

    put fresh    pool.put(0, start, k, v), cycling through 8 start positions (start + 16 j) so the pool
                 builds the slot index on every call (the step caches its last 4 index tensors). The peer cycles
                 through the same windows.
    put cached   pool.put(0, start, k, v) with the same start every call (index cached by the step)
    put slot_idx pool.put(0, start, k, v, slot_idx=idx) with a precomputed index (models compute it once a step)
    get cached   pool.get(0, ctx), same length every call (index cached by the step)
    get fresh    pool.get(0, L) cycling L = ctx + 16 j, j < 8 (index rebuilt every call); the peer cycles too

Timing: ``time.perf_counter`` around a block of N calls (N calibrated so a block lasts ``--block-ms``), GC off;
``--repeats`` blocks per variant, ours and peer interleaved (alternating which goes first); medians printed.
GB/s is the K+V payload moved (B*S or B*L tokens x 2 x H x D x element size) per second by ours.
The goal is raw/ours >= 0.9. A last table measures the fixed per-call overhead (ours - raw) on a tiny layout.
One torch thread by default (``--threads``): on a small shared machine multi-threaded kernels stall whenever another
process holds a core, which would drown the comparison.

    .venv/bin/python benchmarks/put_get_throughput.py            # defaults (~1 min on 2 cores)
    .venv/bin/python benchmarks/put_get_throughput.py --quick    # ~10 s
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from smile_llm.cache import KvCachePool  # noqa: E402
from bench_env import code_version  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Case:
    name: str
    batch: int
    seqlen: int
    ctx: int  # put writes [ctx - seqlen, ctx) of every row; get reads [0, ctx)


def parse_case(text: str) -> Case:
    """``name:B:S:CTX``, e.g. ``decode:64:1:512``."""
    try:
        name, b, s, ctx = text.split(":")
        case = Case(name, int(b), int(s), int(ctx))
    except ValueError:
        raise argparse.ArgumentTypeError(f"case must be name:B:S:CTX, got {text!r}") from None
    if min(case.batch, case.seqlen) < 1 or case.ctx < max(case.seqlen, 32):
        raise argparse.ArgumentTypeError(f"case {text!r}: need B, S >= 1 and CTX >= max(S, 32)")
    return case


DEFAULT_CASES = ["prefill:1:512:512", "prefill:1:4096:4096", "decode:64:1:512", "chunk:8:128:1024"]
QUICK_CASES = ["prefill:1:512:512", "prefill:1:4096:4096", "decode:64:1:256", "chunk:8:128:512"]


# ---------------------------------------------------------------------------------------------------- timing
def time_block(fn: Callable[[int], object], n: int) -> float:
    """Seconds per call of ``fn(i)`` over ``n`` calls."""
    t0 = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t0) / n


def calibrate(fn: Callable[[int], object], block_s: float) -> int:
    """An even call count so that one block takes about ``block_s``."""
    fn(0), fn(1)
    n = 2
    while True:
        t = time_block(fn, n) * n
        if t >= block_s / 4 or n >= 1 << 20:
            break
        n *= 4
    return max(2, 2 * round(n * block_s / max(t, 1e-9) / 2))


def compare(raw: Callable[[int], object], ours: Callable[[int], object], repeats: int,
            block_s: float) -> tuple[float, float]:
    """Median seconds per call of (raw, ours); blocks interleaved, alternating which runs first."""
    n = calibrate(raw, block_s)
    ours(0), ours(1)
    raw_t: list[float] = []
    ours_t: list[float] = []
    for rep in range(repeats):
        order = [(raw, raw_t), (ours, ours_t)]
        for fn, out in (order if rep % 2 == 0 else order[::-1]):
            out.append(time_block(fn, n))
    return statistics.median(raw_t), statistics.median(ours_t)


# ---------------------------------------------------------------------------------------------------- one shape
@dataclass
class Row:
    case: str
    dtype: str
    op: str
    raw_us: float
    ours_us: float
    gbps: float

    @property
    def ratio(self) -> float:
        return self.raw_us / self.ours_us


FRESH_WINDOWS = 8  # distinct windows of the fresh variants: more than ActiveStep's index cache holds


def bench_case(case: Case, dtype: torch.dtype, heads: int, head_dim: int, args: argparse.Namespace) -> list[Row]:
    ps = 16
    B, S, ctx = case.batch, case.seqlen, case.ctx
    capacity = ctx + FRESH_WINDOWS * ps
    num_slots = B * capacity
    pool = KvCachePool(1, num_slots, heads, head_dim, page_size=ps, dtype=dtype)
    ids = pool.bind_requests(B, capacity)
    assert len(ids) == B and pool.request_capacity >= ctx, (len(ids), pool.request_capacity)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(B, S, heads, head_dim, generator=gen).to(dtype)
    v = torch.randn(B, S, heads, head_dim, generator=gen).to(dtype)
    # more windows than the step's index cache holds, so "fresh" calls rebuild the index every time
    starts = [ctx - S + j * ps for j in range(FRESH_WINDOWS)]
    lengths = [ctx + j * ps for j in range(FRESH_WINDOWS)]
    put_idx = [torch.from_numpy(pool.window_slot_indices(s, S)) for s in starts]
    get_idx = [torch.from_numpy(pool.slot_indices(length)) for length in lengths]
    kc, vc = pool.key_cache[0], pool.value_cache[0]

    # correctness first: every path writes and reads the same slots as the raw peer
    zeros = torch.zeros(B, ctx, heads, head_dim, dtype=dtype)
    pool.put(0, 0, zeros, zeros)
    pool.put(0, starts[0], k, v)
    gk, gv = pool.get(0, ctx)
    assert torch.equal(gk[:, starts[0]:ctx], k) and torch.equal(gv[:, starts[0]:ctx], v), "put/get mismatch"
    rk = kc.index_select(0, get_idx[0]).view(B, ctx, heads, head_dim)
    assert torch.equal(rk, gk), "pool.get differs from the raw index_select"
    del gk, gv, rk, zeros

    def raw_put(i: int) -> None:
        idx = put_idx[0]
        kc.index_copy_(0, idx, k.reshape(-1, heads, head_dim))
        vc.index_copy_(0, idx, v.reshape(-1, heads, head_dim))

    def raw_put_alt(i: int) -> None:
        idx = put_idx[i % FRESH_WINDOWS]
        kc.index_copy_(0, idx, k.reshape(-1, heads, head_dim))
        vc.index_copy_(0, idx, v.reshape(-1, heads, head_dim))

    def ours_put_fresh(i: int) -> None:
        pool.put(0, starts[i % FRESH_WINDOWS], k, v)

    def ours_put_cached(i: int) -> None:
        pool.put(0, starts[0], k, v)

    def ours_put_idx(i: int) -> None:
        pool.put(0, starts[0], k, v, slot_idx=put_idx[0])

    def raw_get(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = get_idx[0]
        return kc.index_select(0, idx).view(B, ctx, heads, head_dim), vc.index_select(0, idx).view(
            B, ctx, heads, head_dim)

    def raw_get_alt(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx, length = get_idx[i % FRESH_WINDOWS], lengths[i % FRESH_WINDOWS]
        return kc.index_select(0, idx).view(B, length, heads, head_dim), vc.index_select(0, idx).view(
            B, length, heads, head_dim)

    def ours_get(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return pool.get(0, ctx)

    def ours_get_fresh(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return pool.get(0, lengths[i % FRESH_WINDOWS])

    esize = torch.empty(0, dtype=dtype).element_size()
    put_bytes = 2 * B * S * heads * head_dim * esize
    get_bytes = 2 * B * ctx * heads * head_dim * esize
    get_alt_bytes = 2 * B * (sum(lengths) / len(lengths)) * heads * head_dim * esize
    rows = []
    name = f"{case.name} B={B} S={S} ctx={ctx}"
    dname = str(dtype).replace("torch.", "")
    block_s = args.block_ms / 1e3
    for op, raw, ours, nbytes in (("put fresh", raw_put_alt, ours_put_fresh, put_bytes),
                                  ("put cached", raw_put, ours_put_cached, put_bytes),
                                  ("put slot_idx", raw_put, ours_put_idx, put_bytes),
                                  ("get cached", raw_get, ours_get, get_bytes),
                                  ("get fresh", raw_get_alt, ours_get_fresh, get_alt_bytes)):
        r, o = compare(raw, ours, args.repeats, block_s)
        rows.append(Row(name, dname, op, r * 1e6, o * 1e6, nbytes / o / 1e9))
    pool.close()
    return rows


# ---------------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--case", dest="cases", type=parse_case, action="append", metavar="NAME:B:S:CTX",
                   help=f"shape to measure (repeatable); default {' '.join(DEFAULT_CASES)}")
    p.add_argument("--dtype", dest="dtypes", choices=sorted(DTYPES), action="append",
                   help="pool and input dtype (repeatable); default float32 and bfloat16")
    p.add_argument("--heads", type=int, default=8, help="KV heads")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--repeats", type=int, default=7, help="timed blocks per variant (medians are printed)")
    p.add_argument("--block-ms", type=float, default=40.0, help="target duration of one timed block")
    p.add_argument("--threads", type=int, default=1,
                   help="torch.set_num_threads; 0 leaves torch's default (one per core). 1 by default: on a small "
                        "shared machine, multi-threaded kernels stall whenever another process holds a core")
    p.add_argument("--no-overhead", action="store_true", help="skip the fixed-overhead table")
    p.add_argument("--quick", action="store_true", help="a ~10 s run: smaller contexts, 5 repeats of 5 ms blocks")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.block_ms = 5, 5.0
    if args.cases is None:
        args.cases = [parse_case(c) for c in (QUICK_CASES if args.quick else DEFAULT_CASES)]
    args.dtypes = [DTYPES[d] for d in (args.dtypes or ["float32", "bfloat16"])]
    return args


def print_table(rows: list[Row]) -> None:
    head = f"{'shape':<30} {'dtype':<9} {'op':<13} {'raw us':>9} {'ours us':>9} {'raw/ours':>8} {'GB/s':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        flag = "" if r.ratio >= 0.9 else "  < 0.9"  # same test as the count below
        print(f"{r.case:<30} {r.dtype:<9} {r.op:<13} {r.raw_us:>9.1f} {r.ours_us:>9.1f} {r.ratio:>8.3f} "
              f"{r.gbps:>7.2f}{flag}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_grad_enabled(False)
    if args.threads:
        torch.set_num_threads(args.threads)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"put_get_throughput: smile_llm {code_version()}, python {platform.python_version()}, "
          f"torch {torch.__version__}, {os.cpu_count()} cpus (load average {load}), "
          f"{torch.get_num_threads()} torch threads")
    print(f"layout 1 layer x {args.heads} KV heads x head_dim {args.head_dim}, page_size 16; medians of "
          f"{args.repeats} blocks of ~{args.block_ms:g} ms, ours and raw interleaved\n")
    gc_was = gc.isenabled()
    gc.disable()
    try:
        rows: list[Row] = []
        for case in args.cases:
            for dtype in args.dtypes:
                rows += bench_case(case, dtype, args.heads, args.head_dim, args)
        print_table(rows)
        miss = [r for r in rows if r.ratio < 0.9]
        print(f"\n{len(rows) - len(miss)} of {len(rows)} rows meet raw/ours >= 0.9 "
              f"(load average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())})")
        headline = (f"headline: put/get {len(rows) - len(miss)} of {len(rows)} rows meet raw/ours >= 0.9 "
                    f"(worst {min(r.ratio for r in rows):.2f})")
        if not args.no_overhead:
            print("\nfixed per-call overhead on a tiny layout (1 KV head x head_dim 8, float32): ours - raw")
            tiny: list[Row] = []
            for case in (Case("tiny", 1, 1, 32), Case("tiny", 64, 1, 32)):
                tiny += bench_case(case, torch.float32, 1, 8, args)
            print(f"{'shape':<30} {'op':<13} {'raw us':>9} {'ours us':>9} {'overhead us':>12}")
            for r in tiny:
                print(f"{r.case:<30} {r.op:<13} {r.raw_us:>9.2f} {r.ours_us:>9.2f} {r.ours_us - r.raw_us:>12.2f}")
    finally:
        if gc_was:
            gc.enable()
    print(headline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
