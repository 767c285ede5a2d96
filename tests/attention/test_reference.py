"""The paged-attention contract on hand-computed cases (gather order, bottom-right causal mask,
custom masks, GQA, scales, soft cap, base-2 LSE, queries that see no key, NaN), checked on the
semantic reference (``attention.reference``, in float64 and float32) and on the torch backend
alike; and the reference's own consistency. The torch backend against the reference on random
cases is test_torch_backend.py."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from smile_llm.attention.reference import dense_reference_attention, reference_paged_attention
from smile_llm.attention.torch.backend import paged_attention
from smile_llm.cache.metadata import FlashInferKvMetadata

from .cases import assert_close, make_case, one_row_meta

Attend = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _torch_backend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: FlashInferKvMetadata,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return paged_attention(q, k, v, meta, return_lse=True, **kwargs)


def _reference(dtype: torch.dtype) -> Attend:
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: FlashInferKvMetadata,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return reference_paged_attention(q, k, v, meta, dtype=dtype, **kwargs)
    return attend


IMPLEMENTATIONS: dict[str, Attend] = {
    "reference-float64": _reference(torch.float64),
    "reference-float32": _reference(torch.float32),
    "torch-backend": _torch_backend,
}


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def attend(request: pytest.FixtureRequest) -> Attend:
    """``(out, lse)`` of paged attention by one implementation of the contract."""
    return IMPLEMENTATIONS[request.param]


# ------------------------------------------------------------------------------------------ by hand
def test_bottom_right_causal_mask_and_base2_lse_by_hand(attend: Attend) -> None:
    # Zero queries give uniform attention over what each query sees; V rows are one-hot positions.
    kv_len, q_len, ps = 5, 3, 2
    k = torch.zeros(4, ps, 1, kv_len)
    v = torch.full((4, ps, 1, kv_len), math.nan)  # slot 1 of page 0 (position 5) is never written
    pages = [3, 1, 0]
    for t in range(kv_len):
        v[pages[t // ps], t % ps, 0] = torch.eye(kv_len)[t]
    q = torch.zeros(q_len, 1, kv_len)
    meta = one_row_meta(kv_len, ps, pages)
    out, lse = attend(q, k, v, meta, qo_indptr=torch.tensor([0, q_len]))
    for i in range(q_len):
        seen = i + kv_len - q_len + 1  # query i sees kv_idx <= i + kv_len - q_len
        expect = [1.0 / seen] * seen + [0.0] * (kv_len - seen)
        assert out[i, 0].tolist() == pytest.approx(expect, abs=1e-7)
        assert lse[i, 0].item() == pytest.approx(math.log2(seen), abs=1e-6)
    noncausal, _ = attend(q, k, v, meta, qo_indptr=torch.tensor([0, q_len]), causal=False)
    assert noncausal[:, 0].tolist() == [pytest.approx([1 / kv_len] * kv_len, abs=1e-7)] * q_len
    decode, _ = attend(q[:1], k, v, meta)  # no qo_indptr: one query per row, which sees every key
    assert decode[0, 0].tolist() == pytest.approx([1 / kv_len] * kv_len, abs=1e-7)


def test_a_custom_mask_replaces_the_causal_mask_by_hand(attend: Attend) -> None:
    # Two rows of 4 and 3 keys with 2 queries each; each row's [2, kv_len] block of the flat mask.
    v = torch.zeros(4, 4, 1, 4)
    for page, slot, pos in ((2, 0, 0), (2, 1, 1), (2, 2, 2), (2, 3, 3), (0, 0, 0), (0, 1, 1), (0, 2, 2)):
        v[page, slot, 0, pos] = 1.0  # one-hot by position
    meta = FlashInferKvMetadata(torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([2, 0], dtype=torch.int32),
                                torch.tensor([4, 3], dtype=torch.int32), 4)
    mask = torch.tensor([1, 0, 1, 0,  0, 1, 0, 1,    # row 0: query 0 sees keys 0, 2; query 1 sees 1, 3
                         0, 0, 0,  1, 1, 1], dtype=torch.bool)  # row 1: query 0 sees none, query 1 all
    out, lse = attend(torch.zeros(4, 1, 4), torch.zeros_like(v), v, meta,
                      qo_indptr=torch.tensor([0, 2, 4]), causal=True, custom_mask=mask)
    assert out[:, 0].tolist() == [pytest.approx(row, abs=1e-7) for row in
                                  ([0.5, 0, 0.5, 0], [0, 0.5, 0, 0.5], [0, 0, 0, 0], [1 / 3, 1 / 3, 1 / 3, 0])]
    assert lse[:, 0].tolist() == [pytest.approx(1.0), pytest.approx(1.0), -math.inf,
                                  pytest.approx(math.log2(3))]


def test_queries_that_see_no_key_give_zero_and_minus_inf(attend: Attend) -> None:
    # q_len 4 > kv_len 2 under causal: queries 0 and 1 see nothing (FlashInfer leaves them undefined).
    gen = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 4, 1, 8, generator=gen), torch.randn(1, 4, 1, 8, generator=gen)
    q = torch.randn(4, 2, 8, generator=gen)
    out, lse = attend(q, k, v, one_row_meta(2, 4, [0]), qo_indptr=torch.tensor([0, 4]))
    assert (out[:2] == 0).all() and (lse[:2] == -math.inf).all()
    assert torch.isfinite(lse[2:]).all() and out[2:].abs().sum() > 0
    assert torch.allclose(out[2].double(), v[0, 0].double().expand(2, 8), atol=1e-6)  # sees kv 0 only


def test_gqa_maps_query_head_h_to_kv_head_h_over_group(attend: Attend) -> None:
    v = torch.stack([torch.full((4, 8), 1.0), torch.full((4, 8), 2.0)], dim=1)[None]  # [1, 4, Hkv=2, 8]
    k = torch.randn_like(v)
    out, _ = attend(torch.randn(1, 4, 8), k, v, one_row_meta(3, 4, [0]))
    assert out[0, :, 0].tolist() == pytest.approx([1.0, 1.0, 2.0, 2.0])  # not [1, 2, 1, 2] (h % Hkv)


def test_soft_cap_and_scales_by_hand(attend: Attend) -> None:
    # Two keys with q.k = 10 and 0: logits 10*s and 0, capped to c*tanh(10*s/c).
    d = 4
    k = torch.zeros(1, 2, 1, d)
    k[0, 0, 0, 0] = 10.0
    v = torch.zeros(1, 2, 1, d)
    v[0, 0, 0, 1] = 1.0
    v[0, 1, 0, 2] = 1.0
    q = torch.zeros(1, 1, d)
    q[0, 0, 0] = 1.0
    meta = one_row_meta(2, 2, [0])
    s, cap, ks, vs = 0.7, 3.0, 0.5, 2.0
    logit = cap * math.tanh(10.0 * s * ks / cap)
    p0 = 1.0 / (1.0 + math.exp(-logit))
    out, lse = attend(q, k, v, meta, sm_scale=s, logits_soft_cap=cap, k_scale=ks, v_scale=vs)
    assert out[0, 0].tolist() == pytest.approx([0.0, vs * p0, vs * (1 - p0), 0.0], abs=1e-6)
    assert lse[0, 0].item() == pytest.approx(math.log2(math.exp(logit) + 1.0), abs=1e-5)
    default, _ = attend(q, k, v, meta)  # sm_scale = 1/sqrt(D), no cap
    p0 = 1.0 / (1.0 + math.exp(-10.0 / math.sqrt(d)))
    assert default[0, 0].tolist() == pytest.approx([0.0, p0, 1 - p0, 0.0], abs=1e-6)


def test_nan_inside_kv_len_still_propagates(attend: Attend) -> None:
    case = make_case(np.random.default_rng(6), [6, 6], None, 4, 1, 1, 8)
    page = int(case.meta.indices[int(case.meta.indptr[1])])  # row 1's first page
    case.k[page, 2] = math.nan
    out, _ = attend(case.q, case.k, case.v, case.meta)
    assert torch.isfinite(out[0]).all() and torch.isnan(out[1]).all()


def test_empty_rows_and_all_empty_batches(attend: Attend) -> None:
    case = make_case(np.random.default_rng(4), [0, 6, 0], None, 4, 1, 2, 8)
    out, lse = attend(case.q, case.k, case.v, case.meta)
    assert (out[[0, 2]] == 0).all() and (lse[[0, 2]] == -math.inf).all()
    assert torch.isfinite(out[1]).all() and torch.isfinite(lse[1]).all()
    empty = make_case(np.random.default_rng(5), [0, 0], [1, 0], 4, 1, 1, 8)
    out, lse = attend(empty.q, empty.k, empty.v, empty.meta, qo_indptr=torch.tensor([0, 1, 1]))
    assert out.shape == (1, 1, 8) and (out == 0).all() and lse.tolist() == [[-math.inf]]


# -------------------------------------------------------------------------------- the reference itself
@pytest.mark.parametrize("seed", range(4))
def test_the_reference_in_float32_agrees_with_float64(seed: int) -> None:
    """Float32 is the reference at float32's rounding: within the tolerance a float32 result gets."""
    case = make_case(np.random.default_rng(seed), [37, 0, 20, 5], [6, 1, 20, 2], 4, 2, 3, 16)
    kw: dict[str, Any] = {"qo_indptr": case.qo_indptr, "sm_scale": 0.3, "logits_soft_cap": 4.0, "v_scale": 2.0}
    want_out, want_lse = reference_paged_attention(case.q, case.k, case.v, case.meta, **kw)
    out, lse = reference_paged_attention(case.q, case.k, case.v, case.meta, dtype=torch.float32, **kw)
    assert out.dtype == lse.dtype == torch.float32 and want_out.dtype == torch.float64
    assert_close(out, want_out)
    assert_close(lse, want_lse)


