"""``KvCachePool.splice_kv``: a registered segment's KV (a binding that holds it at ``[0, N)``, its whole pages in the
prefix tree) placed in another request.

- At offset 0 a request binds the segment's whole pages through an ordinary prefix match: shared, not copied, locked
  by both bindings; a splice copies only the partial last page, unturned.
- At a page-aligned offset M the splice writes the request's own private pages (never the segment's): V copied bit
  for bit, K turned by the RoPE delta, equal to keys computed directly at ``[M, M + N)`` in float64 and within each
  storage dtype's tolerance (FP8 included, through ``KvStore.read``/``write``).
- Every refusal (a shift that is not page-aligned, an unknown or offloaded id, a gap after ``kv_len``, no room, a
  bad transform) leaves the pool exactly as it was; the invariants hold after every operation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCacheExhaustedError, KvCachePool, RequestOffloadedError
from smile_llm.cache.pages import PageOwner
from smile_llm.models.layers import rope_inv_freq
from smile_llm.models.rope_delta import KeyRotation

from .snapshot import expect_unchanged, pool_snapshot

PS, LAYERS, HKV, D = 4, 2, 2, 8
N = 10  # segment tokens: 2 whole pages and a partial one
SEGMENT = list(range(100, 100 + N))
INV_FREQ = rope_inv_freq(D, 10000.0, None)
ROTATION = KeyRotation(INV_FREQ, D)


def rope64(k_pre: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """float64 RoPE (HF's rotate_half form) of keys ``[..., S, Hkv, D]`` at ``positions``."""
    angle = positions.double()[:, None] * INV_FREQ.double()[None, :]
    cos = torch.cat((angle.cos(), angle.cos()), -1)[:, None, :]
    sin = torch.cat((angle.sin(), angle.sin()), -1)[:, None, :]
    half = torch.cat((-k_pre[..., D // 2 :], k_pre[..., : D // 2]), -1)
    return k_pre * cos + half * sin


def new_pool(dtype: torch.dtype = torch.float32, pages: int = 16) -> KvCachePool:
    return KvCachePool(LAYERS, pages * PS, HKV, D, PS, dtype=dtype)


def write(pool: KvCachePool, rid: int, start: int, k: torch.Tensor, v: torch.Tensor, rope: bool = False) -> None:
    """Positions ``[start, start + S)`` of every layer from ``[S, Hkv, D]`` tensors: layer l gets V ``v - l`` and K
    ``k + l``, or with ``rope`` the keys of the pre-RoPE vectors ``k + l`` at those positions."""
    pool.activate_step(rid)
    dtype = torch.float64 if pool.dtype == torch.float64 else torch.float32
    positions = torch.arange(start, start + len(k))
    for layer in range(LAYERS):
        keys = rope64(k + layer, positions) if rope else k + layer
        pool.put(layer, start, keys[None].to(dtype), (v - layer)[None].to(dtype))


def read(pool: KvCachePool, rid: int, layer: int, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
    pool.activate_step(rid)
    k, v = pool.get(layer, end)
    return k[0, start:end], v[0, start:end]


def pre_rope(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(N, HKV, D, generator=gen, dtype=torch.float64),
            torch.randn(N, HKV, D, generator=gen, dtype=torch.float64))


def register(pool: KvCachePool, k_pre: torch.Tensor, v: torch.Tensor) -> int:
    """A segment's binding as ``SegmentRegistry.register`` leaves it: KV at ``[0, N)`` (K after RoPE at 0..N),
    whole pages cached in the tree and locked, the partial page private."""
    sid = pool.bind_request(SEGMENT, N)
    write(pool, sid, 0, k_pre, v, rope=True)
    pool.cache_prefix(sid, SEGMENT)
    pool.check_invariants()
    return sid


def pages_of(pool: KvCachePool, rid: int) -> list[int]:
    b = pool._table.get(rid)
    assert b is not None
    return b.page_ids.tolist()


def test_splice_at_zero_shares_the_whole_pages_and_copies_only_the_partial_one() -> None:
    pool = new_pool()
    k_pre, v = pre_rope()
    sid = register(pool, k_pre, v)
    assert pool.matched_prefix_len(sid) == 8 and pool.kv_len(sid) == N
    node_pages = pages_of(pool, sid)[:2]
    prompt = SEGMENT + [1, 2, 3, 4, 5]
    rid = pool.bind_request(prompt, 20)
    pool.check_invariants()
    assert pool.matched_prefix_len(rid) == 8  # the whole pages: matched, shared, not copied
    assert pages_of(pool, rid)[:2] == node_pages
    assert all(int(pool._pages.owner[p]) == PageOwner.TREE for p in node_pages)
    match = pool.radix.match_prefix(np.array(SEGMENT[:8]))
    assert match.last_node.lock_ref == 2  # locked by the segment and by the request
    free = pool.free_pages
    assert pool.splice_kv(rid, 8, sid, 8, N - 8) == 2  # the partial page only, unturned
    pool.check_invariants()
    assert pool.free_pages == free and pool.kv_len(rid) == N
    assert pages_of(pool, rid)[2] not in pages_of(pool, sid)  # the copy is the request's own page
    for layer in range(LAYERS):
        k_r, v_r = read(pool, rid, layer, 0, N)
        k_s, v_s = read(pool, sid, layer, 0, N)
        assert torch.equal(k_r, k_s) and torch.equal(v_r, v_s)
    pool.finish_request(rid, prompt)  # nothing past the request's written KV is cached
    pool.check_invariants()
    assert match.last_node.lock_ref == 1
    pool.unbind_request(sid)
    pool.check_invariants()
    assert pool.bound_request_count == 0 and pool.radix.evictable_size == pool.radix.total_size() == 8


# the storage dtype's tolerance, relative to the keys' largest entry: two roundings to it (the segment's keys when
# stored at 0, the turned keys when stored at the offset); measured at most half of it for every dtype
TOLERANCE = {dtype: 2 * torch.finfo(dtype).eps for dtype in (torch.float64, torch.float32, torch.float16,
                                                             torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2)}


@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("offset", [4, 16, 2048])
def test_splice_at_a_shifted_offset_writes_fresh_pages_with_keys_turned_to_those_computed_there(
        dtype: torch.dtype, offset: int) -> None:
    pool = new_pool(dtype, pages=offset // PS + 16)
    k_pre, v = pre_rope(offset)
    sid = register(pool, k_pre, v)
    prompt = [7] * offset + SEGMENT + [8, 9]
    rid = pool.bind_request(prompt, len(prompt))
    assert pool.matched_prefix_len(rid) == 0
    text = torch.full((offset, HKV, D), 0.5, dtype=torch.float64)
    write(pool, rid, 0, text, text)
    before = pool_snapshot(pool, with_kv=False)
    assert pool.splice_kv(rid, offset, sid, 0, N, ROTATION) == N
    pool.check_invariants()
    after = pool_snapshot(pool, with_kv=False)
    for key in ("free_list", "owner", "holder", "radix", "counters", "next_id"):
        assert before[key] == after[key], key  # no page changed owner: the request's own pages were written
    assert pool.kv_len(rid) == offset + N
    spliced = {p for p in pages_of(pool, rid)[offset // PS : (offset + N - 1) // PS + 1]}
    assert not spliced & set(pages_of(pool, sid))
    assert all(int(pool._pages.holder[p]) == rid for p in spliced)
    for layer in range(LAYERS):
        direct = rope64(k_pre + layer, torch.arange(offset, offset + N))  # keys computed at [offset, offset + N)
        k_r, v_r = read(pool, rid, layer, offset, offset + N)
        _, v_s = read(pool, sid, layer, 0, N)
        assert torch.equal(v_r, v_s)  # values copied exactly
        err = float((k_r.double() - direct).abs().max() / direct.abs().max())
        assert err < TOLERANCE[dtype], (dtype, layer, err)
    pool.finish_request(rid, prompt[:offset])  # what a request with a shifted segment caches
    pool.unbind_request(sid)
    pool.check_invariants()
    assert pool.bound_request_count == 0


def test_a_partly_matched_segment_splices_from_the_end_of_the_match() -> None:
    """The tree already holds the prompt's first pages through the segment (exact KV): the splice starts there, with
    the source's position shifted alike."""
    pool = new_pool()
    k_pre, v = pre_rope(1)
    sid = register(pool, k_pre, v)
    prefix = [5, 6, 7, 8]
    first = pool.bind_request(prefix + SEGMENT[:5] + [1], 12)
    write(pool, first, 0, torch.zeros(4, HKV, D), torch.zeros(4, HKV, D))
    write(pool, first, 4, k_pre[:4], v[:4], rope=True)
    pool.finish_request(first, prefix + SEGMENT[:4])
    rid = pool.bind_request(prefix + SEGMENT + [1, 2], 16)
    assert pool.matched_prefix_len(rid) == 8 and pool.kv_len(rid) == 8
    pool.splice_kv(rid, 8, sid, 4, N - 4, ROTATION)
    pool.check_invariants()
    direct = rope64(k_pre, torch.arange(4, 4 + N))
    k_r, _ = read(pool, rid, 0, 4, 4 + N)
    torch.testing.assert_close(k_r.double(), direct, rtol=0, atol=1e-5)


def test_refusals_change_nothing() -> None:
    pool = new_pool(pages=12)
    k_pre, v = pre_rope(2)
    sid = register(pool, k_pre, v)
    rid = pool.bind_request([1] * 7 + [2], 16)
    write(pool, rid, 0, torch.zeros(4, HKV, D), torch.zeros(4, HKV, D))  # kv_len 4
    assert pool.kv_len(rid) == 4
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 4, sid, 1, 8, ROTATION, match="not a multiple of page")
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 8, sid, 0, 4, ROTATION, match="appends there")
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 0, sid, 0, 4, ROTATION, match="appends there")
    expect_unchanged(pool, KvCacheExhaustedError, pool.splice_kv, rid, 4, sid, 0, N + 3, ROTATION,
                     match="grow_request")
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 4, sid, 0, N + 1, match="capacity|written positions")
    short = pool.bind_request([3, 3, 3, 3, 4], 8)
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 4, short, 0, 2, match="written positions")
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 4, 999, 0, 4, match="source_id 999 is not a bound")
    expect_unchanged(pool, ValueError, pool.splice_kv, 999, 4, sid, 0, 4, match="request_id 999 is not a bound")
    expect_unchanged(pool, ValueError, pool.splice_kv, True, 4, sid, 0, 4, match="not a bound")
    expect_unchanged(pool, ValueError, pool.splice_kv, sid, N, sid, 0, 4, match="spliced into itself")
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 4, sid, 0, -1, match="length must be >= 0")
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 4, sid, 0, 4, "rotate", match="rotate_k must be")
    expect_unchanged(pool, ValueError, pool.splice_kv, rid, 4, sid, 0, 4, lambda layer, k, d: k[:1],
                     match="must keep the shape")
    handle = pool.offload_request(short)
    expect_unchanged(pool, RequestOffloadedError, pool.splice_kv, rid, 4, short, 0, 1)
    pool.restore_request(short, handle)
    pool.unbind_request(short)

    def fails_on_layer_1(layer: int, k: torch.Tensor, delta: int) -> torch.Tensor:
        if layer == 1:
            raise RuntimeError("transform failed")
        return ROTATION(layer, k, delta)

    digest = pool.state_digest()
    with pytest.raises(RuntimeError, match="transform failed"):
        pool.splice_kv(rid, 4, sid, 0, 8, fails_on_layer_1)
    assert pool.state_digest() == digest and pool.kv_len(rid) == 4  # layer 0 was written past kv_len only
    pool.check_invariants()
    assert pool.splice_kv(rid, 4, sid, 0, 0) == 0 and pool.state_digest() == digest  # an empty splice
    assert pool.splice_kv(rid, 4, sid, 0, 8, ROTATION) == 8
    pool.check_invariants()
    assert pool.kv_len(rid) == 12


def test_splices_are_journaled_and_refused_after_close() -> None:
    pool = new_pool()
    k_pre, v = pre_rope(3)
    sid = register(pool, k_pre, v)
    rid = pool.bind_request([1, 2, 3, 4] + SEGMENT + [5], 16)
    write(pool, rid, 0, torch.zeros(4, HKV, D), torch.zeros(4, HKV, D))
    calls: list[str] = []
    pool.record_calls(lambda name, args, kwargs: calls.append(name))
    pool.splice_kv(rid, 4, sid, 0, N, ROTATION)
    assert calls == ["splice_kv"]
    pool.close()
    from smile_llm.cache import PoolClosedError

    with pytest.raises(PoolClosedError):
        pool.splice_kv(rid, 14, sid, 0, 1)
