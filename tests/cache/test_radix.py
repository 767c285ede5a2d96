"""RadixCache: Smile's RadixCacheTest, SGLang's radix unit scenarios, peek/plan helpers, bad input, and a randomized
comparison against a brute-force model of every cached page-aligned prefix."""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from smile_llm.cache import RadixCache, TreeNode
from tests.cache.snapshot import radix_snapshot


# ---------------------------------------------------------------------------------------------------------- helpers
def node_count(cache: RadixCache) -> int:
    return len(list(cache.nodes()))


def path_tokens(cache: RadixCache, node: TreeNode) -> list[int]:
    """Tokens from the root down to the end of ``node``."""
    parts = []
    while node is not cache.root:
        parts.append(node.key.tolist())
        node = node.parent
    return [t for part in reversed(parts) for t in part]


def access_times(cache: RadixCache) -> dict[int, int]:
    times = {n.id: n.last_access_time for n in cache.nodes()}
    times[cache.root.id] = cache.root.last_access_time
    return times


def sizes(cache: RadixCache) -> tuple[int, int, int]:
    return cache.evictable_size, cache.protected_size, cache.total_size()


# ================================================================================= Smile RadixCacheTest
def test_given_empty_cache_when_insert_single_sequence_then_match_returns_full_sequence() -> None:
    # Given
    cache = RadixCache()

    # When
    ins = cache.insert([1, 2, 3], [10, 20, 30])
    m = cache.match_prefix([1, 2, 3])

    # Then
    assert ins.prefix_len == 0
    assert m.indices.tolist() == [10, 20, 30]
    assert m.indices.dtype == np.int64
    assert m.length == 3
    assert m.last_node is ins.last_node


def test_given_cached_prefix_when_insert_longer_sequence_then_match_returns_cached_prefix() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])

    # When
    ins = cache.insert([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    m = cache.match_prefix([1, 2, 3, 4, 5])

    # Then
    assert ins.prefix_len == 3
    assert m.indices.tolist() == [10, 20, 30, 40, 50]
    assert m.length == 5
    assert cache.total_size() == 5


def test_given_empty_cache_when_insert_diverging_sequences_then_both_are_matched() -> None:
    # Given
    cache = RadixCache()

    # When
    cache.insert([1, 2, 3], [10, 20, 30])
    ins = cache.insert([1, 2, 4, 5], [10, 20, 40, 50])

    # Then: the shared [1, 2] is stored once
    assert ins.prefix_len == 2
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == [10, 20, 30]
    assert cache.match_prefix([1, 2, 4, 5]).indices.tolist() == [10, 20, 40, 50]
    assert cache.total_size() == 5
    assert node_count(cache) == 3


def test_given_cached_sequence_when_match_unknown_sequence_then_returns_empty() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])

    # When
    m = cache.match_prefix([9, 8, 7])

    # Then
    assert m.length == 0
    assert m.indices.tolist() == []
    assert m.last_node is cache.root


def test_given_cached_sequence_when_match_partial_prefix_then_returns_matched_portion() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])

    # When
    m = cache.match_prefix([1, 2, 3, 9, 9])

    # Then
    assert m.length == 3
    assert m.indices.tolist() == [10, 20, 30]
    assert m.last_node.key.tolist() == [1, 2, 3]


def test_given_cached_sequence_when_insert_same_sequence_twice_then_prefix_len_is_full_length() -> None:
    # Given
    cache = RadixCache()
    first = cache.insert([1, 2, 3], [10, 20, 30])

    # When
    again = cache.insert([1, 2, 3], [11, 21, 31])

    # Then
    assert again.prefix_len == 3
    assert again.last_node is first.last_node
    assert node_count(cache) == 1
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == [10, 20, 30]  # duplicates were not stored


def test_given_empty_cache_when_multiple_inserts_then_total_size_is_correct() -> None:
    # Given
    cache = RadixCache()

    # When
    cache.insert([1, 2, 3], [1, 2, 3])
    cache.insert([1, 2, 4, 5], [1, 2, 4, 5])
    cache.insert([1, 2, 4, 5, 6, 7], [1, 2, 4, 5, 6, 7])
    cache.insert([8, 9, 10], [8, 9, 10])

    # Then
    assert cache.total_size() == 10
    assert len(cache) == 10
    assert cache.evictable_size == 10
    assert cache.protected_size == 0


def test_given_populated_cache_when_reset_then_total_size_is_zero() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    cache.insert([4, 5, 6], [40, 50, 60])
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3]).last_node)

    # When
    cache.reset()

    # Then
    assert sizes(cache) == (0, 0, 0)
    assert len(cache) == 0
    assert node_count(cache) == 0
    assert cache.root.children == {}
    assert cache.root.lock_ref == 1
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert cache.evict(100).tolist() == []
    # and the cache is usable again
    assert cache.insert([1, 2], [7, 8]).prefix_len == 0
    assert cache.match_prefix([1, 2]).indices.tolist() == [7, 8]


def test_given_two_leaves_when_evict_then_kv_indices_are_returned_and_size_decreases() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    cache.insert([4, 5, 6], [40, 50, 60])
    assert cache.evictable_size == 6

    # When
    freed = cache.evict(3)

    # Then: the least recently used leaf (the first inserted) goes
    assert freed.tolist() == [10, 20, 30]
    assert freed.dtype == np.int64
    assert cache.evictable_size == 3
    assert cache.total_size() == 3
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert cache.match_prefix([4, 5, 6]).indices.tolist() == [40, 50, 60]


def test_given_locked_node_when_evict_then_locked_node_is_not_evicted() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    cache.insert([4, 5, 6], [40, 50, 60])
    node = cache.match_prefix([1, 2, 3]).last_node
    cache.inc_lock_ref(node)

    # When
    freed = cache.evict(6)

    # Then
    assert freed.tolist() == [40, 50, 60]
    m = cache.match_prefix([1, 2, 3])
    assert m.length == 3
    assert m.indices.tolist() == [10, 20, 30]
    assert sizes(cache) == (0, 3, 3)


def test_given_locked_node_when_dec_lock_ref_then_node_becomes_evictable() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    node = cache.match_prefix([1, 2, 3]).last_node
    assert cache.inc_lock_ref(node) == -3
    assert cache.evictable_size == 0

    # When
    delta = cache.dec_lock_ref(node)

    # Then
    assert delta == 3
    assert sizes(cache) == (3, 0, 3)
    assert node.lock_ref == 0
    assert cache.evict(3).tolist() == [10, 20, 30]


def test_given_empty_cache_when_insert_then_evictable_size_equals_total_size() -> None:
    # Given
    cache = RadixCache()

    # When
    cache.insert([1, 2, 3], [10, 20, 30])

    # Then
    assert cache.evictable_size == cache.total_size() == 3
    assert cache.protected_size == 0


def test_given_inserted_node_when_inc_lock_ref_then_evictable_decreases_and_protected_increases() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])

    # When
    delta = cache.inc_lock_ref(cache.match_prefix([1, 2, 3]).last_node)

    # Then
    assert delta == -3
    assert cache.evictable_size == 0
    assert cache.protected_size == 3
    assert cache.total_size() == 3