def test_the_reference_reads_the_pool_layout_and_any_qo_indptr() -> None:
    """``[num_slots, Hkv, D]`` K/V read like ``[num_pages, page_size, Hkv, D]``, and ``qo_indptr`` as a
    list, an array or a tensor on any device gives the same result."""
    case = make_case(np.random.default_rng(7), [9, 14], [3, 5], 4, 2, 2, 8)
    want = reference_paged_attention(case.q, case.k, case.v, case.meta, qo_indptr=case.qo_indptr)
    flat = reference_paged_attention(case.q, case.k.flatten(0, 1), case.v.flatten(0, 1), case.meta,
                                     qo_indptr=np.asarray(case.qo_indptr))
    tensor = reference_paged_attention(case.q, case.k, case.v, case.meta,
                                       qo_indptr=torch.tensor(case.qo_indptr, dtype=torch.int32))
    for got in (flat, tensor):  # exact: the forms change only the indexing, the float64 arithmetic is the same
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_dense_reference_attention_is_softmax_attention() -> None:
    """One query over two keys by hand (natural-log LSE), a mask, and a query that sees no key."""
    q = torch.tensor([[[1.0, 0.0]]])  # [1, Lq=1, D=2]
    k = torch.tensor([[[2.0, 0.0], [0.0, 1.0]]])  # logits 2s and 0
    v = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    out, lse = dense_reference_attention(q, k, v, scale=0.5)
    p0 = math.exp(1.0) / (math.exp(1.0) + 1.0)
    assert out[0, 0].tolist() == pytest.approx([p0, 1 - p0]) and lse.item() == pytest.approx(math.log(math.e + 1))
    out, lse = dense_reference_attention(q, k, v, scale=0.5, seen=torch.tensor([[False, True]]))
    assert out[0, 0].tolist() == pytest.approx([0.0, 1.0]) and lse.item() == pytest.approx(0.0)
    out, lse = dense_reference_attention(q, k, v, scale=0.5, seen=torch.tensor([[False, False]]))
    assert out[0, 0].tolist() == [0.0, 0.0] and lse.item() == -math.inf
