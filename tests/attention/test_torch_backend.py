"""The torch backend (``attention/torch/``) against the semantic reference
(``attention.reference``, float64) on random cases: every path its plan can take (chunked online
softmax, one fused chunk, cascade, causal windows, runs read in place), through a real KvCachePool in
poison mode, on bad input, and through TorchBackend's plan/run. The contract's hand-computed cases are
in test_reference.py."""

from __future__ import annotations

import functools
import math
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smile_llm.attention.torch import plan as torch_plan
from smile_llm.attention.reference import reference_paged_attention
from smile_llm.attention.torch.backend import TorchBackend, paged_attention
from smile_llm.cache import KvCachePool
from smile_llm.cache.metadata import FlashInferKvMetadata, build_csr

from .cases import CPU, Case, assert_close, make_case, one_row_meta


def reference(case: Case, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's ``(out, lse)`` of ``case`` (its q, K/V, CSR and query windows)."""
    return reference_paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=case.qo_indptr, **kwargs)


# ------------------------------------------------------------------------------------------------ random cases
MODES = st.sampled_from(["decode", "window", "full"])


@st.composite
def cases(draw: st.DrawFn) -> dict:
    batch = draw(st.integers(1, 4))
    page_size = draw(st.sampled_from([1, 4, 16]))
    lengths = draw(st.lists(st.integers(0, 40), min_size=batch, max_size=batch))
    mode = draw(MODES)
    if mode == "decode":
        q_lens = None
    elif mode == "window":  # verify windows and short prefill chunks; may exceed kv_len (those queries see nothing)
        q_lens = draw(st.lists(st.integers(1, 8), min_size=batch, max_size=batch))
    else:  # a full prefill: every kv position is also a query
        q_lens = lengths
    return {
        "seed": draw(st.integers(0, 2**31)), "lengths": lengths, "q_lens": q_lens, "page_size": page_size,
        "hkv": draw(st.sampled_from([1, 2])), "group": draw(st.sampled_from([1, 2, 4])),
        "d": draw(st.sampled_from([8, 16])), "causal": draw(st.booleans()),
        "sm_scale": draw(st.sampled_from([None, 0.3])), "cap": draw(st.sampled_from([None, 5.0])),
        "k_scale": draw(st.sampled_from([1.0, 0.5])), "v_scale": draw(st.sampled_from([1.0, 3.0])),
        "cache_3d": draw(st.booleans()),
        "chunk_bytes": draw(st.sampled_from([torch_plan.CHUNK_BYTES, 1, 4096])),  # 1: one page per chunk
        "shared_pages": draw(st.integers(0, 3)),  # leading pages every row lists alike (a cascade when they fit)
    }


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_matches_the_float64_reference(c: dict) -> None:
    case = make_case(np.random.default_rng(c["seed"]), c["lengths"], c["q_lens"], c["page_size"], c["hkv"],
                     c["group"], c["d"], shared_pages=c["shared_pages"])
    kw = {"causal": c["causal"], "sm_scale": c["sm_scale"], "k_scale": c["k_scale"], "v_scale": c["v_scale"]}
    want_out, want_lse = reference(case, logits_soft_cap=c["cap"], **kw)
    k, v = case.k, case.v
    if c["cache_3d"]:
        k, v = k.flatten(0, 1), v.flatten(0, 1)  # the pool's [num_slots, Hkv, D] view
    qo = None if case.qo_indptr is None else torch.tensor(case.qo_indptr, dtype=torch.int32)
    with mock.patch.object(torch_plan, "CHUNK_BYTES", c["chunk_bytes"]), \
            mock.patch.object(torch_plan, "CASCADE_MIN_TOKENS", 1):
        out, lse = paged_attention(case.q, k, v, case.meta, qo_indptr=qo, logits_soft_cap=c["cap"],
                                   return_lse=True, **kw)
        plain = paged_attention(case.q, k, v, case.meta, qo_indptr=qo, logits_soft_cap=c["cap"], **kw)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert_close(out, want_out)
    assert_close(lse, want_lse)
    assert_close(plain, want_out)  # without LSE, one-chunk decode takes the fused SDPA path


