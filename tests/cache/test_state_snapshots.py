"""Prefix snapshots of a StatePool attached to a KvCachePool: a prefix match ends only at a tree node holding the
state after its tokens, a hit restores exactly that state, a snapshot is handed to the node its length ends at (not
to any other), the store is bounded (least recently used snapshots go first) and dies with its node, an
uncommitted snapshot is never used, and check_invariants audits all of it."""

from __future__ import annotations

import pytest
import torch

from smile_llm.cache import KvCacheCorruptionError, KvCachePool, StatePool, StateSpec

PS = 4
SPECS = {"conv": StateSpec((2, 3), torch.float32), "recurrent": StateSpec((2, 2, 2), torch.float32)}
PROMPT = list(range(1, 15))  # 14 tokens: 3 whole pages


def attached(snapshots: int = 4, slots: int = 3, pages: int = 32) -> tuple[KvCachePool, StatePool]:
    pool = KvCachePool(2, pages * PS, 1, 8, PS)
    states = StatePool(SPECS, slots, snapshots=snapshots)
    pool.attach_state(states)
    return pool, states


def fill(states: StatePool, rid: int, value: float) -> None:
    for buf in states.buffers.values():
        buf[states.slot(rid)] = value


def state_of(states: StatePool, rid: int) -> float:
    """The one value every element of ``rid``'s state holds (asserts they agree)."""
    values = torch.cat([buf[states.slot(rid)].reshape(-1) for buf in states.buffers.values()]).unique()
    assert len(values) == 1, values
    return float(values[0])


def serve(pool: KvCachePool, states: StatePool, tokens: list[int], snapshot_at: dict[int, float],
          finish: bool = True) -> int:
    """Bind ``tokens``, write their KV, take a snapshot (state value v) at each length in ``snapshot_at`` (in
    order, as a forward crossing page boundaries does) and finish into the tree."""
    rid = pool.bind_request(tokens, len(tokens) + PS)
    pool.activate_step(rid)
    start = pool.kv_len(rid)
    k = torch.zeros(1, len(tokens) - start, 1, 8)
    for layer in range(2):
        pool.put(layer, start, k, k)
    for length, value in snapshot_at.items():
        fill(states, rid, value)
        assert states.snapshot(rid, length)
    if finish:
        pool.finish_request(rid, tokens)
    pool.check_invariants()
    return rid


def test_a_match_ends_at_the_deepest_snapshot_and_restores_it():
    pool, states = attached()
    serve(pool, states, PROMPT, {8: 8.0, 12: 12.0})  # 12 = floor_page(14): the finished node's end
    assert pool.radix.total_size() == 12 and states.snapshots.cached_count == 1
    rid = pool.bind_request(PROMPT + [99], 32)
    assert pool.matched_prefix_len(rid) == 12 and state_of(states, rid) == 12.0
    assert pool.stats()["state_snapshots"] == 1 and pool.stats()["state_snapshot_capacity"] == 4
    pool.check_invariants()


def test_a_node_without_a_snapshot_is_a_miss_and_a_shorter_snapshot_still_hits():
    pool, states = attached()
    serve(pool, states, PROMPT, {8: 8.0})  # finished at 12: the snapshot at 8 was superseded by nothing, unused
    assert pool.radix.total_size() == 12 and states.snapshots.cached_count == 0
    rid = pool.bind_request(PROMPT, 32)
    assert pool.matched_prefix_len(rid) == 0 and state_of(states, rid) == 0.0
    assert pool.peek_prefix_slots(PROMPT).tolist() == []
    pool.unbind_request(rid)
    # cache_prefix at 8 (a prefilled prompt) adopts a snapshot there; a later finish at 12 adopts another
    rid = pool.bind_request(PROMPT[:9], 16)
    pool.activate_step(rid)
    assert pool.matched_prefix_len(rid) == 0
    fill(states, rid, 8.5)
    assert states.snapshot(rid, 8)
    pool.put(0, 0, torch.zeros(1, 9, 1, 8), torch.zeros(1, 9, 1, 8))
    pool.put(1, 0, torch.zeros(1, 9, 1, 8), torch.zeros(1, 9, 1, 8))
    pool.cache_prefix(rid, PROMPT[:9])
    assert states.snapshots.cached_count == 1
    pool.finish_request(rid, PROMPT[:9])
    hit = pool.bind_request(PROMPT + [5], 32)
    assert pool.matched_prefix_len(hit) == 8 and state_of(states, hit) == 8.5  # the split node at 8 has it
    assert len(pool.peek_prefix_slots(PROMPT)) == 8
    pool.check_invariants()