def test_given_page_size_two_when_insert_odd_length_sequence_then_tail_is_dropped() -> None:
    # Given
    cache = RadixCache(2)

    # When
    ins = cache.insert([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    m = cache.match_prefix([1, 2, 3, 4, 5])

    # Then
    assert ins.prefix_len == 0
    assert m.length == 4
    assert m.indices.tolist() == [10, 20, 30, 40]
    assert cache.total_size() == 4


def test_given_page_size_two_when_match_shared_prefix_then_result_is_page_aligned() -> None:
    # Given
    cache = RadixCache(2)
    cache.insert([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60])

    # When: [1, 2, 3] agree but the page [3, 9] does not
    m = cache.match_prefix([1, 2, 3, 9])

    # Then
    assert m.length == 2
    assert m.indices.tolist() == [10, 20]
    assert m.last_node.key.tolist() == [1, 2]


def test_given_different_extra_keys_when_insert_same_tokens_then_namespaces_are_isolated() -> None:
    # Given
    cache = RadixCache()

    # When
    cache.insert([1, 2, 3], [10, 20, 30], extra_key="lora-a")
    cache.insert([1, 2, 3], [40, 50, 60], extra_key="lora-b")

    # Then
    assert cache.match_prefix([1, 2, 3], extra_key="lora-a").indices.tolist() == [10, 20, 30]
    assert cache.match_prefix([1, 2, 3], extra_key="lora-b").indices.tolist() == [40, 50, 60]
    assert cache.match_prefix([1, 2, 3]).length == 0
    assert cache.total_size() == 6


def test_given_cached_sequence_when_match_partial_twice_then_node_is_split_and_rematched() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])

    # When
    first = cache.match_prefix([1, 2, 3, 9, 9])
    after_first = node_count(cache)
    second = cache.match_prefix([1, 2, 3, 9, 9])

    # Then: the split is stable
    assert first.length == second.length == 3
    assert first.indices.tolist() == second.indices.tolist() == [10, 20, 30]
    assert second.last_node is first.last_node
    assert after_first == node_count(cache) == 2
    assert cache.match_prefix([1, 2, 3, 4, 5]).indices.tolist() == [10, 20, 30, 40, 50]
    assert cache.total_size() == 5


def test_given_cached_sequence_when_match_empty_key_then_returns_root_and_empty_indices() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])

    # When
    m = cache.match_prefix([])

    # Then
    assert m.length == 0
    assert m.indices.tolist() == []
    assert m.last_node is cache.root


# ======================================================================================= SGLang radix unit scenarios
@pytest.mark.parametrize("page", [1, 2])
def test_given_cached_sequence_when_diverging_insert_and_matches_then_nodes_split(page) -> None:
    # Given
    cache = RadixCache(page)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], [10, 20, 30, 40, 50, 60, 70, 80])

    # When: branch at token 3 (a page boundary for page 1 and 2)
    ins = cache.insert([1, 2, 9, 10], [901, 902, 90, 100])

    # Then
    assert ins.prefix_len == 2
    assert cache.total_size() == 10
    assert node_count(cache) == 3

    # When: a query that diverges after 4 tokens splits [3..8] once more
    m = cache.match_prefix([1, 2, 3, 4, 999, 1000])

    # Then: the first 4 values, structural split only
    assert m.indices.tolist() == [10, 20, 30, 40]
    assert m.last_node.key.tolist() == [3, 4]
    assert cache.total_size() == 10
    assert node_count(cache) == 4

    # Then: the full match still returns all 8
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).indices.tolist() == [10, 20, 30, 40, 50, 60, 70, 80]

    # When: a deeper split at 6
    deep = cache.match_prefix([1, 2, 3, 4, 5, 6, 77, 78])

    # Then
    assert deep.indices.tolist() == [10, 20, 30, 40, 50, 60]
    assert deep.last_node.key.tolist() == [5, 6]
    assert node_count(cache) == 5
    assert cache.total_size() == 10
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).indices.tolist() == [10, 20, 30, 40, 50, 60, 70, 80]

    # Then: the branch returns exactly its own values (the shared [1, 2] from the first insert)
    branch = cache.match_prefix([1, 2, 9, 10])
    assert branch.indices.tolist() == [10, 20, 90, 100]
    assert branch.last_node.key.tolist() == [9, 10]
    assert sizes(cache) == (10, 0, 10)


def test_given_page_two_when_split_inside_a_page_then_match_is_floored_to_the_page() -> None:
    # Given
    cache = RadixCache(2)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], [10, 20, 30, 40, 50, 60, 70, 80])

    # When: agrees on 5 tokens; the page [5, 0] differs
    m = cache.match_prefix([1, 2, 3, 4, 5, 0, 7, 8])

    # Then
    assert m.indices.tolist() == [10, 20, 30, 40]
    assert [n.key.tolist() for n in sorted(cache.nodes(), key=lambda n: len(path_tokens(cache, n)))] == [
        [1, 2, 3, 4],
        [5, 6, 7, 8],
    ]


@pytest.mark.parametrize("ns", [("key1", "key2", None), (("lora", "a"), ("lora", "b"), "lora")])
def test_given_same_tokens_in_three_namespaces_when_match_then_each_returns_only_its_own(ns) -> None:
    # Given
    cache = RadixCache()
    k1, k2, k3 = ns
    cache.insert([1, 2, 3], [11, 12, 13], extra_key=k1)
    cache.insert([1, 2, 3], [21, 22, 23], extra_key=k2)
    cache.insert([1, 2, 3], [31, 32, 33], extra_key=k3)

    # When
    m1 = cache.match_prefix([1, 2, 3], extra_key=k1)
    m2 = cache.match_prefix([1, 2, 3], extra_key=k2)
    m3 = cache.match_prefix([1, 2, 3], extra_key=k3)
    unknown = cache.match_prefix([1, 2, 3], extra_key="unknown")

    # Then
    assert m1.indices.tolist() == [11, 12, 13]
    assert m2.indices.tolist() == [21, 22, 23]
    assert m3.indices.tolist() == [31, 32, 33]
    assert m1.last_node.extra_key == k1 and m2.last_node.extra_key == k2 and m3.last_node.extra_key == k3
    assert unknown.length == 0
    assert unknown.last_node is cache.root
    assert len(cache.root.children) == 3  # namespaces never share nodes
    assert cache.total_size() == 9


def test_given_namespaces_when_insert_extends_one_then_others_do_not_see_it() -> None:
    # Given
    cache = RadixCache(2)
    cache.insert([1, 2, 3, 4], [1, 2, 3, 4], extra_key=("lora", "a"))
    cache.insert([1, 2], [5, 6], extra_key=("lora", "b"))

    # When
    ins = cache.insert([1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12], extra_key=("lora", "b"))

    # Then: "b" only had [1, 2] cached
    assert ins.prefix_len == 2
    assert cache.match_prefix([1, 2, 3, 4, 5, 6], extra_key=("lora", "b")).indices.tolist() == [5, 6, 9, 10, 11, 12]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6], extra_key=("lora", "a")).indices.tolist() == [1, 2, 3, 4]
    assert cache.match_prefix([1, 2, 3, 4, 5, 6], extra_key=("lora", "c")).length == 0
    assert cache.total_size() == 10


