"""StatePool alone and attached to a KvCachePool: slots are bound, released, offloaded and restored with the
request's KV by the pool's own verbs, a bind that finds no slot is refused like one that finds no pages (nothing
changes), and check_invariants audits the slots."""

from __future__ import annotations

import pytest
import torch

from smile_llm.cache import KvCacheCorruptionError, KvCacheExhaustedError, KvCachePool, StatePool, StateSpec

from .snapshot import assert_same_state, pool_snapshot

SPECS = {"conv": StateSpec((2, 6, 3), torch.float32), "recurrent": StateSpec((2, 4, 5, 5), torch.bfloat16)}


def mark(states: StatePool, rid: int) -> None:
    for buf in states.buffers.values():
        buf[states.slot(rid)] = float(rid)


def marked(states: StatePool, rid: int) -> bool:
    return all(bool((buf[states.slot(rid)] == float(rid)).all()) for buf in states.buffers.values())


def attached(slots: int = 2, pages: int = 16) -> tuple[KvCachePool, StatePool]:
    pool = KvCachePool(2, pages * 4, 1, 8, 4)
    states = StatePool(SPECS, slots)
    pool.attach_state(states)
    return pool, states


def test_sizes_and_zeroed_slots_in_order():
    states = StatePool(SPECS, 3)
    assert states.buffers["conv"].shape == (3, 2, 6, 3) and states.buffers["recurrent"].dtype == torch.bfloat16
    assert states.bytes_per_request == 2 * 6 * 3 * 4 + 2 * 4 * 5 * 5 * 2
    states.buffers["conv"].fill_(7.0)
    states.bind(10)
    states.bind(11)
    assert (states.slot(10), states.slot(11)) == (0, 1) and states.free_slots == 1
    assert torch.count_nonzero(states.buffers["conv"][0]) == 0  # a bound slot starts from the empty state
    assert bool((states.buffers["conv"][2] == 7.0).all())  # an unbound slot is left alone
    assert states.slots([11, 10]).tolist() == [1, 0]
    states.release(10)
    states.release(10)  # unknown ids do nothing
    states.bind(12)
    assert states.slot(12) == 0 and states.bound_ids == {11, 12}
    with pytest.raises(ValueError, match="request 10 holds no state slot"):
        states.slot(10)


def test_offload_and_restore_are_byte_identical_in_another_slot():
    states = StatePool(SPECS, 2)
    states.bind(1)
    for buf in states.buffers.values():
        buf[0].copy_(torch.randn(buf.shape[1:]).to(buf.dtype))
    before = {n: b[0].clone() for n, b in states.buffers.items()}
    states.offload(1)
    states.bind(2)  # takes slot 0
    states.restore(1)
    assert states.slot(1) == 1
    for name, buf in states.buffers.items():
        assert torch.equal(buf[1], before[name])


@pytest.mark.parametrize("specs, match", [({}, "at least one"), ({"x": StateSpec((0,))}, "positive"),
                                          ({"x": StateSpec((2,), torch.int64)}, "dtype")])
def test_bad_specs_are_refused(specs, match):
    with pytest.raises(ValueError, match=match):
        StatePool(specs, 2)


def test_bind_verbs_take_and_release_slots_with_the_kv():
    pool, states = attached(slots=2)
    a = pool.bind_request([1, 2, 3, 4, 5], 8)
    b = pool.bind_request([9, 8, 7], 8)
    assert states.bound_ids == {a, b} and states.free_slots == 0
    mark(states, a)
    mark(states, b)
    pool.finish_request(a, [1, 2, 3, 4, 5, 6])
    assert states.bound_ids == {b} and marked(states, b)
    pool.unbind_request(b)
    assert states.bound_ids == frozenset() and states.free_slots == 2
    ids = pool.bind_requests(2, 8)
    assert states.bound_ids == set(ids)
    pool.bind_with_prefix([1, 2, 3], 8)  # exclusive: releases the batch, binds one
    assert len(states.bound_ids) == 1
    pool.unbind_requests()
    assert states.free_slots == 2
    pool.check_invariants()


def test_no_free_slot_refuses_the_bind_and_changes_nothing():
    pool, states = attached(slots=1)
    a = pool.bind_request([1, 2, 3], 8)
    mark(states, a)
    before = pool_snapshot(pool)
    with pytest.raises(KvCacheExhaustedError, match=r"bind_request needs 1 state slot\(s\) but only 0 of 1 are free"):
        pool.bind_request([4, 5, 6], 8)  # pages are free; the state slot is not
    with pytest.raises(KvCacheExhaustedError, match="bind_requests needs 2 state slot"):
        pool.bind_requests(2, 4)  # releasing everything still leaves one slot for two rows
    assert_same_state(before, pool_snapshot(pool))
    assert marked(states, a)
    pool.check_invariants()


def test_offloaded_request_frees_its_slot_and_restores_it_when_one_is_free():
    pool, states = attached(slots=1)
    a = pool.bind_request([1, 2, 3], 8)
    mark(states, a)
    handle = pool.offload_request(a)
    assert states.free_slots == 1 and states.bound_ids == frozenset()
    b = pool.bind_request([4, 5, 6], 8)  # the freed slot serves another request meanwhile
    before = pool_snapshot(pool)
    with pytest.raises(KvCacheExhaustedError, match=f"restore of request {a} needs 1 state slot"):
        pool.restore_request(a, handle)
    assert_same_state(before, pool_snapshot(pool))
    pool.check_invariants()
    pool.unbind_request(b)
    pool.restore_request(a, handle)
    assert marked(states, a)
    pool.check_invariants()
    pool.unbind_request(a)  # an offloaded-then-restored request releases normally
    assert states.free_slots == 1


def test_releasing_an_offloaded_request_drops_its_host_copy():
    pool, states = attached(slots=1)
    a = pool.bind_request([1, 2, 3], 8)
    pool.offload_request(a)
    pool.unbind_request(a)
    pool.check_invariants()
    assert states._offloaded == {}


def test_check_invariants_catches_a_slot_that_disagrees_with_the_bindings():
    pool, states = attached(slots=2)
    a = pool.bind_request([1, 2, 3], 8)
    states.release(a)  # behind the pool's back
    with pytest.raises(KvCacheCorruptionError, match=rf"state slots are held by requests \[\] but the KV pool's "
                                                     rf"resident requests are \[{a}\]"):
        pool.check_invariants()
    states._slot_of[a] = 0
    states._free.append(0)  # slot 0 both held and free
    with pytest.raises(KvCacheCorruptionError, match="lost or claimed twice"):
        pool.check_invariants()


def test_attach_rules():
    pool = KvCachePool(1, 16, 1, 4, 4)
    states = StatePool(SPECS, 1)
    pool.attach_state(states)
    with pytest.raises(ValueError, match="already attached"):
        pool.attach_state(states)
    with pytest.raises(ValueError, match="must be a StatePool"):
        pool.attach_state("states")  # type: ignore[arg-type]
    pool.bind_request([1, 2], 4)
    with pytest.raises(RuntimeError, match="attach before binding"):
        pool.attach_state(StatePool(SPECS, 1))
    assert pool.state_pools == (states,)
    pool.close()
    assert states.free_slots == 1  # closing the pool released every slot
