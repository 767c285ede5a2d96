"""Slot ids of a step's windows against a per-position brute force over the rows' page tables."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from smile_llm.cache import KvCachePool


def brute_force(pool: KvCachePool, starts: list[int], length: int, clamp: bool) -> list[int]:
    out = []
    for rid, start in zip(pool._step.ids, starts):
        b = pool._table.get(rid)
        for p in range(start, start + length):
            p = min(p, b.capacity - 1) if clamp else p
            out.append(int(b.page_ids[p // pool.page_size]) * pool.page_size + p % pool.page_size)
    return out


@settings(max_examples=80, deadline=None)
@given(page_size=st.sampled_from([1, 2, 4, 16]), caps=st.lists(st.integers(1, 40), min_size=1, max_size=5),
       churn=st.integers(0, 6), data=st.data())
def test_window_slots_match_brute_force(page_size: int, caps: list[int], churn: int, data: st.DataObject) -> None:
    pool = KvCachePool(1, page_size * 256, 1, 1, page_size)
    pool.prefix_reuse_enabled = False
    filler = [pool.bind_request([1], page_size) for _ in range(churn)]  # scatter the free list
    for rid in filler[::2]:
        pool.unbind_request(rid)
    ids = [pool.bind_request([1], c) for c in caps]
    pool.activate_step(*ids)
    capacity = [pool._table.get(i).capacity for i in ids]
    length = data.draw(st.integers(0, min(capacity)))
    uniform = data.draw(st.integers(0, min(capacity) - length))
    assert pool.window_slot_indices(uniform, length).tolist() == brute_force(pool, [uniform] * len(ids), length, False)
    ragged = [data.draw(st.integers(0, c - length)) for c in capacity]
    assert pool.window_slot_indices(ragged, length).tolist() == brute_force(pool, ragged, length, False)
    assert pool.slot_indices(length).tolist() == brute_force(pool, [0] * len(ids), length, False)
    padded = data.draw(st.integers(0, max(capacity)))
    got = pool._step.slots(0, padded, clamp=True).tolist()
    assert got == brute_force(pool, [0] * len(ids), padded, True)
    assert isinstance(pool.slot_indices(length), np.ndarray)