def test_given_two_paths_sharing_a_prefix_when_locked_and_unlocked_then_sizes_move_exactly() -> None:
    # Given: [1,2,3] shared by [4,5,6] and [7,8]
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60])
    cache.insert([1, 2, 3, 7, 8], [0, 0, 0, 70, 80])
    assert sizes(cache) == (8, 0, 8)
    a = cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node
    b = cache.match_prefix([1, 2, 3, 7, 8]).last_node
    shared = a.parent
    assert shared is b.parent and shared.key.tolist() == [1, 2, 3]

    # When: lock the first path
    d1 = cache.inc_lock_ref(a)

    # Then
    assert d1 == -6
    assert sizes(cache) == (2, 6, 8)

    # When: lock the second path (the shared prefix is already protected)
    d2 = cache.inc_lock_ref(b)

    # Then
    assert d2 == -2
    assert sizes(cache) == (0, 8, 8)
    assert (shared.lock_ref, a.lock_ref, b.lock_ref) == (2, 1, 1)

    # When: unlock the first path; the shared prefix stays protected by the second
    d3 = cache.dec_lock_ref(a)

    # Then
    assert d3 == 3
    assert sizes(cache) == (3, 5, 8)
    assert (shared.lock_ref, a.lock_ref, b.lock_ref) == (1, 0, 1)
    assert cache.evict(100).tolist() == [40, 50, 60]
    assert sizes(cache) == (0, 5, 5)

    # When: unlock the second path
    d4 = cache.dec_lock_ref(b)

    # Then
    assert d4 == 5
    assert sizes(cache) == (5, 0, 5)
    assert shared.lock_ref == 0
    assert cache.evict(100).tolist() == [70, 80, 10, 20, 30]
    assert sizes(cache) == (0, 0, 0)


def test_given_same_node_locked_twice_when_unlocked_once_then_still_protected() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    node = cache.match_prefix([1, 2, 3]).last_node

    # When
    assert cache.inc_lock_ref(node) == -3
    assert cache.inc_lock_ref(node) == 0
    assert cache.dec_lock_ref(node) == 0

    # Then
    assert sizes(cache) == (0, 3, 3)
    assert node.lock_ref == 1
    assert cache.evict(10).tolist() == []
    assert cache.dec_lock_ref(node) == 3
    assert sizes(cache) == (3, 0, 3)


def test_given_chain_of_nodes_when_evict_then_cascades_in_one_call() -> None:
    # Given: [1,2,3] -> [4,5] -> [6,7]
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    cache.insert([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    cache.insert([1, 2, 3, 4, 5, 6, 7], [10, 20, 30, 40, 50, 60, 70])
    assert node_count(cache) == 3

    # When
    freed = cache.evict(7)

    # Then: leaf first, then each parent as it becomes a leaf
    assert freed.tolist() == [60, 70, 40, 50, 10, 20, 30]
    assert sizes(cache) == (0, 0, 0)
    assert node_count(cache) == 0
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).length == 0


def test_given_chain_when_evict_fewer_than_a_node_then_whole_leaf_evicted() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5, 6, 7], [10, 20, 30, 40, 50, 60, 70])
    cache.match_prefix([1, 2, 3, 4, 5])  # split: [1..5] -> [6,7]

    # When
    freed = cache.evict(1)

    # Then: the whole leaf node goes (2 tokens, more than asked) and nothing more
    assert freed.tolist() == [60, 70]
    assert sizes(cache) == (5, 0, 5)
    assert cache.match_prefix([1, 2, 3, 4, 5, 6, 7]).indices.tolist() == [10, 20, 30, 40, 50]


def test_given_chain_when_evict_exactly_leaf_then_parent_survives() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5], [10, 20, 30, 40, 50])
    cache.match_prefix([1, 2, 3])  # split: [1,2,3] -> [4,5]

    # When
    freed = cache.evict(2)

    # Then
    assert freed.tolist() == [40, 50]
    assert cache.match_prefix([1, 2, 3, 4, 5]).indices.tolist() == [10, 20, 30]


def test_given_three_leaves_when_one_rematched_then_lru_order_evicts_least_recently_matched_first() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 1], [11, 12])
    cache.insert([2, 2], [21, 22])
    cache.insert([3, 3], [31, 32])

    # When: touch the oldest
    cache.match_prefix([1, 1])

    # Then
    assert cache.evict(2).tolist() == [21, 22]
    assert cache.evict(2).tolist() == [31, 32]
    assert cache.evict(2).tolist() == [11, 12]
    assert cache.evict(2).tolist() == []


def test_given_leaves_when_partial_match_touches_a_leaf_then_it_is_evicted_last() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [1, 2, 3])
    cache.insert([4, 5, 6], [4, 5, 6])

    # When: a partial match refreshes the first path
    cache.match_prefix([1, 2, 9])

    # Then: the untouched [4,5,6] goes first, then the split path from its leaf up
    assert cache.evict(1).tolist() == [4, 5, 6]
    assert cache.evict(100).tolist() == [3, 1, 2]


def test_given_locked_path_when_evict_everything_then_only_unlocked_returned() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 1], [11, 12])
    cache.insert([2, 2], [21, 22])
    cache.insert([3, 3], [31, 32])
    cache.insert([1, 1, 5, 5], [0, 0, 15, 16])
    locked = cache.match_prefix([1, 1]).last_node
    cache.inc_lock_ref(locked)

    # When
    freed = cache.evict(1000)

    # Then: [1,1,5,5]'s leaf is evictable (the lock stops at [1,1]); [1,1] is not
    assert freed.tolist() == [21, 22, 31, 32, 15, 16]
    assert sizes(cache) == (0, 2, 2)
    assert cache.match_prefix([1, 1, 5, 5]).indices.tolist() == [11, 12]


def test_given_cache_when_evict_zero_then_nothing_evicted() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    before = radix_snapshot(cache)

    # When
    freed = cache.evict(0)

    # Then
    assert freed.tolist() == []
    assert freed.dtype == np.int64
    assert radix_snapshot(cache) == before


def test_given_empty_cache_when_evict_then_returns_empty() -> None:
    # Given
    cache = RadixCache()

    # When / Then
    assert cache.evict(5).tolist() == []
    assert sizes(cache) == (0, 0, 0)


def test_given_numpy_count_when_evict_then_accepted() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2], [3, 4])

    # When / Then
    assert cache.evict(np.int64(1)).tolist() == [3, 4]


