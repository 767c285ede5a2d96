#!/usr/bin/env python
"""Registered segments spliced into multi-document prompts against full prefill of the same tokens, in one run:
time to first token and agreement of the greedy output (the measures of Prompt Cache, Gim et al. 2024, and
CacheBlend).

Workload: ``--docs`` documents of ``--doc-tokens`` tokens, cut from this Python's standard library sources (the
default model is byte-level and trained on code), each registered once (``register_segment``; its one-time cost is
printed). ``--queries`` prompts each name ``--per-query`` documents in a rotating order, laid out as
``["# context\\n", d1, "\\n", d2, "\\n", ...]`` before a question line, so every document sits at a shifted,
page-aligned offset (its KV spliced with the RoPE delta). A second configuration puts the first document at position
0 (``[d1, "\\n", d2, ...]``): its whole pages are shared through the prefix tree, the others shifted. Two more name one
document: shifted after the header, and at 0 (the exact case: no shifted segment, the check that the output equals
full prefill).

For each query and configuration, with the prefix tree emptied before every measured request (eviction: nothing of
one request helps the next; registered segments stay, they are locked) and prefix reuse off for the full prefill
(which then matches nothing, not even a registered document's pages):

- TTFT: the wall time of ``generate(..., max_new_tokens=1)``, spliced against full prefill of the identical token
  sequence (``LanguageModel.request(...).prompt``, the padding included), the two interleaved, medians of
  ``--repeats``; the ratio is spliced / full per query, then the median over queries.
- Agreement: ``--new`` greedy tokens each way (plain decoding): whether the first token agrees, the length of the
  common prefix over ``--new``, and whether the whole continuation is identical.

One torch thread (``--threads``). ``--device cuda`` runs on a GPU (bfloat16). Prints one table; the README has the
figures.

    .venv/bin/python benchmarks/segment_splice.py
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402

SOURCES = ["textwrap", "heapq", "bisect", "shlex", "fnmatch", "string", "glob", "colorsys", "calendar", "base64"]
QUESTIONS = ["\n# Q: which function above wraps text?\ndef ", "\n# write a helper that uses the code above\ndef ",
             "\n# tests for the functions above\nimport unittest\n\nclass ", "\n# usage example\nif __name__ == ",
             "\n# a faster version of the first function\ndef ", "\n# explain the second function\n# ",
             "\n# refactor: merge the modules above\nimport ", "\n# handle the empty case too\ndef "]


def documents(count: int, tokens: int) -> list[str]:
    """``count`` texts of ``tokens`` bytes each (ASCII source, so bytes are the byte-level model's tokens), from the
    middle of a standard-library module each (past the license header and imports)."""
    out = []
    for name in SOURCES[:count]:
        src = Path(importlib.import_module(name).__file__ or "").read_text(encoding="utf-8")
        src = src.encode("ascii", "ignore").decode()
        start = src.find("\ndef ") + 1
        out.append(src[start : start + tokens])
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=6)
    p.add_argument("--doc-tokens", type=int, default=384)
    p.add_argument("--per-query", type=int, default=3)
    p.add_argument("--queries", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--quick", action="store_true", help="2 queries, 2 repeats")
    args = p.parse_args()
    if args.quick:
        args.queries, args.repeats = 2, 2
    from smile_llm import LanguageModel, SamplingParams

    torch.set_num_threads(args.threads)
    on_cuda = args.device.startswith("cuda")
    seq_len = args.per_query * (args.doc_tokens + 32) + 256
    # room for the registered documents (held for the whole run) and one request
    rows = 1 + -(-args.docs * (args.doc_tokens + 16) // seq_len) + 1
    lm = LanguageModel.default(device=args.device, dtype=torch.bfloat16 if on_cuda else torch.float32,
                               max_batch_size=rows, max_seq_len=seq_len)
    pool = lm.pool
    docs = documents(args.docs, args.doc_tokens)
    t0 = time.perf_counter()
    segments = [lm.register_segment(d) for d in docs]
    register_s = (time.perf_counter() - t0) / len(segments)

    def pieces(q: int, config: str) -> list:
        names = [segments[(q + i) % len(segments)] for i in range(args.per_query)]
        if config == "one at 0":
            return [names[0], "\n"]
        if config == "one shifted":
            return ["# context\n", names[0], "\n"]
        out: list = [] if config == "first at 0" else ["# context\n"]
        for s in names:
            out += [s, "\n"]
        return out

    def sync() -> None:
        if on_cuda:
            torch.cuda.synchronize()

    def run(prompt, params: SamplingParams, full: bool) -> tuple[float, list[int]]:
        """One request on an emptied tree (the registered segments are locked and stay); ``full``: with prefix
        reuse off, so it matches nothing (not even a registered segment's pages) and computes every position."""
        pool.evict(pool.num_slots)
        pool.prefix_reuse_enabled = not full
        try:
            sync()
            t = time.perf_counter()
            out = lm.submit(prompt, params).result()
            sync()
            return time.perf_counter() - t, out.tokens
        finally:
            pool.prefix_reuse_enabled = True

    configs = ["all shifted", "first at 0", "one shifted", "one at 0"]
    rows = []
    for config in configs:
        ratios, spliced_ms, full_ms, first, prefix, exact, lengths = [], [], [], [], [], [], []
        for q in range(args.queries):
            question = QUESTIONS[q % len(QUESTIONS)]
            one = SamplingParams(max_new_tokens=1, speculative_tokens=0, segments=pieces(q, config))
            tokens = lm.request(question, one).prompt
            full_one = SamplingParams(max_new_tokens=1, speculative_tokens=0)
            run(question, one, False), run(tokens, full_one, True)  # warm-up of these shapes
            s_t, f_t = [], []
            for _ in range(args.repeats):
                s_t.append(run(question, one, False)[0])
                f_t.append(run(tokens, full_one, True)[0])
            spliced_ms.append(1e3 * median(s_t))
            full_ms.append(1e3 * median(f_t))
            ratios.append(median(s_t) / median(f_t))
            many = SamplingParams(max_new_tokens=args.new, speculative_tokens=0, segments=pieces(q, config))
            spliced = run(question, many, False)[1]
            full = run(tokens, SamplingParams(max_new_tokens=args.new, speculative_tokens=0), True)[1]
            n = common_prefix(spliced, full)
            first.append(float(n > 0))
            prefix.append(n / args.new)
            exact.append(float(spliced == full))
            lengths.append(len(tokens))
        rows.append((config, median(lengths), median(spliced_ms), median(full_ms), median(ratios),
                     statistics.mean(first), statistics.mean(prefix), statistics.mean(exact)))
    for s in segments:
        lm.release_segment(s)
    pool.check_invariants()
    assert pool.bound_request_count == 0

    print(f"segment_splice: code {code_version()}, device {pool.device}, {pool.dtype}, page_size {pool.page_size}, "
          f"{args.threads} thread(s); {args.docs} documents of {args.doc_tokens} tokens, {args.per_query} per query, "
          f"{args.queries} queries, medians of {args.repeats} repeats, {args.new} greedy tokens")
    print(f"registration: {1e3 * register_s:.1f} ms per document (once)")
    print(f"{'configuration':<13} {'prompt':>6} {'TTFT spliced':>13} {'TTFT full':>10} {'ratio':>6} "
          f"{'1st token':>9} {'common prefix':>13} {'identical':>9}")
    for config, length, s_ms, f_ms, ratio, first_ok, pre, ex in rows:
        print(f"{config:<13} {length:>6.0f} {s_ms:>10.2f} ms {f_ms:>7.2f} ms {ratio:>5.2f}x {first_ok:>9.2f} "
              f"{pre:>13.2f} {ex:>9.2f}")
    shifted = rows[0]
    print(f"headline: spliced / full prefill TTFT {shifted[4]:.2f}x with every document shifted; greedy output "
          f"identical in {shifted[7]:.0%} of queries, first token agrees in {shifted[5]:.0%}")


if __name__ == "__main__":
    main()