# ------------------------------------------------------------------------------------------------ shared prefix
@pytest.mark.parametrize("page_size", [1, 4, 16])
@pytest.mark.parametrize("q_lens", [None, [4, 4, 4, 4], [1, 3, 2, 5], "full"])
@pytest.mark.parametrize("chunk_bytes", [torch_plan.CHUNK_BYTES, 1])
@pytest.mark.parametrize("flash_lse", [True, False], ids=["cpu-kernel", "matmuls"])
def test_shared_prefix_cascade_matches_the_reference(page_size: int, q_lens: Any, chunk_bytes: int,
                                                     flash_lse: bool, monkeypatch) -> None:
    """Rows listing the same first pages (a cached system prompt) take the cascade: the shared K/V read once, every
    row's queries attend to it together, the rows' own pages follow. Same result as the reference; where a row's
    queries start inside the shared pages, only the pages before them are shared. ``matmuls`` is the path other
    devices take (no fused kernel returning the LSE)."""
    monkeypatch.setattr(torch_plan, "CPU_FLASH_LSE", flash_lse)
    lengths = [150, 161, 149, 190]
    if q_lens == "full":  # prefill of every position: queries start at 0, so nothing can be shared
        q_lens = lengths
    shared_pages = 144 // page_size
    case = make_case(np.random.default_rng(page_size), lengths, q_lens, page_size, 2, 2, 16,
                     shared_pages=shared_pages)
    qo = None if case.qo_indptr is None else torch.tensor(case.qo_indptr, dtype=torch.int32)
    want_out, want_lse = reference(case, v_scale=2.0)
    with mock.patch.object(torch_plan, "CHUNK_BYTES", chunk_bytes):
        plan = torch_plan.plan_attention(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16, qo_indptr=qo)
        out, lse = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, v_scale=2.0, return_lse=True)
        plain = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, v_scale=2.0)
    before = min(n - (1 if q_lens is None else q) for n, q in zip(lengths, q_lens or [1] * 4))
    expected = min(shared_pages, before // page_size) * page_size
    assert (plan.shared.num_tokens if plan.shared is not None else 0) == \
        (expected if expected >= torch_plan.CASCADE_MIN_TOKENS else 0)
    if q_lens != lengths:
        assert plan.shared is not None
    assert_close(out, want_out)
    assert_close(lse, want_lse)
    assert_close(plain, want_out)


@pytest.mark.parametrize("kv_len, q_len", [(64, 64), (200, 200), (200, 64), (333, 100), (100, 63)])
@pytest.mark.parametrize("group", [1, 4])
def test_one_row_causal_window_skips_its_masked_half(kv_len: int, q_len: int, group: int) -> None:
    """A one-row prefill chunk of at least CAUSAL_SPLIT_MIN queries runs as an unmasked prefix plus a square causal
    block merged by LSE (the masked half skipped); same result as the reference. Shorter windows keep one masked
    call."""
    case = make_case(np.random.default_rng(kv_len + q_len), [kv_len], [q_len], 16, 2, group, 16)
    qo = torch.tensor(case.qo_indptr, dtype=torch.int32)
    plan = torch_plan.plan_attention(case.meta, num_qo_heads=2 * group, num_kv_heads=2, head_dim=16, qo_indptr=qo)
    assert plan.causal_window == (q_len >= torch_plan.CAUSAL_SPLIT_MIN)
    want, _ = reference(case, v_scale=0.5)
    assert_close(paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, v_scale=0.5), want)
    noncausal, _ = reference(case, causal=False)
    assert_close(paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, causal=False), noncausal)


# ------------------------------------------------------------------------------------------------ causal windows
WINDOW_ROWS = [  # (kv_lens, q_lens): several rows whose windows start after different prefixes
    ([300, 150, 97, 64], [100, 64, 97, 64]),  # prefixes 200, 86, 0, 0
    ([1000], [1000]),  # a whole prompt
    ([1100], [76]),  # a chunk after 1,024 positions
    ([80, 0, 260], [70, 0, 3]),  # an empty row, and a 3-query window beside a long one
]


@pytest.mark.parametrize("kv_lens, q_lens", WINDOW_ROWS)
@pytest.mark.parametrize("group", [1, 4])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("chunk_bytes", [torch_plan.CHUNK_BYTES, 2048])  # 2048: the prefix read in pieces
def test_causal_windows_match_the_reference(kv_lens: list[int], q_lens: list[int], group: int, page_size: int,
                                            chunk_bytes: int) -> None:
    """A forward with a window of at least CAUSAL_SPLIT_MIN queries and no shared prefix runs each row as its
    unmasked prefix plus its square causal block (``plan.windows``); output and base-2 LSE equal the float64
    reference's, with GQA, sm_scale and both scales, and NaN in every slot past a row's end."""
    case = make_case(np.random.default_rng(sum(kv_lens) + group), kv_lens, q_lens, page_size, 2, group, 16)
    qo = torch.tensor(case.qo_indptr, dtype=torch.int32)
    kw: dict[str, Any] = {"sm_scale": 0.2, "k_scale": 0.5, "v_scale": 3.0}
    with mock.patch.object(torch_plan, "CHUNK_BYTES", chunk_bytes):
        plan = torch_plan.plan_attention(case.meta, num_qo_heads=2 * group, num_kv_heads=2, head_dim=16,
                                         qo_indptr=qo, sm_scale=0.2)
        out, lse = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, return_lse=True, **kw)
        plain = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, **kw)
    assert plan.windows is not None and [w.q_len for w in plan.windows] == [n for n in q_lens if n]
    if chunk_bytes == 2048:
        assert any(len(w.prefix) > 1 for w in plan.windows) == any(k - q > 8 for k, q in zip(kv_lens, q_lens))
    want_out, want_lse = reference(case, **kw)
    assert_close(out, want_out)
    assert_close(lse, want_lse)
    assert_close(plain, want_out)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)), min_size=1, max_size=4),
       st.sampled_from([1, 4, 16]), st.sampled_from([1, 2]), st.sampled_from([1, 2, 4]), st.integers(0, 2**31))