@pytest.mark.parametrize(("page", "length", "aligned"), [(1, 5, 5), (2, 5, 4), (4, 6, 4)])
def test_given_page_size_when_insert_and_match_then_length_is_page_aligned(page, length, aligned) -> None:
    # Given
    cache = RadixCache(page)
    tokens = list(range(1, length + 1))
    slots = [100 + t for t in tokens]

    # When
    ins = cache.insert(tokens, slots)
    m = cache.match_prefix(tokens)

    # Then
    assert ins.prefix_len == 0
    assert m.length == aligned
    assert m.length % page == 0
    assert m.indices.tolist() == slots[:aligned]
    assert cache.total_size() == aligned
    assert ins.last_node.key.tolist() == tokens[:aligned]


def test_given_page_four_when_tokens_shorter_than_a_page_then_nothing_inserted_or_matched() -> None:
    # Given
    cache = RadixCache(4)

    # When
    ins = cache.insert([1, 2, 3], [1, 2, 3])

    # Then
    assert ins.prefix_len == 0
    assert ins.last_node is cache.root
    assert cache.total_size() == 0
    assert cache.match_prefix([1, 2, 3]).last_node is cache.root


def test_given_priorities_when_inserted_then_recorded_but_lru_order_unchanged() -> None:
    # Given: the high-priority sequence is the oldest
    cache = RadixCache()
    hi = cache.insert([1, 2], [11, 12], priority=100)
    lo = cache.insert([3, 4], [31, 32], priority=0)
    mid = cache.insert([1, 2, 5], [0, 0, 15], priority=7)

    # Then: priorities recorded (max along the path)
    assert hi.last_node.priority == 100
    assert lo.last_node.priority == 0
    assert mid.last_node.priority == 7
    assert mid.last_node.parent is hi.last_node
    assert hi.last_node.priority == 100

    # When
    freed = cache.evict(1)

    # Then: pure LRU: [3,4] (inserted before the [5] leaf) goes first regardless of priority
    assert freed.tolist() == [31, 32]
    assert cache.evict(1).tolist() == [15]
    assert cache.evict(1).tolist() == [11, 12]


def test_given_priority_when_reinserted_higher_then_path_takes_the_max() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [1, 2, 3, 4], priority=1)

    # When: a diverging insert with a higher priority splits the edge
    res = cache.insert([1, 2, 9], [0, 0, 9], priority=5)

    # Then
    shared = res.last_node.parent
    assert shared.key.tolist() == [1, 2]
    assert shared.priority == 5
    assert res.last_node.priority == 5
    suffix = cache.match_prefix([1, 2, 3, 4]).last_node
    assert suffix.priority == 1


@pytest.mark.parametrize(
    ("page", "first", "second", "expected"),
    [
        (1, [1, 2, 3, 4], [1, 2, 3, 4, 5, 6], 4),
        (1, [1, 2, 3, 4], [1, 2, 7], 2),
        (1, [1, 2, 3, 4], [5, 6], 0),
        (2, [1, 2, 3, 4], [1, 2, 3, 5, 6, 7], 2),
        (2, [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7], 4),
        (4, [1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 5, 6, 7, 0], 4),
    ],
)
def test_given_cached_tokens_when_insert_then_prefix_len_counts_already_cached(page, first, second, expected) -> None:
    # Given
    cache = RadixCache(page)
    cache.insert(first, [100 + i for i in range(len(first))])
    total_before = cache.total_size()

    # When
    res = cache.insert(second, [200 + i for i in range(len(second))])

    # Then
    aligned = (len(second) // page) * page
    assert res.prefix_len == expected
    assert cache.total_size() == total_before + aligned - expected
    m = cache.match_prefix(second)
    assert m.indices.tolist() == [100 + i for i in range(expected)] + [200 + i for i in range(expected, aligned)]
    assert m.last_node is res.last_node or aligned == expected


@pytest.mark.parametrize(("page", "tokens"), [(1, [1, 2, 3, 4, 5]), (2, [1, 2, 3, 4, 5]), (4, list(range(9)))])
def test_given_cached_sequence_when_reinsert_identical_then_prefix_len_is_aligned_and_no_new_node(page, tokens) -> None:
    # Given
    cache = RadixCache(page)
    first = cache.insert(tokens, list(range(100, 100 + len(tokens))))
    nodes_before = node_count(cache)
    total_before = cache.total_size()

    # When
    again = cache.insert(tokens, list(range(500, 500 + len(tokens))))

    # Then
    aligned = (len(tokens) // page) * page
    assert again.prefix_len == aligned
    assert again.last_node is first.last_node
    assert node_count(cache) == nodes_before == 1
    assert cache.total_size() == total_before == aligned
    assert cache.match_prefix(tokens).indices.tolist() == list(range(100, 100 + aligned))


def test_given_cached_sequence_when_insert_strict_prefix_then_split_and_nothing_new() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60])

    # When
    res = cache.insert([1, 2, 3], [7, 8, 9])

    # Then
    assert res.prefix_len == 3
    assert res.last_node.key.tolist() == [1, 2, 3]
    assert res.last_node.value.tolist() == [10, 20, 30]
    assert node_count(cache) == 2
    assert sizes(cache) == (6, 0, 6)


def test_given_locked_node_when_match_splits_it_then_both_halves_keep_the_lock() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60])
    node = cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node
    cache.inc_lock_ref(node)

    # When
    m = cache.match_prefix([1, 2, 3, 9])

    # Then
    prefix = m.last_node
    assert prefix.key.tolist() == [1, 2, 3]
    assert node.parent is prefix
    assert node.key.tolist() == [4, 5, 6]
    assert (prefix.lock_ref, node.lock_ref) == (1, 1)
    assert sizes(cache) == (0, 6, 6)

    # When: the original holder unlocks through the node it holds
    delta = cache.dec_lock_ref(node)

    # Then
    assert delta == 6
    assert (prefix.lock_ref, node.lock_ref) == (0, 0)
    assert sizes(cache) == (6, 0, 6)


def test_given_locked_node_when_insert_splits_it_then_both_halves_keep_the_lock() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], [10, 20, 30, 40])
    node = cache.match_prefix([1, 2, 3, 4]).last_node
    cache.inc_lock_ref(node)

    # When
    res = cache.insert([1, 2, 7, 8], [0, 0, 70, 80])

    # Then
    prefix = res.last_node.parent
    assert prefix.key.tolist() == [1, 2]
    assert (prefix.lock_ref, node.lock_ref, res.last_node.lock_ref) == (1, 1, 0)
    assert sizes(cache) == (2, 4, 6)
    assert cache.evict(100).tolist() == [70, 80]


def test_given_cache_when_pretty_then_contains_tokens_and_slots() -> None:
    # Given
    cache = RadixCache()
    cache.insert([11, 12, 13], [101, 102, 103])
    cache.insert([11, 12, 14], [0, 0, 104], extra_key=None)
    cache.insert([21, 22], [201, 202], extra_key="ns-x")

    # When
    text = cache.pretty()

    # Then
    assert "11, 12" in text
    assert "101, 102" in text
    assert "13" in text and "103" in text
    assert "14" in text and "104" in text
    assert "21, 22" in text and "201, 202" in text
    assert "ns-x" in text
    assert "total=6" in text