def test_a_snapshot_of_another_length_is_never_adopted_and_is_freed_with_its_request():
    pool, states = attached(snapshots=2)
    rid = serve(pool, states, PROMPT, {4: 4.0}, finish=False)
    assert states.snapshots.pending_length(rid) == 4 and states.snapshots.free_count == 1
    pool.finish_request(rid, PROMPT)  # inserts 12 tokens: the snapshot at 4 belongs to no node
    assert states.snapshots.cached_count == 0 and states.snapshots.free_count == 2
    pool.check_invariants()


def test_a_staged_snapshot_is_used_only_once_committed():
    pool, states = attached()
    rid = serve(pool, states, PROMPT, {}, finish=False)
    slot = states.stage_snapshot(rid, 12)  # a forward that raised: never committed
    assert slot is not None
    states.snapshots.buffers["conv"][slot] = 12.0
    pool.finish_request(rid, PROMPT)
    assert states.snapshots.cached_count == 0 and states.snapshots.free_count == 4
    assert pool.matched_prefix_len(pool.bind_request(PROMPT, 32)) == 0


def test_the_store_is_bounded_and_evicts_the_least_recently_used_snapshot():
    pool, states = attached(snapshots=2)
    a, b, c = PROMPT, [50 + t for t in PROMPT], [80 + t for t in PROMPT]
    serve(pool, states, a, {12: 1.0})
    serve(pool, states, b, {12: 2.0})
    pool.unbind_request(pool.bind_request(a + [1], 32))  # touches a's node: b's snapshot is now the oldest
    serve(pool, states, c, {12: 3.0})  # needs a slot: b's snapshot goes, b's KV stays cached
    assert states.snapshots.cached_count == 2 and pool.radix.total_size() == 36
    hits = {}
    for name, tokens in (("a", a), ("b", b), ("c", c)):
        rid = pool.bind_request(tokens + [1], 32)
        hits[name] = (pool.matched_prefix_len(rid), state_of(states, rid))
        pool.unbind_request(rid)
    assert hits == {"a": (12, 1.0), "b": (0, 0.0), "c": (12, 3.0)}
    pool.check_invariants()


def test_evicting_a_node_drops_its_snapshot():
    pool, states = attached()
    serve(pool, states, PROMPT, {12: 12.0})
    assert pool.evict(100) == 12
    assert states.snapshots.cached_count == 0 and states.snapshots.free_count == 4
    pool.check_invariants()
    assert pool.matched_prefix_len(pool.bind_request(PROMPT, 32)) == 0


def test_no_snapshot_slot_means_the_snapshot_is_skipped():
    pool, states = attached(snapshots=1)
    r1 = serve(pool, states, PROMPT, {12: 1.0}, finish=False)
    r2 = pool.bind_request([7] * 9, 16)
    assert states.stage_snapshot(r2, 8) is None  # the only slot is r1's pending snapshot
    assert not states.snapshot(r2, 8)
    pool.finish_request(r1, PROMPT)
    assert states.snapshot(r2, 8)  # r1's snapshot is a node's now: the least recently used, it makes room
    assert states.snapshots.cached_count == 0
    pool.check_invariants()


def test_without_snapshots_every_bind_misses():
    pool, states = attached(snapshots=0)
    rid = serve(pool, states, PROMPT, {}, finish=False)
    assert not states.snapshot(rid, 12)
    pool.finish_request(rid, PROMPT)
    assert pool.radix.total_size() == 12
    assert pool.matched_prefix_len(pool.bind_request(PROMPT, 32)) == 0


def test_bad_snapshot_calls_and_corruption_are_named():
    pool, states = attached()
    with pytest.raises(ValueError, match="holds no state slot"):
        states.stage_snapshot(99, 4)
    rid = serve(pool, states, PROMPT, {}, finish=False)
    with pytest.raises(ValueError, match="length"):
        states.stage_snapshot(rid, 0)
    states.snapshot(rid, 12)
    states.snapshots._free.append(0)  # a slot both pending and free
    with pytest.raises(KvCacheCorruptionError, match="lost or held twice"):
        pool.check_invariants()
    with pytest.raises(ValueError, match="snapshots"):
        StatePool(SPECS, 1, snapshots=-1)