def test_causal_windows_on_random_rows(rows: list[tuple[int, int]], page_size: int, hkv: int, group: int,
                                       seed: int) -> None:
    """With CAUSAL_SPLIT_MIN = 1 every causal forward whose rows have ``q_len <= kv_len`` takes the split: random
    prefixes and windows (empty rows too) against the reference, with the prefix read in pieces of a few positions."""
    kv_lens = [prefix + window for prefix, window in rows]
    q_lens = [window for _, window in rows]
    case = make_case(np.random.default_rng(seed), kv_lens, q_lens, page_size, hkv, group, 8)
    qo = torch.tensor(case.qo_indptr, dtype=torch.int32)
    with mock.patch.object(torch_plan, "CAUSAL_SPLIT_MIN", 1), mock.patch.object(torch_plan, "CHUNK_BYTES", 512):
        plan = torch_plan.plan_attention(case.meta, num_qo_heads=hkv * group, num_kv_heads=hkv, head_dim=8,
                                         qo_indptr=qo)
        out, lse = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, return_lse=True)
    assert plan.causal_window == (sum(q_lens) > 0)
    want_out, want_lse = reference(case)
    assert_close(out, want_out)
    assert_close(lse, want_lse)


@pytest.mark.parametrize("group", [1, 2])
def test_chunked_prefill_equals_whole_prefill(group: int) -> None:
    """A 300-position prompt prefilled in chunks of 100 (each chunk's queries over every position written so far)
    gives the whole prefill's output, row for row, and both equal the reference."""
    case = make_case(np.random.default_rng(7), [300], [300], 16, 2, group, 16)
    whole = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=torch.tensor([0, 300]))
    pages = case.meta.indices.tolist()
    parts = []
    for end in (100, 200, 300):
        meta = one_row_meta(end, 16, pages[: -(-end // 16)])
        plan = torch_plan.plan_attention(meta, num_qo_heads=2 * group, num_kv_heads=2, head_dim=16,
                                         qo_indptr=torch.tensor([0, 100]))
        assert plan.windows is not None and plan.windows[0].q_len == 100
        parts.append(paged_attention(case.q[end - 100 : end], case.k, case.v, meta, qo_indptr=torch.tensor([0, 100])))
    assert torch.allclose(torch.cat(parts), whole, rtol=1e-6, atol=1e-6)
    want, _ = reference(case)
    assert_close(whole, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_causal_windows_in_half_precision(dtype: torch.dtype) -> None:
    case = make_case(np.random.default_rng(8), [200, 90], [120, 64], 16, 2, 2, 16, kv_dtype=dtype, q_dtype=dtype)
    qo = torch.tensor(case.qo_indptr, dtype=torch.int32)
    assert torch_plan.plan_attention(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16, qo_indptr=qo).windows
    out, lse = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, return_lse=True, v_scale=2.0)
    want_out, want_lse = reference(case, v_scale=2.0)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_close(out, want_out, dtype)
    assert_close(lse, want_lse, dtype)


def test_causal_windows_are_not_used_for_a_soft_cap_a_shared_prefix_or_blind_queries() -> None:
    """The split needs the fused CPU kernel and no soft cap; rows sharing a long prefix take the cascade instead,
    and a window longer than its row (queries that see no key) the general path. All still equal the reference."""
    case = make_case(np.random.default_rng(9), [300, 150], [100, 64], 16, 2, 2, 16)
    qo = torch.tensor(case.qo_indptr, dtype=torch.int32)
    plan = functools.partial(torch_plan.plan_attention, case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16,
                             qo_indptr=qo)
    assert plan().windows is not None and plan(causal=False).windows is None
    assert plan(logits_soft_cap=5.0).windows is None
    with mock.patch.object(torch_plan, "CPU_FLASH_LSE", False):
        assert plan().windows is None
        want, _ = reference(case)
        assert_close(paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo), want)
    want, _ = reference(case, logits_soft_cap=5.0)
    assert_close(paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, logits_soft_cap=5.0), want)
    shared = make_case(np.random.default_rng(9), [300, 310], [64, 64], 16, 2, 2, 16, shared_pages=14)
    qo = torch.tensor(shared.qo_indptr, dtype=torch.int32)
    plan_shared = torch_plan.plan_attention(shared.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16, qo_indptr=qo)
    assert plan_shared.windows is None and plan_shared.shared is not None
    blind = make_case(np.random.default_rng(9), [50, 100], [70, 64], 16, 2, 2, 16)
    qo = torch.tensor(blind.qo_indptr, dtype=torch.int32)
    assert torch_plan.plan_attention(blind.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16, qo_indptr=qo).windows \
        is None
    want, _ = reference(blind)
    assert_close(paged_attention(blind.q, blind.k, blind.v, blind.meta, qo_indptr=qo), want)


@pytest.mark.parametrize("q_len", [None, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_row_over_consecutive_slots_reads_the_cache_in_place(q_len: int | None, dtype: torch.dtype) -> None:
    """A one-row decode or verify step whose pages are consecutive reads fp32 K/V as views of the cache (other
    dtypes are gathered and cast); slots after the row hold NaN and must not reach the result."""
    gen = torch.Generator().manual_seed(11)
    k, v = torch.randn(12, 4, 2, 16, generator=gen), torch.randn(12, 4, 2, 16, generator=gen)
    k[9:], v[9:] = math.nan, math.nan
    k[8, 2:], v[8, 2:] = math.nan, math.nan
    meta = one_row_meta(26, 4, [2, 3, 4, 5, 6, 7, 8])  # slots 8..33
    qo = None if q_len is None else [0, q_len]
    q = torch.randn(q_len or 1, 4, 16, generator=gen)
    plan = torch_plan.plan_attention(meta, num_qo_heads=4, num_kv_heads=2, head_dim=16,
                                     qo_indptr=None if qo is None else torch.tensor(qo))
    assert plan.chunks[0].first_slot == 8
    k, v, q = k.to(dtype), v.to(dtype), q.to(dtype)
    out = paged_attention(q, k, v, meta, qo_indptr=None if qo is None else torch.tensor(qo), v_scale=2.0)
    want, _ = reference_paged_attention(q, k, v, meta, qo_indptr=qo, v_scale=2.0)
    assert_close(out, want, dtype)
    assert torch_plan.plan_attention(one_row_meta(26, 4, [2, 3, 5, 4, 6, 7, 8]), num_qo_heads=4, num_kv_heads=2,
                                     head_dim=16).chunks[0].first_slot is None


def test_no_cascade_for_one_row_short_prefixes_or_a_soft_cap() -> None:
    case = make_case(np.random.default_rng(5), [300, 310], None, 16, 2, 2, 16, shared_pages=18)
    plan = torch_plan.plan_attention(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16)
    assert plan.shared is not None and plan.shared.num_tokens == 288
    assert torch_plan.plan_attention(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16,
                                     logits_soft_cap=5.0).shared is None
    one = make_case(np.random.default_rng(5), [300], None, 16, 2, 2, 16)
    assert torch_plan.plan_attention(one.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16).shared is None
    short = make_case(np.random.default_rng(5), [300, 310], None, 16, 2, 2, 16, shared_pages=7)  # 112 tokens
    assert torch_plan.plan_attention(short.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16).shared is None
    want, _ = reference(case, logits_soft_cap=5.0)
    assert_close(paged_attention(case.q, case.k, case.v, case.meta, logits_soft_cap=5.0), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("q_lens", [None, [3, 1, 5]])
def test_half_precision_inputs(dtype: torch.dtype, q_lens: list[int] | None) -> None:
    case = make_case(np.random.default_rng(1), [9, 0, 20], q_lens, 4, 2, 2, 16, kv_dtype=dtype, q_dtype=dtype)
    qo = None if q_lens is None else torch.tensor(case.qo_indptr, dtype=torch.int32)
    out, lse = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, return_lse=True, v_scale=2.0)
    want_out, want_lse = reference(case, v_scale=2.0)
    assert out.dtype == dtype and lse.dtype == torch.float32
    assert_close(out, want_out, dtype)
    assert_close(lse, want_lse, dtype)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_kv_is_only_cast_then_scaled(dtype: torch.dtype) -> None:
    case = make_case(np.random.default_rng(2), [7, 16, 1], [2, 4, 1], 4, 2, 4, 8, kv_dtype=dtype)
    qo = torch.tensor(case.qo_indptr, dtype=torch.int32)
    out, lse = paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo, k_scale=0.25, v_scale=4.0,
                               return_lse=True)
    want_out, want_lse = reference(case, k_scale=0.25, v_scale=4.0)
    assert out.dtype == torch.float32
    assert_close(out, want_out)
    assert_close(lse, want_lse)


def test_non_contiguous_cache_in_the_5d_form() -> None:
    case = make_case(np.random.default_rng(3), [5, 12], [2, 3], 4, 2, 2, 8)
    both = torch.stack([case.k, case.v], dim=1)  # [pages, 2, page_size, Hkv, D]: FlashInfer's 5-D NHD form
    qo = torch.tensor(case.qo_indptr)
    out = paged_attention(case.q, both[:, 0], both[:, 1], case.meta, qo_indptr=qo)
    # exact: a layout changes only the gather (a copy into the same contiguous buffers); the arithmetic is the same
    assert torch.equal(out, paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=qo))
    hnd = case.k.transpose(1, 2).contiguous().transpose(1, 2)  # NHD shape over HND storage: no row view exists
    assert not hnd.is_contiguous()
    assert torch.equal(paged_attention(case.q, hnd, case.v, case.meta, qo_indptr=qo), out)


# ------------------------------------------------------------------------------------------------ a real pool
def pool_csr(pool: KvCachePool, lengths: np.ndarray) -> FlashInferKvMetadata:
    if hasattr(pool, "build_flashinfer_metadata"):
        return pool.build_flashinfer_metadata(lengths)
    return build_csr(pool._step.page_table, lengths, pool.page_size, pool.device)  # type: ignore[union-attr]


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_pool_poison_mode_matches_the_reference_and_leaks_no_nan(page_size: int) -> None:
    layers, hkv, d, group = 2, 2, 8, 2
    lengths = np.array([7, 16, 1, 0, 21])  # partial last pages, a full one, an empty row
    capacity = 32
    pool = KvCachePool(layers, 256, hkv, d, page_size, fresh_page_fill="poison")
    ids = [pool.bind_request([100 * r + 1, 100 * r + 2], capacity) for r in range(len(lengths))]
    gen = torch.Generator().manual_seed(7)
    written = [[(torch.randn(n, hkv, d, generator=gen), torch.randn(n, hkv, d, generator=gen)) for n in lengths]
               for _ in range(layers)]
    for rid, n, row in zip(ids, lengths, range(len(lengths))):
        if n:
            pool.activate_step(rid)
            for layer in range(layers):
                pool.put(layer, 0, written[layer][row][0][None], written[layer][row][1][None])
    pool.activate_step(*ids)
    meta = pool_csr(pool, lengths)
    assert meta.kv_lens().tolist() == lengths.tolist()

    # The unwritten tail of every partly written last page is NaN in the pool.
    kc = pool.key_layer(0).view(-1, page_size, hkv, d)
    ptr, last = meta.indptr.tolist(), meta.last_page_len.tolist()
    tails = [(int(meta.indices[ptr[b + 1] - 1]), last[b]) for b in range(len(lengths)) if 0 < last[b] < page_size]
    assert tails or page_size == 1
    for page, used in tails:
        assert torch.isnan(kc[page, used:]).all()

    q_lens = [min(3, int(n)) or 1 for n in lengths]  # a verify window (the empty row still has one query)
    qo = [0, *np.cumsum(q_lens).tolist()]
    for layer in range(layers):
        k = pool.key_layer(layer).view(-1, page_size, hkv, d)
        v = pool.value_layer(layer).view(-1, page_size, hkv, d)
        dense = dense_case(written[layer], page_size)
        for qo_indptr, total in ((None, len(lengths)), (qo, qo[-1])):
            q = torch.randn(total, hkv * group, d, generator=gen)
            tensor_qo = None if qo_indptr is None else torch.tensor(qo_indptr, dtype=torch.int32)
            out, lse = paged_attention(q, k, v, meta, qo_indptr=tensor_qo, return_lse=True)
            want_out, want_lse = reference_paged_attention(q, dense.k, dense.v, dense.meta, qo_indptr=qo_indptr)
            assert_close(out, want_out)
            assert_close(lse, want_lse)


def dense_case(rows: list[tuple[torch.Tensor, torch.Tensor]], page_size: int) -> Case:
    """The written K/V of each row laid out on fresh ascending pages (independent of the pool's placement)."""
    hkv, d = rows[0][0].shape[1:]
    pages = [-(-r[0].shape[0] // page_size) for r in rows]
    k = torch.zeros(sum(pages), page_size, hkv, d)
    v = torch.zeros_like(k)
    table = np.zeros((len(rows), max(pages + [1])), dtype=np.int64)
    at = 0
    for b, ((kr, vr), n) in enumerate(zip(rows, pages)):
        table[b, :n] = np.arange(at, at + n)
        k[at:at + n].view(-1, hkv, d)[: kr.shape[0]] = kr
        v[at:at + n].view(-1, hkv, d)[: vr.shape[0]] = vr
        at += n
    lengths = np.array([r[0].shape[0] for r in rows])
    return Case(torch.empty(0), k, v, build_csr(table, lengths, page_size, CPU), None)


def test_pool_fp8_with_fixed_scales() -> None:
    hkv, d, ps = 1, 8, 4
    pool = KvCachePool(1, 64, hkv, d, ps, dtype=torch.float8_e4m3fn, k_scale=0.5, v_scale=2.0,
                       fresh_page_fill="poison")
    rid = pool.bind_request([1, 2, 3], 16)
    gen = torch.Generator().manual_seed(8)
    k, v = torch.randn(1, 10, hkv, d, generator=gen), torch.randn(1, 10, hkv, d, generator=gen)
    pool.put(0, 0, k, v)
    pool.activate_step(rid)
    meta = pool_csr(pool, np.array([10]))
    q = torch.randn(1, 2, d, generator=gen)
    out, lse = paged_attention(q, pool.key_layer(0), pool.value_layer(0), meta, k_scale=pool.k_scale,
                               v_scale=pool.v_scale, return_lse=True)
    stored_k = (k[0] / 0.5).to(torch.float8_e4m3fn).float() * 0.5  # what FP8 storage keeps, dequantised
    stored_v = (v[0] / 2.0).to(torch.float8_e4m3fn).float() * 2.0
    dense = dense_case([(stored_k, stored_v)], ps)
    want_out, want_lse = reference_paged_attention(q, dense.k, dense.v, dense.meta)
    assert_close(out, want_out)
    assert_close(lse, want_lse)


# ------------------------------------------------------------------------------------------------ bad input
def small() -> Case:
    return make_case(np.random.default_rng(9), [5, 3], None, 4, 2, 2, 8)


def meta_of(indptr: list[int], indices: list[int], last: list[int], ps: int = 4) -> FlashInferKvMetadata:
    i32 = torch.int32
    return FlashInferKvMetadata(torch.tensor(indptr, dtype=i32), torch.tensor(indices, dtype=i32),
                                torch.tensor(last, dtype=i32), ps)


@pytest.mark.parametrize("meta, match", [
    (meta_of([0, 2, 3], [0, 1, 2], [5, 3]), "last_page_len"),  # > page_size
    (meta_of([0, 2, 3], [0, 1, 2], [0, 3]), "last_page_len"),  # 0 for a non-empty row
    (meta_of([0, 2, 2], [0, 1], [1, 2]), "last_page_len"),  # an empty row must say 0
    (meta_of([0, 2, 3], [0, 1, 99], [1, 3]), "outside"),  # page out of range
    (meta_of([0, 2, 3], [0, -1, 2], [1, 3]), "outside"),
    (meta_of([0, 2, 4], [0, 1, 2], [1, 3]), "indices holds only"),
    (meta_of([1, 2, 3], [0, 1, 2], [1, 3]), "start at 0"),
    (FlashInferKvMetadata(torch.tensor([0, 2, 3]), torch.tensor([0, 1, 2]), torch.tensor([1, 3]), 4), "int32"),
])
def test_bad_metadata(meta: FlashInferKvMetadata, match: str) -> None:
    c = small()
    with pytest.raises(ValueError, match=match):
        paged_attention(c.q, c.k, c.v, meta)


@pytest.mark.parametrize("qo_indptr, match", [
    ([0, 1], "B \\+ 1"),  # too few entries
    ([0, 1, 2, 3], "B \\+ 1"),
    ([1, 2, 3], "start at 0"),
    ([0, 3, 2], "never decrease"),
    ([0, 1, 3], "query rows"),  # last != total_q (2)
    ([0.0, 1.0, 2.0], "integer"),
    ([[0, 1, 2]], "1-D"),
])
def test_bad_qo_indptr(qo_indptr: list, match: str) -> None:
    c = small()
    with pytest.raises(ValueError, match=match):
        paged_attention(c.q, c.k, c.v, c.meta, qo_indptr=torch.tensor(qo_indptr))


def test_bad_shapes_and_arguments() -> None:
    c = small()  # q [2, 4, 8], K/V [pages, 4, 2, 8]
    bad = [
        ({"q": torch.randn(2, 3, 8)}, "multiple"),  # Hq 3 over Hkv 2
        ({"q": torch.randn(2, 4, 16)}, "head dims differ"),
        ({"q": torch.randn(2, 32)}, "total_q, Hq, D"),
        ({"q": torch.randn(3, 4, 8)}, "one query per row"),  # decode needs total_q == B
        ({"v": c.v[:, :, :1]}, "must match"),
        ({"k": c.k.double()}, "must match"),
        ({"k": c.k[:, :2], "v": c.v[:, :2]}, "page_size=4"),  # pages of the wrong size
        ({"k": c.k.flatten(0, 1)[:-1], "v": c.v.flatten(0, 1)[:-1]}, "multiple of page_size"),
        ({"k": c.k.int(), "v": c.v.int()}, "floating point"),
        ({"logits_soft_cap": -1.0}, "positive"),
        ({"sm_scale": math.nan}, "finite"),
        ({"meta": "csr"}, "FlashInferKvMetadata"),
    ]
    for change, match in bad:
        assert isinstance(change, dict)
        args: dict[str, Any] = {"q": c.q, "k": c.k, "v": c.v, "meta": c.meta}
        args.update(change)
        kw = {key: args.pop(key) for key in ("logits_soft_cap", "sm_scale") if key in args}
        with pytest.raises(ValueError, match=match):
            paged_attention(args["q"], args["k"], args["v"], args["meta"], **kw)


# ------------------------------------------------------------------------------------------------ the backend
def test_backend_plan_once_run_per_layer_equals_paged_attention() -> None:
    rng = np.random.default_rng(10)
    case = make_case(rng, [13, 0, 30, 4], [4, 2, 1, 4], 4, 2, 2, 16)
    layers = []  # same pages, new values: one case per layer
    for _ in range(3):
        k, v = (torch.where(t.isnan(), t, torch.randn(t.shape)) for t in (case.k, case.v))
        layers.append(Case(torch.randn(case.q.shape), k, v, case.meta, case.qo_indptr))
    qo = torch.tensor(case.qo_indptr, dtype=torch.int32)
    backend = TorchBackend()
    assert backend.name == "reference"
    for chunk_bytes in (torch_plan.CHUNK_BYTES, 1):
        with mock.patch.object(torch_plan, "CHUNK_BYTES", chunk_bytes):
            backend.plan(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16, qo_indptr=qo,
                         sm_scale=0.2, logits_soft_cap=8.0)
            for layer in layers:  # same CSR, different K/V per layer (layers share the plan's page layout)
                k, v = layer.k, layer.v
                out, lse = backend.run(layer.q, k, v, k_scale=0.5, v_scale=2.0, return_lse=True)
                want = paged_attention(layer.q, k, v, case.meta, qo_indptr=qo, sm_scale=0.2, logits_soft_cap=8.0,
                                       k_scale=0.5, v_scale=2.0, return_lse=True)
                assert torch.equal(out, want[0]) and torch.equal(lse, want[1])  # one plan, the same kernels
                want_out, _ = reference(layer, sm_scale=0.2, logits_soft_cap=8.0, k_scale=0.5, v_scale=2.0)
                assert_close(out, want_out)
    backend.plan(case.meta, num_qo_heads=4, num_kv_heads=2, head_dim=16)  # decode
    q = torch.randn(4, 4, 16)
    assert torch.equal(backend.run(q, case.k, case.v), paged_attention(q, case.k, case.v, case.meta))  # as above


def test_backend_run_before_plan_and_mismatches() -> None:
    c = small()
    backend = TorchBackend()
    with pytest.raises(RuntimeError, match="before plan"):
        backend.run(c.q, c.k, c.v)
    backend.plan(c.meta, num_qo_heads=4, num_kv_heads=2, head_dim=8)
    backend.run(c.q, c.k, c.v)
    with pytest.raises(ValueError, match="q_dtype"):
        backend.run(c.q.double(), c.k, c.v)
    with pytest.raises(ValueError, match="outside the cache"):
        backend.run(c.q, c.k[:1], c.v[:1])
    with pytest.raises(ValueError, match="planned"):
        backend.run(torch.randn(2, 2, 8), c.k[:, :, :1], c.v[:, :, :1])
    with pytest.raises(ValueError, match="multiple"):
        backend.plan(c.meta, num_qo_heads=3, num_kv_heads=2, head_dim=8)
    with pytest.raises(RuntimeError, match="before plan"):  # a failed plan drops the previous one
        backend.run(c.q, c.k, c.v)
    backend.plan(c.meta, num_qo_heads=4, num_kv_heads=2, head_dim=8, q_dtype=torch.bfloat16,
                 kv_dtype=torch.bfloat16)
    out = backend.run(c.q.bfloat16(), c.k.bfloat16(), c.v.bfloat16())
    assert out.dtype == torch.bfloat16
    # later layers are checked by signature: anything that differs from the checked call is checked in full again
    backend.plan(c.meta, num_qo_heads=4, num_kv_heads=2, head_dim=8)
    first = backend.run(c.q, c.k, c.v)
    with pytest.raises(ValueError, match="k_scale"):
        backend.run(c.q, c.k, c.v, k_scale=float("nan"))
    with pytest.raises(ValueError, match="outside the cache"):
        backend.run(c.q, c.k[:1], c.v[:1])
    assert torch.equal(backend.run(c.q, c.k, c.v), first)  # the same call again: the same bits


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("mode", ["decode", "verify", "tree"])
def test_one_row_over_several_runs_reads_each_run_in_place(seed: int, mode: str) -> None:
    """A one-row step whose pages form several runs of consecutive pages (a FIFO free list wrapping around) is
    attended run by run, the runs merged by log-sum-exp: equal to the float64 reference and to the gathered read of
    the same plan, blind queries of a tree mask giving 0 and -inf; NaN in every slot the row does not own."""
    rng = np.random.default_rng(seed)
    page_size, hkv, group, d, num_pages = 4, 2, 3, 16, 80
    kv_len = int(rng.integers(40, 250))
    n_pages = -(-kv_len // page_size)
    wrap = int(rng.integers(1, n_pages))  # the row's first pages at the end of the pool, the rest from page r
    start = int(rng.integers(0, num_pages - n_pages))
    pages = list(range(num_pages - wrap, num_pages)) + list(range(start, start + n_pages - wrap))
    if len(set(pages)) != n_pages:  # the two runs overlap: take the second run elsewhere
        pages = list(range(num_pages - wrap, num_pages)) + list(range(0, n_pages - wrap))
    gen = torch.Generator().manual_seed(seed)
    k = torch.full((num_pages, page_size, hkv, d), math.nan)
    v = torch.full((num_pages, page_size, hkv, d), math.nan)
    for t in range(kv_len):
        k[pages[t // page_size], t % page_size] = torch.randn(hkv, d, generator=gen)
        v[pages[t // page_size], t % page_size] = torch.randn(hkv, d, generator=gen)
    meta = one_row_meta(kv_len, page_size, pages)
    q_len = 1 if mode == "decode" else int(rng.integers(2, 9))
    qo = None if mode == "decode" else torch.tensor([0, q_len])
    mask = None
    if mode == "tree":
        mask = torch.from_numpy(rng.random((q_len, kv_len)) < 0.3)
        mask[0] = False  # a blind query
    q = torch.randn(q_len, hkv * group, d, generator=gen)
    with mock.patch.object(torch_plan, "SPAN_MIN_TOKENS", 4):
        plan = torch_plan.plan_attention(meta, num_qo_heads=hkv * group, num_kv_heads=hkv, head_dim=d, qo_indptr=qo,
                                         custom_mask=mask)
        assert plan.chunks[0].spans is not None and len(plan.chunks[0].spans) >= 2
        out, lse = paged_attention(q, k, v, meta, qo_indptr=qo, v_scale=1.5, custom_mask=mask, return_lse=True)
    with mock.patch.object(torch_plan, "SPAN_MIN_TOKENS", 1 << 40):  # the same plan, gathered
        assert torch_plan.plan_attention(meta, num_qo_heads=hkv * group, num_kv_heads=hkv, head_dim=d,
                                         qo_indptr=qo, custom_mask=mask).chunks[0].spans is None
        gathered, gathered_lse = paged_attention(q, k, v, meta, qo_indptr=qo, v_scale=1.5, custom_mask=mask,
                                                 return_lse=True)
    assert not torch.isnan(out).any()
    if mask is None:
        want, want_lse = reference_paged_attention(q, k, v, meta, qo_indptr=qo, v_scale=1.5)
        assert_close(out, want)
        assert_close(lse, want_lse)
    else:
        assert (out[0] == 0).all() and (lse[0] == -math.inf).all()
    assert torch.allclose(out, gathered, atol=1e-5)
    assert torch.equal(lse == -math.inf, gathered_lse == -math.inf)
    seen = lse != -math.inf
    assert torch.allclose(lse[seen], gathered_lse[seen], atol=1e-4)