@pytest.mark.parametrize("page", [1, 2, 4])
def test_given_various_ops_when_len_then_equals_total_size(page) -> None:
    # Given
    cache = RadixCache(page)

    # When / Then
    for tokens in ([1, 2, 3, 4, 5, 6, 7, 8], [1, 2, 3, 4, 9, 9, 9, 9], [5, 5, 5, 5]):
        cache.insert(tokens, tokens)
        assert len(cache) == cache.total_size() == cache.evictable_size + cache.protected_size
    assert len(cache) == 16
    cache.inc_lock_ref(cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node)
    protected = {1: 6, 2: 6, 4: 4}[page]
    assert (cache.evictable_size, cache.protected_size) == (16 - protected, protected)
    assert len(cache) == cache.total_size() == 16
    assert len(cache.evict(3)) == 4  # one whole 4-token leaf
    assert len(cache) == cache.total_size() == sum(len(n.key) for n in cache.nodes()) == 12


def test_given_match_result_when_caller_mutates_indices_then_tree_unchanged() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    m = cache.match_prefix([1, 2, 3])

    # When
    m.indices[0] = 999

    # Then
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == [10, 20, 30]


def test_given_numpy_inputs_when_caller_mutates_after_insert_then_tree_unchanged() -> None:
    # Given
    cache = RadixCache()
    tokens = np.array([1, 2, 3], dtype=np.int64)
    slots = np.array([10, 20, 30], dtype=np.int64)
    cache.insert(tokens, slots)

    # When
    tokens[:] = 7
    slots[:] = 0

    # Then
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == [10, 20, 30]
    assert cache.match_prefix([7, 7, 7]).length == 0


def test_given_torch_and_tuple_inputs_when_insert_then_accepted() -> None:
    # Given
    cache = RadixCache()

    # When
    cache.insert(torch.tensor([1, 2, 3]), torch.tensor([10, 20, 30], dtype=torch.int32))
    m = cache.match_prefix((1, 2, 3))

    # Then
    assert m.indices.tolist() == [10, 20, 30]
    assert m.indices.dtype == np.int64


def test_given_longer_kv_indices_when_insert_then_extra_ignored() -> None:
    # Given
    cache = RadixCache(2)

    # When
    res = cache.insert([1, 2, 3], [10, 20, 30, 40, 50])

    # Then
    assert res.prefix_len == 0
    assert cache.match_prefix([1, 2, 3]).indices.tolist() == [10, 20]
    assert cache.total_size() == 2


# ==================================================================================== peek_prefix / evictable_size_if
def test_given_partial_edge_when_peek_prefix_then_nothing_changes() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60])
    cache.insert([7, 8], [70, 80])
    count_before = node_count(cache)
    times_before = access_times(cache)
    snap_before = radix_snapshot(cache)

    # When
    segs = cache.peek_prefix([1, 2, 3, 9])

    # Then: one segment: the [1..6] node, 3 tokens of it; no split, no LRU touch
    assert [(s.node.key.tolist(), s.matched) for s in segs] == [([1, 2, 3, 4, 5, 6], 3)]
    assert node_count(cache) == count_before == 2
    assert access_times(cache) == times_before
    assert radix_snapshot(cache) == snap_before


def test_given_multi_node_path_when_peek_prefix_then_segments_match_what_match_prefix_returns() -> None:
    # Given
    cache = RadixCache(2)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], list(range(10, 18)))
    cache.insert([1, 2, 3, 4, 9, 9], [0, 0, 0, 0, 30, 31])

    # When
    segs = cache.peek_prefix([1, 2, 3, 4, 5, 6, 0, 0, 1])
    seen = [(s.node.key.tolist(), s.matched) for s in segs]
    times_before = access_times(cache)
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 0, 0, 1])

    # Then
    assert seen == [([1, 2, 3, 4], 4), ([5, 6, 7, 8], 2)]
    assert sum(s.matched for s in segs) == m.length == 6
    assert m.indices.tolist() == [10, 11, 12, 13, 14, 15]
    assert access_times(cache) != times_before


def test_given_miss_when_peek_prefix_then_empty() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2], [1, 2])

    # When / Then
    assert cache.peek_prefix([2, 1]) == []
    assert cache.peek_prefix([1, 2], extra_key="other") == []
    assert cache.peek_prefix([]) == []


def test_given_two_leaves_when_peek_oldest_then_lru_order_unchanged() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 1], [11, 12])
    cache.insert([2, 2], [21, 22])

    # When
    cache.peek_prefix([1, 1])

    # Then: a match would have protected [1,1] from the next eviction; a peek does not
    assert cache.evict(1).tolist() == [11, 12]


def _plan_tree() -> tuple[RadixCache, dict[str, TreeNode]]:
    """P=[1,2,3] -> X=[4,5,6], P -> Y=[7,8]; Z=[9,9] separately. Total 10, all unlocked."""
    cache = RadixCache()
    cache.insert([1, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60])
    cache.insert([1, 2, 3, 7, 8], [0, 0, 0, 70, 80])
    cache.insert([9, 9], [90, 91])
    nodes = {
        "X": cache.match_prefix([1, 2, 3, 4, 5, 6]).last_node,
        "Y": cache.match_prefix([1, 2, 3, 7, 8]).last_node,
        "Z": cache.match_prefix([9, 9]).last_node,
    }
    nodes["P"] = nodes["X"].parent
    assert sizes(cache) == (10, 0, 10)
    return cache, nodes


PLAN_CASES = [
    # (name, locks held first, nodes to unlock, query to lock, extra_key, expected evictable afterwards)
    ("partial edge on unlocked node", [], [], [1, 2, 3, 4, 5], None, 5),
    ("partial edge on node locked by someone else", ["X"], [], [1, 2, 3, 4, 5], None, 4),
    ("unlock the only lock", ["X"], ["X"], [], None, 10),
    ("unlock one lock, lock a sibling", ["X"], ["X"], [1, 2, 3, 7, 8], None, 5),
    ("unlock and relock a partial of the same node", ["X"], ["X"], [1, 2, 3, 4, 5], None, 5),
    ("two holders, one unlocks, lock a sibling", ["X", "X"], ["X"], [1, 2, 3, 7, 8], None, 2),
    ("unlock a child whose parent another path holds", ["X", "Y"], ["Y"], [9, 9], None, 2),
    ("partial edge inside the shared prefix", [], [], [1, 2, 8], None, 8),
    ("partial of the shared prefix while it is locked via a child", ["Y"], [], [1, 2], None, 5),
    ("unlock both children, lock unrelated", ["X", "Y"], ["X", "Y"], [9, 9, 9], None, 8),
    ("nothing to do", [], [None], [], None, 10),
    ("miss in another namespace", ["Z"], ["Z"], [1, 2, 3], "other", 10),
    ("lock the same node again", ["X"], [], [1, 2, 3, 4, 5, 6], None, 4),
]


