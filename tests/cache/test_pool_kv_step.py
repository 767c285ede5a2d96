"""``KvCachePool.kv_step``: one validated KV write handle per forward, and ``put`` over the same machinery.

The handle is validated once (rows, capacity, matched prefix, write index), each layer writes through it with a
plain index copy, and ``commit`` records the write in ``kv_len`` exactly once, only when the forward succeeded.
Every case asserts the stored values, ``kv_len`` and ``check_invariants()`` after each operation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCacheExhaustedError, KvCachePool, NoActiveStepError, PoolClosedError

from .snapshot import expect_unchanged

PS = 4


def make_pool(num_slots: int = 64, layers: int = 2, **kw) -> KvCachePool:
    pool = KvCachePool(layers, num_slots, 1, 2, PS, **kw)
    pool.prefix_reuse_enabled = False
    return pool


def full(b: int, s: int, value: float) -> torch.Tensor:
    return torch.full((b, s, 1, 2), value)


def ramp(b: int, s: int, offset: float) -> torch.Tensor:
    """Row r, position j holds ``offset + 100 r + j`` (so every slot is told apart)."""
    vals = offset + 100.0 * torch.arange(b)[:, None] + torch.arange(s)[None, :]
    return vals[:, :, None, None].expand(b, s, 1, 2).contiguous()


def kv_lens(pool: KvCachePool, ids: list[int]) -> list[int]:
    return [pool.kv_len(i) for i in ids]


def test_a_forward_writes_every_layer_and_commits_kv_len_once() -> None:
    pool = make_pool()
    ids = pool.bind_requests(2, 16)
    kv = pool.kv_step(0, 5)
    assert kv.batch == 2 and kv.seqlen == 5 and kv.start.tolist() == [0, 0] and kv.records and not kv.committed
    assert kv.index.tolist() == pool.window_slot_indices(0, 5).tolist()
    for layer in range(2):
        kv.write(layer, ramp(2, 5, 10.0 * layer), ramp(2, 5, -10.0 * layer))
        assert kv_lens(pool, ids) == [0, 0]  # nothing is recorded before the commit
    pool.check_invariants()
    kv.commit()
    assert kv.committed and kv_lens(pool, ids) == [5, 5]
    pool.check_invariants()
    for layer in range(2):
        k, v = pool.get(layer, 5)
        assert torch.equal(k, ramp(2, 5, 10.0 * layer)) and torch.equal(v, ramp(2, 5, -10.0 * layer))
    kv.commit()  # idempotent
    assert kv_lens(pool, ids) == [5, 5]
    pool.check_invariants()


def test_a_forward_that_raises_never_advances_kv_len() -> None:
    pool = make_pool()
    ids = pool.bind_requests(1, 16)
    pool.put(0, 0, full(1, 3, 1.0), full(1, 3, 1.0))
    assert kv_lens(pool, ids) == [3]
    kv = pool.kv_step(3, 2)
    kv.write(0, full(1, 2, 7.0), full(1, 2, 7.0))
    del kv  # the forward raised before its commit
    assert kv_lens(pool, ids) == [3]
    pool.check_invariants()
    assert pool.get(0, 5)[0][0, :, 0, 0].tolist() == [1.0, 1.0, 1.0, 7.0, 7.0]  # written, but not counted
    pool.finish_exclusive([1, 2, 3, 4, 5])  # only counted KV may be cached: floor_page(min(5, 3)) = 0
    assert pool.radix.total_size() == 0
    pool.check_invariants()


def test_kv_len_rules_match_put_gap_and_overlap() -> None:
    pool = make_pool()
    ids = pool.bind_requests(1, 16)
    gap = pool.kv_step(4, 2)  # starts past kv_len = 0: a gap moves nothing
    gap.write(0, full(1, 2, 1.0), full(1, 2, 1.0))
    gap.commit()
    assert kv_lens(pool, ids) == [0]
    first = pool.kv_step(0, 4)
    first.write(0, full(1, 4, 2.0), full(1, 4, 2.0))
    first.commit()
    assert kv_lens(pool, ids) == [4]
    back = pool.kv_step(1, 2)  # inside the written prefix: kv_len = max(4, 3)
    back.write(0, full(1, 2, 3.0), full(1, 2, 3.0))
    back.commit()
    assert kv_lens(pool, ids) == [4]
    pool.check_invariants()
    assert pool.get(0, 6)[0][0, :, 0, 0].tolist() == [2.0, 3.0, 3.0, 2.0, 1.0, 1.0]


def test_ragged_starts_write_each_row_window() -> None:
    pool = make_pool()
    ids = [pool.bind_request([1], 16), pool.bind_request([2], 16)]
    pool.activate_step(*ids)
    pool.put(0, [0, 0], full(2, 6, 0.0), full(2, 6, 0.0))
    pool.seal_length([3, 6])
    assert kv_lens(pool, ids) == [3, 6]
    kv = pool.kv_step(np.array([3, 6]), 2)
    assert kv.start.tolist() == [3, 6]
    assert kv.index.tolist() == pool.window_slot_indices([3, 6], 2).tolist()
    kv.write(0, ramp(2, 2, 50.0), ramp(2, 2, 60.0))
    kv.commit()
    assert kv_lens(pool, ids) == [5, 8]
    pool.check_invariants()
    k, v = pool.get(0, 8)
    assert k[0, 3:5, 0, 0].tolist() == [50.0, 51.0] and k[1, 6:8, 0, 0].tolist() == [150.0, 151.0]
    assert v[1, 6:8, 0, 1].tolist() == [160.0, 161.0] and k[0, 5:, 0, 0].tolist() == [0.0, 0.0, 0.0]


def test_kv_step_is_validated_once_and_raising_changes_nothing() -> None:
    pool = make_pool(fresh_page_fill="poison")
    pool.prefix_reuse_enabled = True
    prompt = list(range(1, 10))
    pool.bind_with_prefix(prompt, 12)
    pool.put(0, 0, full(1, 9, 1.0), full(1, 9, 1.0))
    pool.finish_exclusive(prompt)
    assert pool.bind_with_prefix(prompt + [10], 16) == 8
    pool.check_invariants()
    expect_unchanged(pool, KvCacheExhaustedError, pool.kv_step, 15, 2, match="capacity=16")
    expect_unchanged(pool, ValueError, pool.kv_step, 7, 1, match="below its matched prefix")
    expect_unchanged(pool, ValueError, pool.kv_step, -1, 1)
    expect_unchanged(pool, ValueError, pool.kv_step, [8, 8], 1, match="1 rows")
    expect_unchanged(pool, ValueError, pool.kv_step, 8, 1.5)
    good = torch.from_numpy(pool.window_slot_indices(8, 2))
    for bad in (good.to(torch.int32), good[:1], good.tolist(), good.to("meta"), good.flip(0)):
        expect_unchanged(pool, ValueError, pool.kv_step, 8, 2, index=bad)
    kv = pool.kv_step(8, 2, index=good.clone())  # a caller's precomputed index equal to the window's is taken
    kv.write(1, full(1, 2, 4.0), full(1, 2, 5.0))
    kv.commit()
    assert pool.kv_len(pool.active_request_ids[0]) == 10
    assert pool.get(1, 10)[1][0, 8:, 0, 0].tolist() == [5.0, 5.0]
    pool.check_invariants()
    pool.unbind_requests()
    expect_unchanged(pool, NoActiveStepError, pool.kv_step, 0, 1)


def test_commit_after_the_step_changed_raises_and_records_nothing() -> None:
    pool = make_pool()
    ids = [pool.bind_request([1], 16), pool.bind_request([2], 16)]
    pool.activate_step(ids[0])
    kv = pool.kv_step(0, 2)
    kv.write(0, full(1, 2, 1.0), full(1, 2, 1.0))
    pool.activate_step(ids[1])
    with pytest.raises(RuntimeError, match="active step changed"):
        kv.commit()
    assert kv_lens(pool, ids) == [0, 0] and not kv.committed
    pool.check_invariants()
    kv2 = pool.kv_step(0, 1)
    pool.close()
    with pytest.raises(PoolClosedError):
        kv2.commit()


def test_views_and_scales_of_the_handle() -> None:
    pool = make_pool(dtype=torch.float8_e4m3fn, k_scale=2.0, v_scale=0.5)
    ids = pool.bind_requests(1, 8)
    kv = pool.kv_step(0, 2)
    assert (kv.k_scale, kv.v_scale) == (2.0, 0.5)
    kv.write(1, full(1, 2, 4.0), full(1, 2, 4.0))
    kv.commit()
    assert kv_lens(pool, ids) == [2]
    pages_k, pages_v = kv.key_pages(1), kv.value_pages(1)
    assert pages_k.shape == (16, PS, 1, 2) and pages_k.dtype == torch.float8_e4m3fn
    assert pages_k.data_ptr() == pool.key_layer(1).data_ptr() and pages_v.data_ptr() == pool.value_layer(1).data_ptr()
    slot = int(pool.window_slot_indices(0, 1)[0])
    assert pages_k.view(-1, 1, 2)[slot].float().tolist() == [[2.0, 2.0]]  # stored x / k_scale
    assert pages_v.view(-1, 1, 2)[slot].float().tolist() == [[8.0, 8.0]]  # stored x / v_scale
    k, v = pool.get(1, 2)
    assert k.flatten().tolist() == [4.0] * 4 and v.flatten().tolist() == [4.0] * 4
    pool.check_invariants()


def test_a_prepared_decode_index_is_written_through_and_prepare_counted_the_write() -> None:
    pool = make_pool(128)
    ids = [pool.bind_request([1], 32), pool.bind_request([2], 32)]
    pool.activate_step(*ids)
    pool.put(0, 0, full(2, 9, 1.0), full(2, 9, 1.0))
    expect_unchanged(pool, RuntimeError, pool.decode_graph_index, 2, match="prepare_decode_graph_step")
    pool.prepare_decode_graph_step(10, 9)
    assert kv_lens(pool, ids) == [10, 10]  # the prepare counts as the write
    index = pool.decode_graph_index(2)
    assert index.tolist() == pool.window_slot_indices(9, 1).tolist()
    expect_unchanged(pool, RuntimeError, pool.decode_graph_index, 1)
    expect_unchanged(pool, ValueError, pool.kv_step, 8, 1, index=index, match="prepared for positions")
    kv = pool.kv_step(9, 1, index=index)
    assert kv.index is index and kv.records
    for layer in range(2):
        kv.write(layer, ramp(2, 1, 30.0), ramp(2, 1, 40.0))
    kv.commit()
    assert kv_lens(pool, ids) == [10, 10]
    pool.check_invariants()
    k, v = pool.get(1, 10)
    assert k[:, 9, 0, 0].tolist() == [30.0, 130.0] and v[:, 9, 0, 0].tolist() == [40.0, 140.0]
    pool.activate_step(ids[0])  # another step: the prepared index no longer applies
    expect_unchanged(pool, RuntimeError, pool.decode_graph_index, 1)
    expect_unchanged(pool, RuntimeError, pool.kv_step, 9, 1, index=index, match="prepare_decode_graph_step")


def test_a_prefetch_scratch_index_writes_only_scratch_and_records_nothing() -> None:
    pool = make_pool(256)
    ids = [pool.bind_request([1], 64), pool.bind_request([2], 64)]
    pool.activate_step(*ids)
    pool.put(0, 0, full(2, 6, 1.0), full(2, 6, 1.0))
    pool.begin_prefetch_decode_graph_step(9, 8, 2)
    kv_before = kv_lens(pool, ids)
    before = pool.key_cache.clone()
    kv = pool.kv_step(8, 1, index=pool.decode_graph_index(2))
    assert not kv.records
    kv.write(0, full(2, 1, 99.0), full(2, 1, 99.0))
    kv.commit()
    assert kv_lens(pool, ids) == kv_before == [6, 6]
    changed = set((pool.key_cache != before).any(dim=-1).any(dim=-1)[0].nonzero().flatten().tolist())
    scratch = set((pool._graphs.prefetch.scratch_pages[:, None] * PS + np.arange(PS)).reshape(-1).tolist())
    assert changed and changed <= scratch and not changed & set(pool.slot_indices(64).tolist())
    pool.check_invariants()
    pool.end_prefetch_decode_graph_step()
    pool.check_invariants()


def test_a_prepared_verify_index_writes_the_same_slots_as_a_fresh_index() -> None:
    pool = make_pool(128)
    ids = [pool.bind_request([1], 32), pool.bind_request([2], 32)]
    pool.activate_step(*ids)
    pool.put(0, 0, full(2, 5, 0.0), full(2, 5, 0.0))
    pool.seal_length([4, 5])
    pool.prepare_verify_graph_step([7, 8], [4, 5], 3)
    assert kv_lens(pool, ids) == [7, 8]
    expect_unchanged(pool, RuntimeError, pool.verify_graph_index, 2, 2)
    index = pool.verify_graph_index(2, 3)
    assert index.tolist() == pool.window_slot_indices([4, 5], 3).tolist()
    expect_unchanged(pool, RuntimeError, pool.kv_step, [4, 5], 2, index=index, match="not prepared")
    expect_unchanged(pool, ValueError, pool.kv_step, [4, 4], 3, index=index, match="prepared at")
    kv = pool.kv_step(np.array([4, 5]), 3, index=index)
    kv.write(0, ramp(2, 3, 10.0), ramp(2, 3, 20.0))
    kv.commit()
    assert kv_lens(pool, ids) == [7, 8]
    pool.check_invariants()
    k, _ = pool.get(0, 8)
    assert k[0, 4:7, 0, 0].tolist() == [10.0, 11.0, 12.0] and k[1, 5:8, 0, 0].tolist() == [110.0, 111.0, 112.0]


def test_put_is_the_same_write_and_record_as_a_committed_handle() -> None:
    pools = [make_pool(), make_pool()]
    ids = [p.bind_requests(2, 16) for p in pools]
    for start, s in ((0, 3), (3, 2), (7, 1), (5, 2)):  # contiguous, then a gap, then closing it
        k, v = ramp(2, s, float(start)), ramp(2, s, -float(start))
        pools[0].put(1, start, k, v)
        kv = pools[1].kv_step(start, s)
        kv.write(1, k, v)
        kv.commit()
        assert kv_lens(pools[0], ids[0]) == kv_lens(pools[1], ids[1])
        for p in pools:
            p.check_invariants()
    assert kv_lens(pools[0], ids[0]) == [7, 7]  # the gap write at 7 was never counted; closing the gap reaches 7
    assert torch.equal(pools[0].key_cache, pools[1].key_cache)
    assert torch.equal(pools[0].value_cache, pools[1].value_cache)
