"""Binding verbs over one table: prefix matching under the Fix rules, kv_len, eviction, FIFO reuse, counters."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCacheExhaustedError, KvCachePool, NoActiveStepError

from .snapshot import expect_unchanged

PS = 4


def make_pool(num_slots: int = 64, page_size: int = PS, **kw) -> KvCachePool:
    return KvCachePool(2, num_slots, 1, 2, page_size, fresh_page_fill="poison", **kw)


def write(pool: KvCachePool, start: int, n: int, value: float, batch: int = 1) -> None:
    """Write ``n`` tokens from ``start`` on every layer; K = value + position, V = -K."""
    pos = torch.arange(start, start + n, dtype=torch.float32)
    k = (value + pos).view(1, n, 1, 1).expand(batch, n, 1, 2).contiguous()
    for layer in range(pool.num_layers):
        pool.put(layer, start, k, -k)


def serve(pool: KvCachePool, prompt: list[int], generated: list[int], value: float) -> int:
    """One generate()-style request: bind, write prompt + generated KV except the last sampled token, finish."""
    matched = pool.bind_with_prefix(prompt, len(prompt) + len(generated))
    write(pool, matched, len(prompt) + len(generated) - 1 - matched, value)
    pool.finish_exclusive(prompt + generated)
    pool.check_invariants()
    return matched


def test_match_is_capped_below_the_last_prompt_token() -> None:
    pool = make_pool()
    tokens = list(range(1, 13))  # 12 tokens, 3 pages
    assert pool.bind_with_prefix(tokens, 16) == 0
    write(pool, 0, 12, 0.0)
    pool.finish_exclusive(tokens)
    assert pool.radix.total_size() == 12
    # Same 12-token prompt: a full match would leave no token to compute logits from; capped at floor_page(11) = 8.
    assert pool.bind_with_prefix(tokens, 16) == 8
    assert pool.matched_prefix_len(pool._step.ids[0]) == 8
    # A 13-token prompt extending it may match all 12 cached tokens.
    assert pool.bind_with_prefix(tokens + [99], 16) == 12
    pool.check_invariants()


def test_kv_len_tracks_contiguous_writes_only() -> None:
    pool = make_pool()
    rid = pool.bind_request(list(range(1, 6)), 16)
    assert pool.kv_len(rid) == 0
    write(pool, 0, 3, 0.0)
    assert pool.kv_len(rid) == 3
    write(pool, 5, 2, 0.0)  # a gap at [3, 5): kv_len does not move
    assert pool.kv_len(rid) == 3
    write(pool, 3, 2, 0.0)  # fills the gap; kv_len becomes max(3, 3 + 2) = 5, not 7
    assert pool.kv_len(rid) == 5
    write(pool, 1, 1, 0.0)  # a rewrite inside the written prefix never lowers it
    assert pool.kv_len(rid) == 5
    pool.check_invariants()


def test_uncomputed_sampled_token_never_becomes_cached_prefix() -> None:
    # SGLang issue 24590: request A = 4 prompt + 2 generated tokens; the last sampled token's KV was never
    # computed, so B = A's tokens + 1 must see at most seqlen_A - 1 cached tokens.
    pool = make_pool(page_size=1)
    a_prompt, a_generated = [11, 12, 13, 14], [15, 16]
    serve(pool, a_prompt, a_generated, 1.0)
    assert pool.radix.total_size() == 5  # 6 tokens, only 5 have KV
    b = a_prompt + a_generated + [17]
    matched = pool.bind_with_prefix(b, 16)
    assert matched == 5 <= len(a_prompt + a_generated) - 1
    k, _ = pool.get(0, 5)
    assert k[0, :, 0, 0].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0]


def test_finish_inserts_only_the_page_aligned_written_prefix_and_frees_the_rest() -> None:
    pool = make_pool(64)
    rid = pool.bind_request(list(range(1, 8)), 32)  # 8 pages
    write(pool, 0, 10, 0.0)
    pool.finish_request(rid, list(range(1, 20)))
    # floor_page(min(19, kv_len=10)) = 8 tokens: 2 pages kept by the tree, 6 freed.
    assert pool.radix.total_size() == 8 and pool.prefix_insert_tokens == 8
    assert pool.free_pages == 14 and not pool.is_bound(rid)
    pool.check_invariants()


def test_finish_frees_duplicate_pages_already_cached_by_another_request() -> None:
    pool = make_pool(64)
    prompt = list(range(1, 10))
    r1 = pool.bind_request(prompt, 16)
    r2 = pool.bind_request(prompt, 16)  # both miss: nothing cached yet
    pool.activate_step(r1, r2)
    write(pool, 0, 9, 0.0, batch=2)
    pool.finish_request(r1, prompt)
    assert pool.radix.total_size() == 8 and pool.free_pages == 16 - 2 - 4
    pool.finish_request(r2, prompt)
    # r2's 2 pages for the same 8 tokens are duplicates: freed, nothing new inserted.
    assert pool.radix.total_size() == 8 and pool.prefix_insert_tokens == 8
    assert pool.free_pages == 14
    pool.check_invariants()


def test_matched_prefix_is_shared_read_only_and_locked() -> None:
    pool = make_pool(64)
    serve(pool, list(range(1, 10)), [50, 51], 10.0)  # caches 8 tokens of written KV
    prompt = list(range(1, 10)) + [60]
    r1 = pool.bind_request(prompt, 16)
    r2 = pool.bind_request(prompt, 16)
    assert pool.matched_prefix_len(r1) == pool.matched_prefix_len(r2) == 8
    assert pool.radix.protected_size == 8 and pool.radix.evictable_size == 0
    pool.activate_step(r1, r2)
    slots = pool.slot_indices(8).reshape(2, 8)
    assert np.array_equal(slots[0], slots[1])  # the same tree pages
    k, _ = pool.get(1, 8)
    assert k[:, :, 0, 0].tolist() == [[10.0 + i for i in range(8)]] * 2
    expect_unchanged(pool, ValueError, pool.put, 0, 7, torch.zeros(2, 1, 1, 2), torch.zeros(2, 1, 1, 2),
                     match="below its matched prefix")
    pool.unbind_request(r1)
    assert pool.radix.protected_size == 8  # r2 still holds the lock
    pool.unbind_request(r2)
    assert pool.radix.protected_size == 0 and pool.radix.evictable_size == 8
    pool.check_invariants()


def test_bind_evicts_lru_only_as_far_as_needed_and_never_locked_nodes() -> None:
    pool = make_pool(32)  # 8 pages
    serve(pool, [1, 1, 1, 1, 1], [0], 1.0)  # caches page A (tokens 1x4)
    serve(pool, [2, 2, 2, 2, 2], [0], 2.0)  # caches page B
    serve(pool, [3, 3, 3, 3, 3], [0], 3.0)  # caches page C
    assert pool.radix.total_size() == 12 and pool.free_pages == 5
    pool.radix.match_prefix([1, 1, 1, 1])  # A becomes most recently used; B is now the LRU leaf
    locked = pool.bind_request([3, 3, 3, 3, 9], 8)  # locks C, takes 1 private page
    assert pool.matched_prefix_len(locked) == 4 and pool.free_pages == 4
    # Needs 5 pages with 4 free: exactly one page is evicted, the LRU unlocked one (B).
    rid = pool.bind_request([7], 20)
    assert pool.prefix_evict_tokens == 4
    assert pool.radix.peek_prefix([2, 2, 2, 2]) == []
    assert len(pool.radix.peek_prefix([1, 1, 1, 1])) == 1 and len(pool.radix.peek_prefix([3, 3, 3, 3])) == 1
    assert pool.free_pages == 0 and pool.is_bound(rid)
    # Nothing more fits: A is evictable (1 page) but 2 are needed; C is locked. The failed bind changes nothing.
    expect_unchanged(pool, KvCacheExhaustedError, pool.bind_request, [8], 8, match="needs 2 pages")
    pool.check_invariants()


def test_bind_request_never_clamps_but_bind_with_prefix_does() -> None:
    pool = make_pool(32)
    expect_unchanged(pool, KvCacheExhaustedError, pool.bind_request, [1, 2], 64, match="keep the request queued")
    assert pool.bind_with_prefix([1, 2], 64) == 0
    assert pool.request_capacity == 32


def test_bind_request_releases_exclusive_bindings_first() -> None:
    pool = make_pool(32)
    pool.bind_with_prefix([1, 2, 3], 32)  # takes the whole pool
    assert pool.free_pages == 0
    rid = pool.bind_request([4, 5], 16)
    assert pool.bound_request_count == 1 and pool.is_bound(rid) and pool.free_pages == 4
    assert pool._step.ids == (rid,)  # the only binding becomes the active step
    pool.check_invariants()


def test_exclusive_verbs_release_every_other_binding() -> None:
    pool = make_pool(64)
    a = pool.bind_request([1], 8)
    b = pool.bind_request([2], 8)
    ids = pool.bind_requests(3, 8)
    assert not pool.is_bound(a) and not pool.is_bound(b) and pool.bound_request_count == 3
    assert pool._step.ids == tuple(ids) and pool.request_capacity == 8
    pool.bind_with_prefix([5, 6], 12)
    assert pool.bound_request_count == 1 and pool.request_capacity == 12
    pool.check_invariants()


def test_bind_requests_clamps_each_row_to_an_equal_share() -> None:
    pool = make_pool(40)  # 10 pages
    ids = pool.bind_requests(3, 100)
    assert len(ids) == 3 and pool.request_capacity == 12 and pool.free_pages == 1
    pool.check_invariants()


def test_ids_are_positive_monotone_and_never_reused() -> None:
    pool = make_pool(64)
    seen = []
    for _ in range(5):
        rid = pool.bind_request([1], 4)
        seen.append(rid)
        pool.unbind_request(rid)
    assert seen == sorted(set(seen)) and seen[0] >= 1


def test_fresh_pool_hands_out_pages_in_order_and_reuses_fifo() -> None:
    pool = make_pool(32)
    a = pool.alloc(8)
    b = pool.alloc(4)
    assert a.tolist() == list(range(8)) and b.tolist() == list(range(8, 12))
    pool.free(a)
    c = pool.alloc(4 * 6)
    assert (c[::4] // 4).tolist() == [3, 4, 5, 6, 7, 0]  # untouched pages first, then the freed ones


def test_alloc_evicts_from_the_tree_when_short() -> None:
    pool = make_pool(16)
    serve(pool, [1, 2, 3, 4, 5], [6], 1.0)
    assert pool.free_pages == 3
    slots = pool.alloc(16)
    assert len(slots) == 16 and pool.prefix_evict_tokens == 4 and pool.radix.total_size() == 0
    expect_unchanged(pool, KvCacheExhaustedError, pool.alloc, 1, match="need 1 pages")
    pool.free(slots)
    pool.check_invariants()


def test_counters_accumulate_per_bind_with_reuse_on() -> None:
    pool = make_pool(64)
    serve(pool, list(range(1, 10)), [10], 1.0)
    serve(pool, list(range(1, 10)) + [20, 21], [22], 2.0)
    assert pool.prefix_prompt_tokens == 9 + 11
    assert pool.prefix_match_tokens == 0 + 8
    stats = pool.stats()
    assert stats["prefix_hit_rate"] == pytest.approx(8 / 20)
    assert stats["tree_pages"] * PS == pool.radix.total_size() == 8


def test_step_verbs_without_an_active_step_raise() -> None:
    pool = make_pool()
    with pytest.raises(NoActiveStepError, match="No request bound"):
        pool.get(0, 1)
    with pytest.raises(KvCacheExhaustedError):
        pool.ensure_request(1, 1)
    rid = pool.bind_request([1, 2], 8)
    pool.ensure_request(1, 8)
    with pytest.raises(KvCacheExhaustedError, match="capacity=8"):
        pool.ensure_request(1, 9)
    pool.unbind_request(rid)
    with pytest.raises(NoActiveStepError):
        pool.put(0, 0, torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 2))


def test_get_padded_repeats_the_last_slot_past_a_row_capacity() -> None:
    pool = make_pool(64)
    r1 = pool.bind_request([1], 4)
    r2 = pool.bind_request([2], 8)
    pool.activate_step(r1, r2)
    pool.put(0, [0, 0], torch.arange(4.0).view(1, 4, 1, 1).expand(2, 4, 1, 2).contiguous(), torch.zeros(2, 4, 1, 2))
    with pytest.raises(ValueError, match="exceeds bound request capacity 4"):
        pool.get(0, 8)
    k, _ = pool.get_padded(0, 8)
    assert k[0, :, 0, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 3.0, 3.0, 3.0, 3.0]
    idx = torch.from_numpy(pool.window_slot_indices(0, 4))
    k2, _ = pool.get_padded(0, 4, idx)
    assert torch.equal(k2, k[:, :4])


def test_put_with_per_row_starts_and_precomputed_slot_idx() -> None:
    pool = make_pool(64)
    r1 = pool.bind_request([1], 16)
    r2 = pool.bind_request([2], 16)
    pool.activate_step(r1, r2)
    pool.put(0, [0, 0], torch.zeros(2, 5, 1, 2), torch.zeros(2, 5, 1, 2))
    idx = torch.from_numpy(pool.window_slot_indices([5, 3], 2))
    k = torch.tensor([[1.0, 2.0], [3.0, 4.0]]).view(2, 2, 1, 1).expand(2, 2, 1, 2).contiguous()
    pool.put(0, [5, 3], k, k, slot_idx=idx)
    got, _ = pool.get(0, 7)
    assert got[0, 5:7, 0, 0].tolist() == [1.0, 2.0] and got[1, 3:5, 0, 0].tolist() == [3.0, 4.0]
    assert pool.kv_len(r1) == 7 and pool.kv_len(r2) == 5
    slots = pool.slot_indices(7).reshape(2, 7)
    assert idx.tolist() == [int(slots[0, 5]), int(slots[0, 6]), int(slots[1, 3]), int(slots[1, 4])]


def test_key_and_value_layer_are_views_of_the_buffers() -> None:
    pool = make_pool(16)
    pool.bind_request([1], 4)
    pool.put(1, 0, torch.full((1, 1, 1, 2), 5.0), torch.full((1, 1, 1, 2), 6.0))
    slot = int(pool.slot_indices(1)[0])
    assert pool.key_layer(1).shape == (16, 1, 2) and pool.key_layer(1)[slot, 0, 0].item() == 5.0
    assert pool.value_layer(1)[slot, 0, 1].item() == 6.0
    assert pool.key_layer(1).data_ptr() == pool.key_cache[1].data_ptr()


def test_put_casts_to_the_pool_dtype() -> None:
    pool = KvCachePool(1, 16, 1, 2, 4, dtype=torch.bfloat16)
    pool.bind_request([1], 4)
    pool.put(0, 0, torch.full((1, 1, 1, 2), 1.5, dtype=torch.float64), torch.full((1, 1, 1, 2), 2.5))
    k, v = pool.get(0, 1)
    assert k.dtype == v.dtype == torch.bfloat16 == pool.compute_dtype and pool.kv_is_compute_dtype
    assert k.flatten().tolist() == [1.5, 1.5] and v.flatten().tolist() == [2.5, 2.5]


def test_ragged_rows_capacity_is_the_smallest_and_ensure_checks_every_row() -> None:
    pool = make_pool(128)
    small, large = pool.bind_request([1], 8), pool.bind_request([2], 24)
    pool.activate_step(large, small)
    assert pool.request_capacity == 8
    pool.ensure_request(2, 8)
    with pytest.raises(KvCacheExhaustedError, match="capacity=8"):
        pool.ensure_request(2, 9)
    with pytest.raises(KvCacheExhaustedError, match="2 rows, not 1"):
        pool.ensure_request(1, 4)


def test_batched_rewrite_inside_the_written_prefix_never_lowers_kv_len() -> None:
    pool = make_pool(128)
    ids = [pool.bind_request([1], 16), pool.bind_request([2], 16)]
    pool.activate_step(*ids)
    write(pool, 0, 10, 0.0, batch=2)
    pool.put(0, [2, 5], torch.zeros(2, 3, 1, 2), torch.zeros(2, 3, 1, 2))  # per-row starts inside the prefix
    assert [pool.kv_len(i) for i in ids] == [10, 10]
    pool.put(0, [10, 12], torch.zeros(2, 2, 1, 2), torch.zeros(2, 2, 1, 2))  # row 1 leaves a gap
    assert [pool.kv_len(i) for i in ids] == [12, 10]


def test_a_permuted_cohort_is_a_new_step_with_rows_in_the_new_order() -> None:
    pool = make_pool(128)
    a, b = pool.bind_request([1], 8), pool.bind_request([2], 8)
    pool.activate_step(a, b)
    pool.put(0, 0, torch.tensor([1.0, 2.0]).view(2, 1, 1, 1).expand(2, 1, 1, 2).contiguous(), torch.zeros(2, 1, 1, 2))
    meta = pool.shared_flashinfer_metadata(1)
    pool.activate_step(b, a)
    k, _ = pool.get(0, 1)
    assert k[:, 0, 0, 0].tolist() == [2.0, 1.0]
    assert pool.current_step_metadata() is None and pool.shared_flashinfer_metadata(1) is not meta


def test_put_never_changes_the_callers_tensors() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        pool = KvCachePool(1, 8, 1, 2, 4, dtype=dtype)
        pool.bind_request([1], 4)
        k = torch.tensor([1000.0, -5000.0]).view(1, 1, 1, 2)
        v = k.clone().requires_grad_(True)
        pool.put(0, 0, k, v)  # a tensor that requires grad is fine too
        assert k.flatten().tolist() == [1000.0, -5000.0] and v.detach().flatten().tolist() == [1000.0, -5000.0]


def test_a_pool_made_under_inference_mode_is_writable_outside_it() -> None:
    with torch.inference_mode():
        pool = make_pool(16)
    pool.bind_request([1], 4)
    write(pool, 0, 2, 3.0)
    assert pool.get(0, 2)[0][0, :, 0, 0].tolist() == [3.0, 4.0]


def test_peek_prefix_slots_reads_the_tree_without_changing_it():
    pool = make_pool()
    prompt = list(range(10, 10 + 3 * PS + 1))
    rid = pool.bind_request(prompt, len(prompt))
    write(pool, 0, len(prompt), 1.0)
    pages = pool.slot_indices(len(prompt))
    pool.finish_request(rid, prompt)
    assert pool.peek_prefix_slots([]).tolist() == []
    before = (pool.stats(), pool.radix.total_size(), pool.radix.evictable_size)
    got = pool.peek_prefix_slots(prompt + [1, 2])
    assert (pool.stats(), pool.radix.total_size(), pool.radix.evictable_size) == before
    assert got.dtype == np.int64 and got.tolist() == pages[: 3 * PS].tolist()  # the written whole pages
    assert pool.peek_prefix_slots(prompt[: PS + 1]).tolist() == pages[:PS].tolist()
    assert pool.peek_prefix_slots([99] + prompt).tolist() == []
    with pytest.raises(ValueError):
        pool.peek_prefix_slots([1.5])
    pool.check_invariants()


def test_grow_request_appends_private_pages_or_changes_nothing():
    pool = make_pool(num_slots=8 * PS)
    a = pool.bind_request([1, 2, 3], 2 * PS)
    b = pool.bind_request([4, 5, 6], 2 * PS)
    pool.activate_step(a)
    write(pool, 0, 3, 1.0)
    assert pool.grow_request(a, 2 * PS - 1) == 2 * PS  # already that large: nothing changes
    assert pool.grow_request(a, 3 * PS + 1) == 4 * PS  # page-aligned up
    assert pool.free_pages == 8 - 6
    pool.check_invariants()
    before = (pool.free_pages, pool.stats())
    with pytest.raises(KvCacheExhaustedError):
        pool.grow_request(b, 5 * PS)  # needs 3 more pages, 2 are free
    assert (pool.free_pages, pool.stats()) == before
    pool.activate_step(a)
    k = torch.full((1, 10, 1, 2), 7.0)
    pool.put(0, 3, k, -k)  # writes reach the grown pages
    assert pool.kv_len(a) == 13
    handle = pool.offload_request(b)
    with pytest.raises(RuntimeError, match="offloaded"):
        pool.grow_request(b, 3 * PS)
    pool.restore_request(b, handle)
    pool.finish_request(a, [1, 2, 3] + [0] * 10)
    pool.unbind_request(b)
    pool.check_invariants()
    assert pool.bound_request_count == 0
