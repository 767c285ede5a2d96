"""Random paged-attention cases and the comparison against the semantic reference
(``smile_llm.attention.reference``), shared by the attention tests."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from smile_llm.cache.metadata import FlashInferKvMetadata, build_csr

CPU = torch.device("cpu")
# What a backend's result may differ from the float64 reference by, per unit of the reference's
# magnitude: fp32 accumulation over the keys (measured: at most 10 fp32 eps on these tests), and
# the inputs' and the output's rounding to their dtype (measured: at most 0.4 of a half eps).
ACCUMULATION_EPS = 32  # units of fp32's eps
ROUNDING_EPS = 2  # units of the inputs' dtype's eps


@dataclass
class Case:
    q: torch.Tensor  # [total_q, Hq, D]
    k: torch.Tensor  # [num_pages, page_size, Hkv, D]; slots no row lists hold NaN
    v: torch.Tensor
    meta: FlashInferKvMetadata
    qo_indptr: list[int] | None


def make_case(rng: np.random.Generator, lengths: list[int], q_lens: list[int] | None,
              page_size: int, hkv: int, group: int, d: int, kv_dtype: torch.dtype = torch.float32,
              q_dtype: torch.dtype = torch.float32, shared_pages: int = 0) -> Case:
    """Random q/K/V; rows get shuffled (non-ascending) pages; every slot no row lists is NaN
    (poison). The first ``shared_pages`` pages of every row with that many are the same pages (a
    shared prefix)."""
    pages_per_row = [-(-n // page_size) for n in lengths]
    num_pages = sum(pages_per_row) + 3
    shuffled = rng.permutation(num_pages)
    table = np.zeros((len(lengths), max(pages_per_row + [1])), dtype=np.int64)
    at = shared_pages
    for b, n in enumerate(pages_per_row):
        own = max(0, n - shared_pages)
        table[b, : n - own] = shuffled[: n - own]
        table[b, n - own : n] = shuffled[at : at + own]
        at += own
    meta = build_csr(table, np.asarray(lengths, dtype=np.int64), page_size, CPU)
    gen = torch.Generator().manual_seed(int(rng.integers(1 << 31)))
    k = torch.full((num_pages, page_size, hkv, d), math.nan)
    v = torch.full((num_pages, page_size, hkv, d), math.nan)
    for b, n in enumerate(lengths):
        for t in range(n):
            page, slot = table[b, t // page_size], t % page_size
            k[page, slot] = torch.randn(hkv, d, generator=gen)
            v[page, slot] = torch.randn(hkv, d, generator=gen)
    total_q = len(lengths) if q_lens is None else sum(q_lens)
    q = torch.randn(total_q, hkv * group, d, generator=gen)
    qo = None if q_lens is None else [0, *np.cumsum(q_lens).tolist()]
    return Case(q.to(q_dtype), k.to(kv_dtype), v.to(kv_dtype), meta, qo)


def one_row_meta(kv_len: int, page_size: int, pages: list[int]) -> FlashInferKvMetadata:
    table = np.array([pages], dtype=np.int64)
    return build_csr(table, np.array([kv_len]), page_size, CPU)


def tolerance(dtype: torch.dtype, want: torch.Tensor) -> float:
    """How far a result computed in fp32 from inputs of ``dtype`` may be from the float64 reference
    ``want``: ``ACCUMULATION_EPS`` fp32 roundings plus ``ROUNDING_EPS`` roundings of ``dtype``,
    times the magnitude of ``want``'s finite entries (at least 1)."""
    eps = ACCUMULATION_EPS * torch.finfo(torch.float32).eps + ROUNDING_EPS * torch.finfo(dtype).eps
    finite = want[torch.isfinite(want)]
    magnitude = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    return eps * magnitude


def assert_close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
    """``got`` equals the reference ``want`` within ``tolerance(dtype, want)``, with no NaN, and
    infinite exactly where ``want`` is (the LSE of a query that sees no key)."""
    assert got.shape == want.shape
    assert not torch.isnan(got).any(), "NaN reached an output"
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite), "infinite entries (empty rows' LSE) differ"
    if finite.any():
        tol = tolerance(dtype, want)
        err = (got.double()[finite] - want.double()[finite]).abs().max().item()
        assert err <= tol, f"max abs error {err:.3g} > {tol:.3g}"
