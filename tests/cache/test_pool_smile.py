"""Smile's KvCachePoolTest scenarios 1-19, adapted to the differences from Smile in docs/contract.md.

Where a Fix rule changes Smile's expected value, the test says which rule and why.
Tensors are ``[B, S, Hkv=2, D=16]`` as in Smile's ``tinyLayout(layers, batch, seq) = of(L, 64, 4, 2, B, S)``.
"""

from __future__ import annotations

import pytest
import torch

from smile_llm.cache import KvCacheExhaustedError, KvCacheLayout, KvCachePool


def tiny_layout(layers: int, batch: int, seq: int) -> KvCacheLayout:
    return KvCacheLayout.of(layers, 64, 4, 2, batch, seq)


def kv(batch: int, seq: int, k: float, v: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((batch, seq, 2, 16), k), torch.full((batch, seq, 2, 16), v)


def test_given_for_testing_pool_when_bound_then_put_get_round_trip() -> None:
    # Given
    with KvCachePool.for_testing(tiny_layout(2, 1, 32)) as pool:
        assert pool.num_slots == 32 and pool.page_size == 1 and pool.dtype == torch.float32
        pool.bind_requests(1, 16)
        # When
        pool.put(0, 0, *kv(1, 4, 1.0, 2.0))
        k, v = pool.get(0, 4)
        # Then
        assert k.shape == (1, 4, 2, 16)
        assert k[0, 0, 0, 0].item() == 1.0 and v[0, 0, 0, 0].item() == 2.0
        pool.check_invariants()


def test_given_pool_when_allocate_on_cpu_then_sized_to_max_batch_times_seq() -> None:
    with KvCachePool.allocate(tiny_layout(2, 2, 64), "cpu", torch.float32, 0.85) as pool:
        assert pool.num_slots == 128 and pool.num_slots % pool.page_size == 0 and pool.page_size == 16


def test_given_allocate_when_max_seq_then_not_raised_above_configured() -> None:
    with KvCachePool.allocate(tiny_layout(1, 1, 128), "cpu", torch.float32, 1.0) as pool:
        assert pool.num_slots == 128


def test_given_allocate_when_not_page_multiple_then_floored_to_page() -> None:
    with KvCachePool.allocate(tiny_layout(1, 1, 40), "cpu", torch.float32, 0.5) as pool:
        assert pool.num_slots == 32


def test_given_bound_requests_when_unbound_then_pages_return_to_free_list() -> None:
    with KvCachePool(1, 64, 2, 16, 16) as pool:
        before = pool.free_pages
        pool.bind_requests(1, 32)
        assert pool.free_pages == before - 2
        pool.unbind_requests()
        assert pool.free_pages == before == 4
        pool.check_invariants()


def test_given_insufficient_pages_when_bind_batch_then_throws() -> None:
    with KvCachePool(1, 16, 2, 16, 16) as pool:
        with pytest.raises(KvCacheExhaustedError, match="batch 2"):
            pool.bind_requests(2, 16)
        assert isinstance(KvCacheExhaustedError("x"), RuntimeError)  # Java IllegalStateException
        assert pool.free_pages == 1 and pool.bound_request_count == 0


def test_given_oversized_capacity_when_bind_then_clamps_without_throw() -> None:
    with KvCachePool(1, 16, 2, 16, 16) as pool:
        pool.bind_requests(1, 64)
        assert pool.request_capacity == 16 and pool.free_pages == 0


def test_given_bound_capacity_when_put_beyond_then_does_not_grow() -> None:
    with KvCachePool(1, 32, 2, 16, 16) as pool:
        pool.bind_requests(1, 16)
        with pytest.raises(KvCacheExhaustedError, match="capacity=16"):
            pool.put(0, 16, *kv(1, 1, 1.0, 1.0))
        assert pool.free_pages == 1 and pool.request_capacity == 16


def test_given_bind_with_prefix_when_capacity_clamped_then_prompt_still_fits() -> None:
    with KvCachePool(1, 32, 2, 16, 16) as pool:
        assert pool.bind_with_prefix(list(range(1, 9)), 256) == 0
        assert pool.request_capacity == 32


def test_given_bind_with_prefix_when_prompt_exceeds_pool_then_throws() -> None:
    with KvCachePool(1, 16, 2, 16, 16) as pool:
        with pytest.raises(ValueError, match="Prompt length 20 exceeds free KV capacity 16"):
            pool.bind_with_prefix(list(range(20)), 64)
        assert pool.free_pages == 1 and pool.bound_request_count == 0


def test_given_bind_with_prefix_when_first_request_then_miss_then_hit_on_repeat() -> None:
    # Given
    with KvCachePool.for_testing(tiny_layout(1, 1, 64)) as pool:
        prompt = [10, 20, 30, 40, 50, 60, 70, 80]
        assert pool.bind_with_prefix(prompt, 32) == 0
        pool.put(0, 0, *kv(1, 8, 1.0, 3.0))
        pool.finish_exclusive(prompt)
        # When
        matched = pool.bind_with_prefix(prompt, 32)
        # Then: Fix "match capped below the last prompt token": Smile returns 8, here floor_page(8 - 1) = 7.
        assert matched == 7
        assert pool.prefix_match_tokens == 7
        assert pool.prefix_prompt_tokens == 16
        k, v = pool.get(0, 7)
        assert v[0, 0, 0, 0].item() == 3.0 and k[0, 6, 1, 15].item() == 1.0
        pool.check_invariants()


def test_given_bind_with_prefix_when_disabled_then_always_miss() -> None:
    with KvCachePool.for_testing(tiny_layout(1, 1, 64)) as pool:
        pool.prefix_reuse_enabled = False
        prompt = [1, 2, 3, 4, 5, 6, 7, 8]
        assert pool.bind_with_prefix(prompt, 32) == 0
        pool.put(0, 0, *kv(1, 8, 1.0, 1.0))
        pool.finish_exclusive(prompt)
        assert pool.radix.total_size() == 0 and pool.prefix_insert_tokens == 0
        assert pool.bind_with_prefix(prompt, 32) == 0
        assert pool.prefix_prompt_tokens == 0  # counters move only with reuse on


def test_given_finish_request_when_prefix_retained_then_free_pages_stay_below_full() -> None:
    with KvCachePool(1, 64, 2, 16, 1) as pool:
        prompt = list(range(100, 108))
        pool.bind_with_prefix(prompt, 16)
        pool.put(0, 0, *kv(1, 8, 1.0, 1.0))
        pool.finish_exclusive(prompt)
        # 8 pages retained by the tree, 8 headroom pages freed.
        assert pool.free_pages == 56 and pool.prefix_insert_tokens == 8
        assert pool.stats()["tree_pages"] == 8
        pool.check_invariants()


def test_given_finish_request_when_kv_not_written_then_nothing_inserted() -> None:
    # Fix "insert only written KV": Smile inserts the whole page-aligned sequence whether or not it was written.
    with KvCachePool(1, 64, 2, 16, 1) as pool:
        prompt = list(range(100, 108))
        pool.bind_with_prefix(prompt, 16)
        pool.put(0, 0, *kv(1, 5, 1.0, 1.0))
        pool.finish_exclusive(prompt + [1, 2])
        assert pool.prefix_insert_tokens == 5 and pool.radix.total_size() == 5
        assert pool.free_pages == 59


def test_given_two_bound_requests_when_activate_and_unbind_one_then_other_remains() -> None:
    with KvCachePool(1, 64, 2, 16, 1) as pool:
        pool.prefix_reuse_enabled = False
        id1 = pool.bind_request([1, 2, 3, 4], 16)
        id2 = pool.bind_request([1, 2, 3, 4], 16)
        assert id1 > 0 and id2 > id1 and pool.bound_request_count == 2
        pool.activate_step(id1, id2)
        pool.put(0, 0, *kv(2, 2, 4.0, 4.0))
        pool.unbind_request(id1)
        assert pool.bound_request_count == 1 and pool.request_capacity == 0  # the active step was cleared
        pool.activate_step(id2)
        _, v = pool.get(0, 2)
        assert v.shape == (1, 2, 2, 16) and bool((v == 4.0).all())
        pool.unbind_request(id2)
        assert pool.bound_request_count == 0 and pool.free_pages == 64
        pool.check_invariants()


def test_given_bind_request_when_unbind_request_then_free_slots_increase() -> None:
    with KvCachePool(1, 64, 2, 16, 16) as pool:
        pool.prefix_reuse_enabled = False
        rid = pool.bind_request([1, 2, 3], 32)
        assert pool.free_slots == 32 and pool.bound_request_count == 1
        pool.unbind_request(rid)
        assert pool.free_slots == 64 and pool.bound_request_count == 0


def test_given_fragmented_free_list_when_bind_request_then_alloc_succeeds() -> None:
    with KvCachePool(1, 256, 2, 16, 16) as pool:
        pool.prefix_reuse_enabled = False
        ids = [pool.bind_request([1], 64) for _ in range(4)]
        assert pool.free_slots == 0
        pool.unbind_request(ids[0])
        pool.unbind_request(ids[2])
        assert pool.free_slots == 128
        # Two 4-page holes (pages 0-3 and 8-11); 6 pages cannot be contiguous.
        rid = pool.bind_request([1], 96)
        assert pool.free_slots == 32
        pool.activate_step(rid)
        pool.put(0, 0, *kv(1, 96, 7.0, 7.0))
        _, v = pool.get(0, 96)
        assert bool((v == 7.0).all())
        pages = sorted(set((pool.slot_indices(96) // 16).tolist()))
        assert pages == [0, 1, 2, 3, 8, 9]  # FIFO: the first hole, then the second
        for i in (ids[1], ids[3], rid):
            pool.unbind_request(i)
        assert pool.free_slots == 256 and pool.bound_request_count == 0
        pool.check_invariants()
