"""FlashInfer against the reference on a real pool's CSR, and CUDA-graph capture and replay (GPU only).

Every test is marked ``cuda`` and skipped unless CUDA and flashinfer are both available; ``scripts/gpu_check.sh``
runs them on a GPU machine (the token-tree case in its token-tree step). Head dim 128 and a small set of
dtype/option combinations keep FlashInfer's JIT builds to eight modules (``scripts/gpu_check.sh`` builds exactly
these first): CUDA-core decode fp16 and bf16; the fa2 prefill kernel (also tensor-core decode, and every
custom-mask plan: fa3 has no custom masks) fp16, bf16, fp16 with a soft cap, and bf16 queries over FP8 KV; and, on
Hopper, where the prefill wrapper takes fa3, fa3 prefill fp16 and bf16 (the soft-cap test forces fa2).

Pages are handed out in a shuffled order, so rows are scattered over the cache and a kernel that ignored
``indices`` would fail. Tolerances: fp16/bf16 ``rtol = atol = 2e-2`` (the reference accumulates the same inputs in
fp32), float32 ``1e-3``. Graph replays are compared bit for bit with an eager run of the same wrapper and plan
(same kernel, same schedule) and within tolerance with a separate eager wrapper and the reference (FlashInfer
#2511, #4647: graph and eager schedules may differ).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from smile_llm.attention.flashinfer import FlashInferBackend, flashinfer_available
from smile_llm.cache import KvCachePool
from smile_llm.cache.metadata import FlashInferKvMetadata

DEVICE = "cuda"
HEAD_DIM = 128
NUM_KV_HEADS = 2
TOL = {torch.float16: 2e-2, torch.bfloat16: 2e-2, torch.float32: 1e-3}


def _available() -> bool:
    return torch.cuda.is_available() and flashinfer_available()  # never imports flashinfer without CUDA


pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not _available(), reason="needs a CUDA device and flashinfer (pip install -e '.[gpu]')"),
]


# ------------------------------------------------------------------------------------------------ helpers
def _randn(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen, device=DEVICE) * scale).to(dtype)


def _pool(page_size: int, num_pages: int, dtype: torch.dtype, *, k_scale: float = 1.0, v_scale: float = 1.0,
          seed: int = 0) -> KvCachePool:
    """A one-layer pool whose free list is shuffled: every page is taken and given back in random order."""
    pool = KvCachePool(1, num_pages * page_size, NUM_KV_HEADS, HEAD_DIM, page_size, device=DEVICE, dtype=dtype,
                       k_scale=k_scale, v_scale=v_scale, zero_rejected_kv=False, fresh_page_fill="zero")
    pages = pool.alloc(pool.free_slots).reshape(-1, page_size)
    for p in np.random.default_rng(seed).permutation(len(pages)):
        pool.free(pages[p])
    return pool


def _bind_and_write(pool: KvCachePool, batch: int, length: int, capacity: int, gen: torch.Generator) -> list[int]:
    """Bind ``batch`` rows of ``capacity`` tokens and write random K/V at positions ``[0, length)`` of each."""
    ids = pool.bind_requests(batch, capacity)
    assert len(ids) == batch and pool.request_capacity >= capacity
    shape = (batch, length, NUM_KV_HEADS, HEAD_DIM)
    pool.put(0, 0, _randn(shape, pool.compute_dtype, gen), _randn(shape, pool.compute_dtype, gen))
    return ids


def _layers(pool: KvCachePool) -> tuple[torch.Tensor, torch.Tensor]:
    shape = (-1, pool.page_size, NUM_KV_HEADS, HEAD_DIM)  # FlashInfer's NHD pages
    return pool.key_layer(0).view(shape), pool.value_layer(0).view(shape)


def _qo_indptr(qo_lens: list[int]) -> torch.Tensor:
    return torch.tensor(np.concatenate([[0], np.cumsum(qo_lens)]), dtype=torch.int32, device=DEVICE)


def _reference(pool: KvCachePool, q: torch.Tensor, meta: FlashInferKvMetadata, **kwargs: Any) -> Any:
    from smile_llm.attention.torch.backend import paged_attention

    k, v = _layers(pool)
    return paged_attention(q, k, v, meta, k_scale=pool.k_scale, v_scale=pool.v_scale, return_lse=True, **kwargs)


def _plan(backend: FlashInferBackend, pool: KvCachePool, meta: FlashInferKvMetadata, q: torch.Tensor,
          **kwargs: Any) -> None:
    backend.plan(meta, num_qo_heads=q.shape[1], num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM, q_dtype=q.dtype,
                 kv_dtype=pool.dtype, **kwargs)


def _run(backend: FlashInferBackend, pool: KvCachePool, q: torch.Tensor, return_lse: bool = True) -> Any:
    k, v = _layers(pool)
    return backend.run(q, k, v, k_scale=pool.k_scale, v_scale=pool.v_scale, return_lse=return_lse)


def _assert_matches(got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor],
                    tol: float) -> None:
    out, lse = got
    ref_out, ref_lse = want
    assert out.dtype == ref_out.dtype and out.shape == ref_out.shape
    assert torch.isfinite(out).all(), "FlashInfer output has NaN/inf"
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=tol, atol=tol)
    seen = torch.isfinite(ref_lse)
    assert torch.equal(seen, torch.isfinite(lse)), "rows that see no key differ"
    torch.testing.assert_close(lse[seen], ref_lse[seen], rtol=tol, atol=tol)


def _eager_check(pool: KvCachePool, meta: FlashInferKvMetadata, q: torch.Tensor, kernel: str,
                 kernel_backend: str | None = None, **plan_kwargs: Any) -> None:
    backend = FlashInferBackend(DEVICE, kernel_backend=kernel_backend)
    _plan(backend, pool, meta, q, **plan_kwargs)
    assert backend.kernel == kernel
    got = _run(backend, pool, q)
    want = _reference(pool, q, meta, **plan_kwargs)
    _assert_matches(got, want, TOL[q.dtype])
    q2 = torch.flip(q, dims=(0,)).contiguous()  # a second layer under the same plan
    _assert_matches(_run(backend, pool, q2), _reference(pool, q2, meta, **plan_kwargs), TOL[q.dtype])


class _CapturedRun:
    """``fn`` captured in a CUDA graph after one eager warm-up; ``replay()`` reruns it into the same output."""

    def __init__(self, fn: Callable[[], torch.Tensor]) -> None:
        fn()  # warm-up: loads the kernels outside capture
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn()
        self.replay()  # capture records but does not execute

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        torch.cuda.synchronize()
        return self.out


# ------------------------------------------------------------------------------------------------ eager
LENGTHS = [1, 17, 40, 64]  # one token, inside the 2nd page, mid page, a full last page (page 16)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_decode_matches_reference(dtype: torch.dtype, group: int, page_size: int) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    pool = _pool(page_size, 4 * 64 // page_size + 8, dtype)
    _bind_and_write(pool, 4, 64, 64, gen)
    meta = pool.build_flashinfer_metadata(LENGTHS)
    q = _randn((4, NUM_KV_HEADS * group, HEAD_DIM), dtype, gen)
    _eager_check(pool, meta, q, "decode_tc" if group >= 4 else "decode")


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4, 8])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_ragged_prefill_matches_reference(dtype: torch.dtype, group: int, page_size: int) -> None:
    # Rows: a whole prompt, a chunk after a cached prefix, a one-token extend, a prompt ending on a page boundary.
    kv_lens, qo_lens = [7, 33, 64, 16], [7, 5, 1, 16]
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    pool = _pool(page_size, 4 * 64 // page_size + 8, dtype)
    _bind_and_write(pool, 4, 64, 64, gen)
    meta = pool.build_flashinfer_metadata(kv_lens)
    q = _randn((sum(qo_lens), NUM_KV_HEADS * group, HEAD_DIM), dtype, gen)
    _eager_check(pool, meta, q, "prefill", qo_indptr=_qo_indptr(qo_lens), causal=True)


def test_non_causal_prefill_matches_reference() -> None:
    kv_lens, qo_lens = [9, 30], [4, 30]
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    pool = _pool(16, 16, torch.bfloat16)
    _bind_and_write(pool, 2, 32, 32, gen)
    q = _randn((sum(qo_lens), NUM_KV_HEADS * 4, HEAD_DIM), torch.bfloat16, gen)
    _eager_check(pool, pool.build_flashinfer_metadata(kv_lens), q, "prefill", qo_indptr=_qo_indptr(qo_lens),
                 causal=False)


@pytest.mark.parametrize("window", range(2, 9))
def test_verify_windows_match_reference(window: int) -> None:
    starts = np.array([5, 16, 30])  # ragged rows; windows cross page boundaries for some W
    gen = torch.Generator(device=DEVICE).manual_seed(10 + window)
    pool = _pool(16, 3 * 3 + 4, torch.bfloat16)
    _bind_and_write(pool, 3, 48, 48, gen)
    meta = pool.build_flashinfer_metadata((starts + window).tolist())
    q = _randn((3 * window, NUM_KV_HEADS * 4, HEAD_DIM), torch.bfloat16, gen)
    _eager_check(pool, meta, q, "prefill", qo_indptr=pool.verify_qo_indptr(3, window), causal=True)


def test_token_tree_masks_match_reference() -> None:
    """Token-tree verify windows: FlashInfer's prefill with ``custom_mask`` (ancestors only, RoPE aside) against
    the reference under the same mask, ragged contexts; ``qo_indptr`` and the CSR on the device (FlashInfer's mask
    plan does arithmetic on both) and, on Hopper, fa2 (fa3 has no custom masks)."""
    from smile_llm.speculative.draft_tree import DraftTree, window_mask

    parents = np.array([[0, 0, 1, 1, 2, 0, 4], [0, 1, 2, 3, 4, 5, 6], [0, 0, 0, 1, 2, 3, 3]])
    tree = DraftTree(torch.zeros(parents.shape, dtype=torch.int64), parents)
    starts = np.array([5, 16, 30])
    window = tree.size + 1
    gen = torch.Generator(device=DEVICE).manual_seed(21)
    pool = _pool(16, 3 * 3 + 4, torch.bfloat16)
    _bind_and_write(pool, 3, 48, 48, gen)
    meta = pool.build_flashinfer_metadata((starts + window).tolist())
    q = _randn((3 * window, NUM_KV_HEADS * 4, HEAD_DIM), torch.bfloat16, gen)
    _eager_check(pool, meta, q, "prefill", qo_indptr=pool.verify_qo_indptr(3, window), causal=False,
                 custom_mask=window_mask(tree, starts).to(DEVICE))


@pytest.mark.parametrize("kernel", ["decode_tc", "prefill"])
def test_logits_soft_cap_matches_reference(kernel: str) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    pool = _pool(16, 24, torch.float16)
    _bind_and_write(pool, 4, 64, 64, gen)
    meta = pool.build_flashinfer_metadata(LENGTHS)
    qo_lens = [1, 3, 8, 2]
    rows = 4 if kernel == "decode_tc" else sum(qo_lens)
    q = _randn((rows, NUM_KV_HEADS * 4, HEAD_DIM), torch.float16, gen, scale=4.0)  # logits ~ N(0, 16): cap bites
    extra: dict[str, Any] = {} if kernel == "decode_tc" else {"qo_indptr": _qo_indptr(qo_lens)}
    _eager_check(pool, meta, q, kernel, "fa2", logits_soft_cap=5.0, **extra)


@pytest.mark.parametrize("kernel", ["decode_tc", "prefill"])
def test_fp8_kv_with_scales_matches_reference(kernel: str) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(5)
    pool = _pool(16, 24, torch.float8_e4m3fn, k_scale=0.5, v_scale=2.0)  # stores x / scale; reads bf16 on CUDA
    _bind_and_write(pool, 4, 64, 64, gen)
    meta = pool.build_flashinfer_metadata(LENGTHS)
    qo_lens = [1, 4, 3, 6]
    group = 1 if kernel == "decode_tc" else 4  # FP8 KV takes the tensor-core decode even at group 1
    rows = 4 if kernel == "decode_tc" else sum(qo_lens)
    q = _randn((rows, NUM_KV_HEADS * group, HEAD_DIM), torch.bfloat16, gen)
    extra: dict[str, Any] = {} if kernel == "decode_tc" else {"qo_indptr": _qo_indptr(qo_lens)}
    _eager_check(pool, meta, q, kernel, **extra)


@pytest.mark.parametrize("decode", [True, False])
def test_float32_goes_through_the_reference(decode: bool) -> None:
    gen = torch.Generator(device=DEVICE).manual_seed(6)
    pool = _pool(16, 24, torch.float32)
    _bind_and_write(pool, 4, 64, 64, gen)
    meta = pool.build_flashinfer_metadata(LENGTHS)
    qo_lens = [1, 2, 3, 4]
    q = _randn((4 if decode else sum(qo_lens), NUM_KV_HEADS * 4, HEAD_DIM), torch.float32, gen)
    _eager_check(pool, meta, q, "reference", **({} if decode else {"qo_indptr": _qo_indptr(qo_lens)}))


@pytest.mark.parametrize("decode", [True, False])
def test_rows_without_keys_stay_out_of_real_rows(decode: bool) -> None:
    # Row 1 has no KV (a padded row); under prefill its queries see nothing. Real rows must not see NaN.
    gen = torch.Generator(device=DEVICE).manual_seed(7)
    pool = _pool(16, 16, torch.float16)
    _bind_and_write(pool, 3, 48, 48, gen)
    meta = pool.build_flashinfer_metadata([20, 0, 35])
    qo_lens = [3, 2, 4]
    rows = 3 if decode else sum(qo_lens)
    q = _randn((rows, NUM_KV_HEADS, HEAD_DIM), torch.float16, gen)  # group 1: the CUDA-core decode
    extra: dict[str, Any] = {} if decode else {"qo_indptr": _qo_indptr(qo_lens)}
    backend = FlashInferBackend(DEVICE)
    _plan(backend, pool, meta, q, **extra)
    out, lse = _run(backend, pool, q)
    empty = [1] if decode else [3, 4]
    assert out[empty].eq(0).all() and torch.isneginf(lse[empty]).all()
    _assert_matches((out, lse), _reference(pool, q, meta, **extra), TOL[torch.float16])


# ------------------------------------------------------------------------------------------------ CUDA graphs
def test_verify_graph_replay_is_bit_exact_across_page_growth() -> None:
    """One capture serves every round: the verify CSR keeps its address while rows grow over page boundaries, and
    each replay (after prepare + plan) equals an eager run of the same plan bit for bit."""
    page_size, window, batch, group, dtype = 4, 3, 2, 4, torch.bfloat16
    gen = torch.Generator(device=DEVICE).manual_seed(8)
    rng = np.random.default_rng(8)
    pool = _pool(page_size, 2 * 64 // page_size + 4, dtype)
    _bind_and_write(pool, batch, 14, 64, gen)
    starts = np.array([9, 14])  # ragged rows
    pool.verify_graph_buffers = True
    k_layer, v_layer = _layers(pool)
    q_static = torch.zeros(batch * window, NUM_KV_HEADS * group, HEAD_DIM, dtype=dtype, device=DEVICE)
    backend = captured = fixed = None
    page_counts = set()
    for round_ in range(8):
        cache_lens = starts + window
        pool.prepare_verify_graph_step(cache_lens.tolist(), starts.tolist(), window)
        moved = pool.consume_verify_graph_meta_realloc()
        assert moved == (round_ == 0), "the verify CSR moved after the first round"
        shape = (batch, window, NUM_KV_HEADS, HEAD_DIM)
        pool.put(0, starts.tolist(), _randn(shape, dtype, gen), _randn(shape, dtype, gen))  # the fixed write index
        meta = pool.verify_graph_metadata()
        qo = pool.verify_qo_indptr(batch, window)
        page_counts.add(tuple(np.diff(meta.indptr.cpu().numpy()).tolist()))
        q_static.copy_(_randn(tuple(q_static.shape), dtype, gen))
        if backend is None:
            backend = FlashInferBackend.for_verify_graph(pool, batch, window)
            fixed = (meta.indptr.data_ptr(), meta.indices.data_ptr(), meta.last_page_len.data_ptr(), qo.data_ptr())
        assert (meta.indptr.data_ptr(), meta.indices.data_ptr(), meta.last_page_len.data_ptr(), qo.data_ptr()) == fixed
        assert backend.is_bound_to(meta)
        backend.plan(meta, num_qo_heads=q_static.shape[1], num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
                     qo_indptr=qo, causal=True, q_dtype=dtype, kv_dtype=dtype)
        if captured is None:
            captured = _CapturedRun(lambda b=backend: b.run(q_static, k_layer, v_layer))
            replayed = captured.out
        else:
            replayed = captured.replay()
        eager = backend.run(q_static, k_layer, v_layer)
        # exact: a replay launches the captured kernels on the same plan and buffers, which the eager run reuses
        assert torch.equal(replayed, eager), f"round {round_}: graph replay differs from eager on the same plan"
        other = FlashInferBackend(DEVICE)
        _plan(other, pool, meta, q_static, qo_indptr=qo, causal=True)
        torch.testing.assert_close(replayed.float(), _run(other, pool, q_static, False).float(), rtol=2e-2,
                                   atol=2e-2)
        ref_out, _ = _reference(pool, q_static, meta, qo_indptr=qo, causal=True)
        torch.testing.assert_close(replayed.float(), ref_out.float(), rtol=2e-2, atol=2e-2)
        # Accept 0..W-1 drafts per row plus the bonus token; the rest of the window is rejected.
        sealed = starts + 1 + rng.integers(0, window, size=batch)
        pool.truncate_to(sealed.tolist(), cache_lens.tolist())
        starts = sealed
    assert len(page_counts) > 1, "the rounds never changed a row's page count"


@pytest.mark.parametrize("group", [1, 4])
def test_decode_graph_replay_across_page_boundaries(group: int) -> None:
    """The graph CSR is rewritten in place at every step, page boundaries included (its indices are sized for the
    pool's full page count): one capture replays every step, and the backend stays bound to it."""
    page_size, batch, prompt, dtype = 16, 2, 17, torch.float16
    gen = torch.Generator(device=DEVICE).manual_seed(9)
    pool = _pool(page_size, 2 * 64 // page_size + 4, dtype)
    _bind_and_write(pool, batch, prompt, 64, gen)
    pool.decode_graph_buffers = True
    pool.reserve_graph_rows(batch)
    k_layer, v_layer = _layers(pool)
    q_static = torch.zeros(batch, NUM_KV_HEADS * group, HEAD_DIM, dtype=dtype, device=DEVICE)
    backend: FlashInferBackend | None = None
    captured: _CapturedRun | None = None
    for pos in range(prompt, 3 * page_size):  # cache_len 18 .. 48: into a third page
        pool.prepare_decode_graph_step(pos + 1, [pos] * batch)
        shape = (batch, 1, NUM_KV_HEADS, HEAD_DIM)
        pool.put(0, pos, _randn(shape, dtype, gen), _randn(shape, dtype, gen))
        meta = pool.decode_graph_metadata(batch)
        assert meta.kv_lens().tolist() == [pos + 1] * batch
        q_static.copy_(_randn(tuple(q_static.shape), dtype, gen))
        if backend is None:
            backend = FlashInferBackend.for_decode_graph(pool, batch)
        assert backend.is_bound_to(meta), f"position {pos}: the graph CSR moved"
        backend.plan(meta, num_qo_heads=q_static.shape[1], num_kv_heads=NUM_KV_HEADS, head_dim=HEAD_DIM,
                     q_dtype=dtype, kv_dtype=dtype)
        if captured is None:
            captured = _CapturedRun(lambda b=backend: b.run(q_static, k_layer, v_layer))
            replayed = captured.out
        else:
            replayed = captured.replay()
        # exact, as above: the same kernels on the same plan and buffers
        assert torch.equal(replayed, backend.run(q_static, k_layer, v_layer)), f"position {pos}: replay != eager"
        ref_out, _ = _reference(pool, q_static, meta)
        torch.testing.assert_close(replayed.float(), ref_out.float(), rtol=2e-2, atol=2e-2)
    assert backend is not None and backend.is_bound_to(pool.decode_graph_metadata(batch))