@pytest.mark.parametrize(
    ("held", "unlock", "query", "extra_key", "expected"),
    [c[1:] for c in PLAN_CASES],
    ids=[c[0] for c in PLAN_CASES],
)
def test_given_locks_when_evictable_size_if_then_equals_size_observed_after_doing_it(
    held, unlock, query, extra_key, expected
) -> None:
    # Given
    cache, nodes = _plan_tree()
    for name in held:
        cache.inc_lock_ref(nodes[name])
    unlock_nodes = [nodes[n] if n is not None else None for n in unlock]
    segs = cache.peek_prefix(query, extra_key=extra_key)
    snap = radix_snapshot(cache)

    # When
    predicted = cache.evictable_size_if(unlock_nodes, segs)

    # Then: the prediction changes nothing and is what actually happens
    assert radix_snapshot(cache) == snap
    assert predicted == expected
    for node in unlock_nodes:
        cache.dec_lock_ref(node)
    m = cache.match_prefix(query, extra_key=extra_key)
    cache.inc_lock_ref(m.last_node)
    assert cache.evictable_size == predicted
    assert cache.evictable_size + cache.protected_size == cache.total_size() == 10


# ====================================================================================================== bad input
def _busy_cache(page: int = 1) -> tuple[RadixCache, TreeNode]:
    cache = RadixCache(page)
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8], list(range(10, 18)))
    cache.insert([1, 2, 3, 4, 9, 9, 9, 9], [0, 0, 0, 0, 20, 21, 22, 23])
    cache.insert([5, 5, 5, 5], [30, 31, 32, 33], extra_key="ns")
    locked = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).last_node
    cache.inc_lock_ref(locked)
    return cache, locked


@pytest.mark.parametrize("page_size", [0, -1, 1.5, "2", None, True])
def test_given_bad_page_size_when_construct_then_value_error(page_size) -> None:
    # When / Then
    with pytest.raises(ValueError, match="page_size"):
        RadixCache(page_size)


BAD_TOKENS = [
    pytest.param([1.0, 2.0], id="floats"),
    pytest.param([1, 2.5], id="int-and-float"),
    pytest.param(np.array([1.0, 2.0]), id="float-array"),
    pytest.param([True, False], id="bools"),
    pytest.param(np.array([True, False]), id="bool-array"),
    pytest.param(["a", "b"], id="strings"),
    pytest.param("abc", id="a-string"),
    pytest.param([1, -2, 3], id="negative"),
    pytest.param(np.array([-1], dtype=np.int32), id="negative-array"),
    pytest.param([[1, 2], [3, 4]], id="2-D"),
    pytest.param(np.zeros((2, 2), dtype=np.int64), id="2-D-array"),
    pytest.param(torch.tensor([1.0, 2.0]), id="float-tensor"),
    pytest.param(None, id="None"),
    pytest.param([2**64], id="too-large"),
    pytest.param([2**63], id="overflows-int64"),
]


@pytest.mark.parametrize("tokens", BAD_TOKENS)
@pytest.mark.parametrize("verb", ["match_prefix", "peek_prefix", "insert"])
def test_given_bad_tokens_when_called_then_value_error_and_tree_unchanged(verb, tokens) -> None:
    # Given
    cache, _ = _busy_cache()
    before = radix_snapshot(cache)
    count = node_count(cache)

    # When / Then
    with pytest.raises(ValueError, match="tokens"):
        if verb == "insert":
            getattr(cache, verb)(tokens, list(range(100, 104)))
        else:
            getattr(cache, verb)(tokens)
    assert radix_snapshot(cache) == before
    assert node_count(cache) == count


@pytest.mark.parametrize("kv", [[1.0, 2.0, 3.0, 4.0], [1, -1, 2, 3], None, [[1, 2], [3, 4]], [True] * 4])
def test_given_bad_kv_indices_when_insert_then_value_error_and_tree_unchanged(kv) -> None:
    # Given
    cache, _ = _busy_cache()
    before = radix_snapshot(cache)

    # When / Then
    with pytest.raises(ValueError, match="kv_indices"):
        cache.insert([7, 7, 7, 7], kv)
    assert radix_snapshot(cache) == before


BOOL_AMONG_INTS = [
    pytest.param([1, True], id="list"),
    pytest.param((True, 1), id="tuple"),
    pytest.param(
        [np.True_, 1],
        id="numpy-bool-in-list",
    ),
]


@pytest.mark.parametrize("tokens", BOOL_AMONG_INTS)
@pytest.mark.parametrize("verb", ["match_prefix", "peek_prefix", "insert"])
def test_given_int_sequence_with_a_bool_when_called_then_value_error_and_tree_unchanged(verb, tokens) -> None:
    # Given: [1, 1] is cached, which a bool taken as 1 would match
    cache = RadixCache()
    cache.insert([1, 1], [10, 11])
    before = radix_snapshot(cache)

    # When / Then
    with pytest.raises(ValueError, match="tokens"):
        if verb == "insert":
            cache.insert(tokens, [20, 21])
        else:
            getattr(cache, verb)(tokens)
    assert radix_snapshot(cache) == before


@pytest.mark.parametrize(("page", "tokens", "kv"), [(1, [1, 2, 3], [7, 8]), (2, [1, 2, 3, 4, 5], [7, 8, 9]),
                                                    (4, [1] * 8, [])])
def test_given_short_kv_indices_when_insert_then_value_error_and_tree_unchanged(page, tokens, kv) -> None:
    # Given
    cache, _ = _busy_cache(page)
    before = radix_snapshot(cache)

    # When / Then
    with pytest.raises(ValueError, match="kv_indices"):
        cache.insert(tokens, kv)
    assert radix_snapshot(cache) == before


BAD_KEYWORDS = [
    pytest.param("match_prefix", {"extra_key": ["lora"]}, id="match-unhashable-extra_key"),
    pytest.param("insert", {"extra_key": {"lora": 1}}, id="insert-unhashable-extra_key"),
    pytest.param("insert", {"priority": None}, id="insert-priority-None"),
    pytest.param("insert", {"priority": "high"}, id="insert-priority-str"),
]


@pytest.mark.parametrize(("verb", "kwargs"), BAD_KEYWORDS)
def test_given_bad_extra_key_or_priority_when_called_then_value_error_and_tree_unchanged(verb, kwargs) -> None:
    # Given
    cache, _ = _busy_cache()
    before = (radix_snapshot(cache), cache.root.last_access_time, cache.root.priority)

    # When / Then
    with pytest.raises(ValueError):
        if verb == "insert":
            cache.insert([7, 7, 7, 7], [1, 2, 3, 4], **kwargs)
        else:
            cache.match_prefix([1, 2, 3, 4], **kwargs)
    assert (radix_snapshot(cache), cache.root.last_access_time, cache.root.priority) == before


def test_given_kv_indices_covering_only_the_aligned_part_when_insert_then_accepted() -> None:
    # Given
    cache = RadixCache(2)

    # When: 5 tokens, 4 aligned, 4 slots
    res = cache.insert([1, 2, 3, 4, 5], [7, 8, 9, 10])

    # Then
    assert res.prefix_len == 0
    assert cache.match_prefix([1, 2, 3, 4]).indices.tolist() == [7, 8, 9, 10]


@pytest.mark.parametrize("n", [-1, 1.5, "3", None, True])
def test_given_bad_count_when_evict_then_value_error_and_tree_unchanged(n) -> None:
    # Given
    cache, _ = _busy_cache()
    before = radix_snapshot(cache)

    # When / Then
    with pytest.raises(ValueError):
        cache.evict(n)
    assert radix_snapshot(cache) == before


def test_given_unlocked_node_when_dec_lock_ref_then_runtime_error_and_sizes_unchanged() -> None:
    # Given
    cache, _ = _busy_cache()
    unlocked = cache.match_prefix([1, 2, 3, 4, 9, 9, 9, 9]).last_node
    assert unlocked.lock_ref == 0 and unlocked.parent.lock_ref == 1  # the shared parent is locked by the other path
    before = radix_snapshot(cache)
    before_sizes = sizes(cache)

    # When / Then: nothing is decremented, not even the locked parent
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(unlocked)
    assert sizes(cache) == before_sizes
    assert unlocked.parent.lock_ref == 1
    assert radix_snapshot(cache) == before


def test_given_lock_released_when_dec_lock_ref_again_then_runtime_error_and_never_below_zero() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2], [1, 2])
    node = cache.match_prefix([1, 2]).last_node
    cache.inc_lock_ref(node)
    cache.dec_lock_ref(node)
    before = radix_snapshot(cache)

    # When / Then
    with pytest.raises(RuntimeError):
        cache.dec_lock_ref(node)
    assert node.lock_ref == 0
    assert sizes(cache) == (2, 0, 2)
    assert radix_snapshot(cache) == before


def test_given_evicted_node_when_inc_lock_ref_then_value_error_and_tree_unchanged() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2], [10, 20])
    cache.insert([3, 4], [30, 40])
    node = cache.match_prefix([1, 2]).last_node
    cache.match_prefix([3, 4])
    assert cache.evict(1).tolist() == [10, 20]
    assert node.evicted
    before = radix_snapshot(cache)

    # When / Then
    with pytest.raises(ValueError, match="evicted"):
        cache.inc_lock_ref(node)
    assert radix_snapshot(cache) == before
    assert sizes(cache) == (2, 0, 2)


def test_given_evicted_node_when_dec_lock_ref_then_value_error_and_tree_unchanged() -> None:
    # Given
    cache = RadixCache()
    cache.insert([1, 2], [10, 20])
    node = cache.match_prefix([1, 2]).last_node
    cache.evict(2)
    before = radix_snapshot(cache)

    # When / Then: an evicted node is a bad argument, like for inc_lock_ref
    with pytest.raises(ValueError, match="evicted"):
        cache.dec_lock_ref(node)
    assert radix_snapshot(cache) == before


@pytest.mark.parametrize("locked_before_reset", [False, True])
@pytest.mark.parametrize("verb", ["inc_lock_ref", "dec_lock_ref"])
def test_given_node_from_before_reset_when_lock_verb_then_value_error_and_tree_unchanged(
    verb, locked_before_reset
) -> None:
    # Given: regression: this used to move the stale node's length into the new tree's protected size
    cache = RadixCache()
    cache.insert([1, 2, 3], [10, 20, 30])
    stale = cache.match_prefix([1, 2, 3]).last_node
    if locked_before_reset:
        cache.inc_lock_ref(stale)
    cache.reset()
    cache.insert([4, 5], [40, 50])
    before = radix_snapshot(cache)

    # When / Then
    with pytest.raises(ValueError, match="not in this tree"):
        getattr(cache, verb)(stale)
    assert radix_snapshot(cache) == before
    assert sizes(cache) == (2, 0, 2)


@pytest.mark.parametrize("verb", ["inc_lock_ref", "dec_lock_ref"])
def test_given_node_of_another_cache_when_lock_verb_then_value_error_and_both_trees_unchanged(verb) -> None:
    # Given
    cache = RadixCache()
    cache.insert([4, 5], [40, 50])
    other = RadixCache()
    other.insert([1, 2, 3], [10, 20, 30])
    foreign = other.match_prefix([1, 2, 3]).last_node
    other.inc_lock_ref(foreign)
    before, other_before = radix_snapshot(cache), radix_snapshot(other)

    # When / Then
    with pytest.raises(ValueError, match="not in this tree"):
        getattr(cache, verb)(foreign)
    assert radix_snapshot(cache) == before
    assert radix_snapshot(other) == other_before
    assert sizes(cache) == (2, 0, 2)
    assert sizes(other) == (0, 3, 3)


def test_given_none_when_inc_or_dec_lock_ref_then_zero_and_nothing_changes() -> None:
    # Given
    cache, _ = _busy_cache()
    before = radix_snapshot(cache)

    # When / Then
    assert cache.inc_lock_ref(None) == 0
    assert cache.dec_lock_ref(None) == 0
    assert radix_snapshot(cache) == before


def test_given_root_when_inc_or_dec_lock_ref_then_zero_and_root_stays_locked_once() -> None:
    # Given
    cache, _ = _busy_cache()
    before = radix_snapshot(cache)

    # When / Then
    assert cache.inc_lock_ref(cache.root) == 0
    assert cache.dec_lock_ref(cache.root) == 0
    assert cache.root.lock_ref == 1
    assert radix_snapshot(cache) == before


# ================================================================================== randomized brute-force model
ALPHABET = st.integers(min_value=0, max_value=2)
# A few long sequences that share prefixes of different lengths: their prefixes hit partial edges, splits and locked
# paths far more often than independent random lists do.
BASES = [
    (0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2),
    (0, 1, 2, 0, 1, 2, 2, 2, 0, 0, 1, 1),
    (0, 1, 2, 1, 1, 1, 0, 1, 2, 0, 1, 2),
    (0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1),
    (2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
]
PREFIXES = st.tuples(st.sampled_from(BASES), st.integers(0, 12)).map(lambda bt: list(bt[0][: bt[1]]))
TOKENS = st.one_of(PREFIXES, PREFIXES, st.lists(ALPHABET, max_size=10))
EXTRA_KEYS = st.sampled_from([None, None, "a", ("lora", "b")])


class RadixModelMachine(RuleBasedStateMachine):
    """Drives a RadixCache and a model: {(extra_key, page-aligned prefix): slots of that prefix} for every cached
    prefix, plus the list of currently held locks (node, extra_key, locked prefix)."""

    PAGE = 1

    def __init__(self) -> None:
        super().__init__()
        self.page = self.PAGE
        self.cache = RadixCache(self.page)
        self.model: dict[tuple[Hashable, tuple[int, ...]], tuple[int, ...]] = {}
        self.locks: list[tuple[TreeNode, Hashable, tuple[int, ...]]] = []
        self.next_slot = 0

    # ---------------------------------------------------------------- model helpers
    def aligned(self, n: int) -> int:
        return (n // self.page) * self.page

    def longest(self, ek: Hashable, toks: tuple[int, ...]) -> int:
        for k in range(self.aligned(len(toks)), 0, -self.page):
            if (ek, toks[:k]) in self.model:
                return k
        return 0

    def protected_entries(self) -> set[tuple[Hashable, tuple[int, ...]]]:
        out = set()
        for _, ek, prefix in self.locks:
            for k in range(self.page, len(prefix) + 1, self.page):
                out.add((ek, prefix[:k]))
        return out

    def node_path(self, node: TreeNode) -> tuple[int, ...]:
        return tuple(path_tokens(self.cache, node))

    def lock_match(self, ek: Hashable, toks: tuple[int, ...]) -> None:
        k = self.longest(ek, toks)
        protected_before = len(self.protected_entries())
        m = self.cache.match_prefix(toks, extra_key=ek)
        assert m.length == k
        delta = self.cache.inc_lock_ref(m.last_node)
        if k:
            self.locks.append((m.last_node, ek, toks[:k]))
        else:
            assert m.last_node is self.cache.root
        assert delta == -(len(self.protected_entries()) - protected_before) * self.page

    # ---------------------------------------------------------------- rules
    @rule(ek=EXTRA_KEYS, toks=TOKENS, extra=st.integers(0, 2), priority=st.integers(-3, 3))
    def insert(self, ek, toks, extra, priority) -> None:
        self.do_insert(ek, toks, extra, priority)

    def do_insert(self, ek, toks, extra, priority) -> None:
        toks = tuple(toks)
        aligned = self.aligned(len(toks))
        kv = tuple(range(self.next_slot, self.next_slot + len(toks) + extra))
        self.next_slot += len(kv)
        expected = self.longest(ek, toks)

        res = self.cache.insert(list(toks), np.array(kv, dtype=np.int64), extra_key=ek, priority=priority)

        assert res.prefix_len == expected
        base = self.model.get((ek, toks[:expected]), ())
        for k in range(expected + self.page, aligned + 1, self.page):
            self.model[(ek, toks[:k])] = base + kv[expected:k]
        if aligned == 0:
            assert res.last_node is self.cache.root
        else:
            assert self.node_path(res.last_node) == toks[:aligned]
            assert res.last_node.extra_key == ek

    @rule(ek=EXTRA_KEYS, toks=TOKENS)
    def match(self, ek, toks) -> None:
        toks = tuple(toks)
        k = self.longest(ek, toks)

        m = self.cache.match_prefix(toks, extra_key=ek)

        assert m.length == k
        assert tuple(m.indices.tolist()) == self.model.get((ek, toks[:k]), ())
        if k == 0:
            assert m.last_node is self.cache.root
        else:
            assert self.node_path(m.last_node) == toks[:k]

    @rule(n=st.integers(0, 14))
    def evict(self, n) -> None:
        evictable_before = self.cache.evictable_size
        protected = self.protected_entries()

        freed = self.cache.evict(n).tolist()

        freed_set = set(freed)
        assert len(freed_set) == len(freed)
        assert min(n, evictable_before) <= len(freed) <= evictable_before
        gone = {key for key, slots in self.model.items() if freed_set & set(slots)}
        last_pages = set()
        for ek, prefix in gone:
            last_pages.update(self.model[(ek, prefix)][-self.page:])
        assert last_pages == freed_set  # exactly whole pages, and every prefix through an evicted page went with it
        assert not (gone & protected)  # locked prefixes are never evicted
        for key in gone:
            del self.model[key]
        if n >= evictable_before:
            assert set(self.model) == protected

    @rule(ek=EXTRA_KEYS, toks=TOKENS)
    def lock(self, ek, toks) -> None:
        self.lock_match(ek, tuple(toks))

    @rule(ek=EXTRA_KEYS, toks=TOKENS, cut=st.integers(0, 12))
    def insert_then_lock_a_prefix(self, ek, toks, cut) -> None:
        """What a pool does: cache a finished sequence, later bind a prompt that shares part of it."""
        self.do_insert(ek, toks, 0, 0)
        self.lock_match(ek, tuple(toks[:cut]))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 50))
    def unlock(self, i) -> None:
        protected_before = len(self.protected_entries())
        node, _, _ = self.locks.pop(i % len(self.locks))

        delta = self.cache.dec_lock_ref(node)

        assert delta == (protected_before - len(self.protected_entries())) * self.page

    @rule(picks=st.lists(st.integers(0, 50), max_size=3, unique=True), ek=EXTRA_KEYS, toks=TOKENS)
    def plan_then_do(self, picks, ek, toks) -> None:
        toks = tuple(toks)
        chosen = sorted({p % len(self.locks) for p in picks}, reverse=True) if self.locks else []
        unlock_nodes = [self.locks[i][0] for i in chosen]
        segs = self.cache.peek_prefix(toks, extra_key=ek)
        snap = radix_snapshot(self.cache)

        predicted = self.cache.evictable_size_if(unlock_nodes, segs)

        assert radix_snapshot(self.cache) == snap
        assert sum(s.matched for s in segs) == self.longest(ek, toks)
        for i in chosen:
            node, _, _ = self.locks.pop(i)
            self.cache.dec_lock_ref(node)
        self.lock_match(ek, toks)
        assert self.cache.evictable_size == predicted

    # ---------------------------------------------------------------- invariants
    @invariant()
    def sizes_add_up(self) -> None:
        c = self.cache
        assert c.evictable_size + c.protected_size == c.total_size() == len(c)
        assert c.total_size() == len(self.model) * self.page
        assert c.protected_size == len(self.protected_entries()) * self.page
        assert c.evictable_size >= 0

    @invariant()
    def tree_matches_model(self) -> None:
        c = self.cache
        from_tree: dict[tuple[Hashable, tuple[int, ...]], tuple[int, ...]] = {}
        for node in c.nodes():
            assert not node.evicted
            assert len(node.key) > 0 and len(node.key) % self.page == 0
            assert len(node.value) == len(node.key)
            toks, slots = [], []
            n = node
            while n is not c.root:
                toks[:0] = n.key.tolist()
                slots[:0] = n.value.tolist()
                assert n.extra_key == node.extra_key
                n = n.parent
            start = len(toks) - len(node.key)
            for end in range(start + self.page, len(toks) + 1, self.page):
                from_tree[(node.extra_key, tuple(toks[:end]))] = tuple(slots[:end])
            # lock_ref == number of held locks whose path runs through this node
            holders = sum(1 for _, ek, prefix in self.locks
                          if ek == node.extra_key and len(prefix) >= len(toks) and prefix[: len(toks)] == tuple(toks))
            assert node.lock_ref == holders
        assert from_tree == self.model
        assert c.root.lock_ref == 1


@pytest.mark.parametrize("page", [1, 2, 4])
def test_given_random_operations_when_compared_with_brute_force_model_then_always_agree(page) -> None:
    # Given: a machine bound to this page size
    machine = type(f"RadixModelMachinePage{page}", (RadixModelMachine,), {"PAGE": page})

    # When / Then: every step is checked against the model
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=100, stateful_step_count=50, deadline=None, database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]),
    )
