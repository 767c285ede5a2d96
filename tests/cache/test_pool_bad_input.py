"""Bad input for every public pool method: a typed error with a helpful message, and nothing changed.

Each case runs against a pool holding a bit of everything (cached tree pages, a locked prefix, an active binding
with written KV, caller-owned pages) and checks, through ``expect_unchanged``, that the error left the pages,
bindings, tree (mapping, locks, LRU times), counters and K/V bytes exactly as they were.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.cache import (
    KvCacheExhaustedError,
    KvCachePool,
    NoActiveStepError,
    PoolClosedError,
    RequestOffloadedError,
)

from .snapshot import expect_unchanged

PS = 4


@pytest.fixture
def pool() -> KvCachePool:
    pool = KvCachePool(2, 64, 1, 2, PS, fresh_page_fill="poison")  # 16 pages
    prompt = list(range(1, 10))
    pool.bind_with_prefix(prompt, 12)
    for layer in range(2):
        pool.put(layer, 0, torch.ones(1, 9, 1, 2), torch.ones(1, 9, 1, 2))
    pool.finish_exclusive(prompt)  # tree: 8 tokens (2 pages)
    rid = pool.bind_request(prompt + [10, 11], 16)  # matches 8, 2 private pages
    pool.put(0, 8, torch.full((1, 3, 1, 2), 2.0), torch.full((1, 3, 1, 2), 2.0))
    pool.alloc(8)  # 2 caller pages
    pool.test_rid = rid  # type: ignore[attr-defined]
    pool.check_invariants()
    return pool


def kv(b: int, s: int, **kw) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(b, s, 1, 2, **kw), torch.zeros(b, s, 1, 2, **kw)


BAD_TOKENS = [None, [1.5, 2.0], [True, False], ["a"], [[1, 2]], [-1, 2], np.array([1.0]), "abc"]
BAD_COUNTS = [0, -1, 1.5, "8", None, True]


@pytest.mark.parametrize("prompt", BAD_TOKENS)
def test_bind_request_rejects_non_integer_tokens(pool: KvCachePool, prompt: object) -> None:
    expect_unchanged(pool, ValueError, pool.bind_request, prompt, 8)


@pytest.mark.parametrize("capacity", BAD_COUNTS)
def test_bind_verbs_reject_bad_capacity(pool: KvCachePool, capacity: object) -> None:
    expect_unchanged(pool, ValueError, pool.bind_request, [1, 2], capacity)
    expect_unchanged(pool, ValueError, pool.bind_with_prefix, [1, 2], capacity)
    expect_unchanged(pool, ValueError, pool.bind_requests, 1, capacity)
    expect_unchanged(pool, ValueError, pool.bind_requests, capacity, 8)


def test_prompt_longer_than_capacity(pool: KvCachePool) -> None:
    expect_unchanged(pool, ValueError, pool.bind_request, list(range(9)), 8, match="longer than total_capacity 8")
    expect_unchanged(pool, ValueError, pool.bind_with_prefix, list(range(9)), 8, match="longer than total_capacity")


def test_prompt_longer_than_the_pool(pool: KvCachePool) -> None:
    expect_unchanged(pool, KvCacheExhaustedError, pool.bind_request, list(range(100)), 128)
    # bind_with_prefix validates before releasing the other bindings: nothing is released.
    expect_unchanged(pool, ValueError, pool.bind_with_prefix, list(range(100)), 128, match="Prompt length 100")


def test_bind_requests_that_cannot_give_a_row_one_page(pool: KvCachePool) -> None:
    expect_unchanged(pool, KvCacheExhaustedError, pool.bind_requests, 100, 4, match="batch 100")


@pytest.mark.parametrize("seq", BAD_TOKENS[1:] + [[99, 98, 97, 96, 95, 94, 93, 92, 91], [1, 2, 3]])
def test_finish_request_rejects_bad_sequences(pool: KvCachePool, seq: object) -> None:
    expect_unchanged(pool, ValueError, pool.finish_request, pool.test_rid, seq)
    expect_unchanged(pool, ValueError, pool.finish_exclusive, seq)


def test_unknown_ids(pool: KvCachePool) -> None:
    for bad in (999, -1, 0, "1", 1.0):
        expect_unchanged(pool, ValueError, pool.activate_step, bad, match="Unknown request id")
        expect_unchanged(pool, ValueError, pool.kv_len, bad, match="Unknown request id")
        expect_unchanged(pool, ValueError, pool.offload_request, bad, match="Unknown request id")
        assert pool.matched_prefix_len(bad) == 0 and not pool.is_bound(bad)
    # Smile: finish and unbind of an unknown id do nothing.
    pool.unbind_request(999)
    pool.finish_request(999, [1, 2])
    pool.check_invariants()


def test_double_unbind_is_a_no_op(pool: KvCachePool) -> None:
    pool.unbind_request(pool.test_rid)
    free = pool.free_pages
    pool.unbind_request(pool.test_rid)
    assert pool.free_pages == free
    pool.check_invariants()


def test_activate_step_rejects_empty_duplicate_and_offloaded(pool: KvCachePool) -> None:
    rid = pool.test_rid
    expect_unchanged(pool, ValueError, pool.activate_step, match="at least one")
    expect_unchanged(pool, ValueError, pool.activate_step, rid, rid, match="duplicate")
    other = pool.bind_request([5], 4)
    pool.offload_request(other)
    expect_unchanged(pool, RequestOffloadedError, pool.activate_step, rid, other, match="restore_request")


@pytest.mark.parametrize("layer", [-1, 2, 1.0, None])
def test_layer_out_of_range(pool: KvCachePool, layer: object) -> None:
    expect_unchanged(pool, ValueError, pool.put, layer, 11, *kv(1, 1))
    expect_unchanged(pool, ValueError, pool.get, layer, 1)
    expect_unchanged(pool, ValueError, pool.key_layer, layer)
    expect_unchanged(pool, ValueError, pool.value_layer, layer)
    expect_unchanged(pool, ValueError, pool.read_page, layer, 0)


@pytest.mark.parametrize(
    "k, v",
    [
        kv(1, 1, dtype=torch.int32),
        (torch.zeros(1, 1, 1, 2), torch.zeros(1, 1, 1, 3)),
        (torch.zeros(2, 1, 1, 2), torch.zeros(2, 1, 1, 2)),
        (torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2)),
        (torch.zeros(1, 2), torch.zeros(1, 2)),
        (np.zeros((1, 1, 1, 2)), np.zeros((1, 1, 1, 2))),
        kv(1, 1, device="meta"),
    ],
)
def test_put_rejects_wrong_shapes_dtypes_and_devices(pool: KvCachePool, k: object, v: object) -> None:
    expect_unchanged(pool, ValueError, pool.put, 0, 11, k, v)


def test_put_positions(pool: KvCachePool) -> None:
    expect_unchanged(pool, KvCacheExhaustedError, pool.put, 0, 16, *kv(1, 1), match="capacity=16")
    expect_unchanged(pool, KvCacheExhaustedError, pool.put, 0, 12, *kv(1, 5))
    expect_unchanged(pool, ValueError, pool.put, 0, 7, *kv(1, 1), match="below its matched prefix")
    expect_unchanged(pool, ValueError, pool.put, 0, -1, *kv(1, 1))
    expect_unchanged(pool, ValueError, pool.put, 0, [11, 11], *kv(1, 1), match="1 rows")
    expect_unchanged(pool, ValueError, pool.put, 0, 1.5, *kv(1, 1))


def test_put_and_get_padded_reject_bad_precomputed_indices(pool: KvCachePool) -> None:
    good = torch.from_numpy(pool.window_slot_indices(11, 1))
    for bad in (good.to(torch.int32), good.repeat(2), good.tolist(), good.to("meta")):
        expect_unchanged(pool, ValueError, pool.put, 0, 11, *kv(1, 1), slot_idx=bad)
        expect_unchanged(pool, ValueError, pool.get_padded, 0, 1, bad.repeat(2) if hasattr(bad, "repeat") else bad)


def test_get_padded_rejects_an_index_of_other_slots(pool: KvCachePool) -> None:
    own = torch.from_numpy(pool.window_slot_indices(0, 4))
    for bad in (own + 64, own - own - 1, torch.full_like(own, 63), own.flip(0)):  # past the pool, or not this read's
        expect_unchanged(pool, ValueError, pool.get_padded, 0, 4, bad, match="idx is not the slot index")
    k, v = pool.get_padded(0, 4, own)  # the read's own slots are taken
    assert torch.equal(k, pool.get(0, 4)[0]) and torch.equal(v, pool.get(0, 4)[1])
    pool.check_invariants()


@pytest.mark.parametrize("which", ["v", "k", "both"])
@pytest.mark.parametrize("buffer", ["key_layer", "value_layer", "key_cache", "value_cache"])
def test_put_refuses_k_or_v_aliasing_the_pools_buffers(pool: KvCachePool, which: str, buffer: str) -> None:
    view = getattr(pool, buffer)(1) if buffer.endswith("layer") else getattr(pool, buffer)[1]
    slot = int(pool.window_slot_indices(11, 1)[0])
    alias = view[slot : slot + 1].view(1, 1, 1, 2)  # the very slot the put writes (layer 1, position 11)
    k, v = (alias if which in ("k", "both") else torch.full((1, 1, 1, 2), 3.0),
            alias if which in ("v", "both") else torch.full((1, 1, 1, 2), 4.0))
    expect_unchanged(pool, ValueError, pool.put, 1, 11, k, v, match="share memory with the pool")
    k, v = k.clone(), v.clone()
    pool.put(1, 11, k, v)  # a copy is fine
    assert pool.kv_len(pool.test_rid) == 12
    got_k, got_v = pool.get(1, 12)
    # the aliased slot still held the fixture's poison (NaN): compare bytes
    assert torch.equal(got_k[:, 11:].view(torch.uint8), k.view(torch.uint8))
    assert torch.equal(got_v[:, 11:].view(torch.uint8), v.view(torch.uint8))
    pool.check_invariants()


@pytest.mark.parametrize("device", ["bogus", 42, None, 1.5, "meta", torch.device("meta")])
def test_a_bogus_device_is_a_value_error_naming_device(device: object) -> None:
    with pytest.raises(ValueError, match="device"):
        KvCachePool(1, 16, 1, 2, 4, device=device)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present here")
def test_a_missing_accelerator_is_a_value_error_naming_device() -> None:
    from smile_llm.cache import KvCacheLayout

    with pytest.raises(ValueError, match="device 'cuda' is not available"):
        KvCachePool(1, 16, 1, 2, 4, device="cuda")
    with pytest.raises(ValueError, match="device"):
        KvCachePool.allocate(KvCacheLayout(1, 1, 2, 1, 16), "cuda:0")
    with pytest.raises(ValueError, match="device"):
        KvCachePool.for_mtp_history(KvCacheLayout(1, 1, 2, 1, 16), "bogus", torch.float32, 4, 16)


def test_reads_past_capacity(pool: KvCachePool) -> None:
    expect_unchanged(pool, ValueError, pool.get, 0, 17, match="exceeds bound request capacity 16")
    expect_unchanged(pool, ValueError, pool.get, 0, -1)
    expect_unchanged(pool, ValueError, pool.get_padded, 0, 17)
    expect_unchanged(pool, ValueError, pool.slot_indices, 17)
    expect_unchanged(pool, KvCacheExhaustedError, pool.window_slot_indices, 15, 2)
    expect_unchanged(pool, ValueError, pool.window_slot_indices, -1, 2)


@pytest.mark.parametrize("n", [-1, 1.5, "4", None])
def test_alloc_and_evict_reject_bad_counts(pool: KvCachePool, n: object) -> None:
    expect_unchanged(pool, ValueError, pool.alloc, n)
    expect_unchanged(pool, ValueError, pool.evict, n)


def test_alloc_past_free_and_evictable(pool: KvCachePool) -> None:
    # 16 pages: 2 tree (locked), 2 private, 2 caller, 10 free.
    expect_unchanged(pool, KvCacheExhaustedError, pool.alloc, 44, match="need 11 pages, have 10 free")
    assert len(pool.alloc(0)) == 0


def test_free_rejects_everything_but_caller_pages(pool: KvCachePool) -> None:
    caller = np.flatnonzero(pool._pages.owner == 3)
    slots = (caller[:, None] * PS + np.arange(PS)).reshape(-1)
    private = pool._table.get(pool.test_rid).private_pages(PS)
    tree_page = int(pool._table.get(pool.test_rid).page_ids[0])
    free_page = int(pool._pages.free_list()[0])
    cases = {
        "partial page": slots[:3],
        "out of order": slots[::-1].copy(),
        "page listed twice": np.concatenate([slots[:PS], slots[:PS]]),
        "out of range": np.arange(64, 68),
        "tree-owned": np.arange(tree_page * PS, tree_page * PS + PS),
        "private": np.arange(private[0] * PS, private[0] * PS + PS),
        "free": np.arange(free_page * PS, free_page * PS + PS),
        "not ints": [0.0, 1.0, 2.0, 3.0],
    }
    for name, bad in cases.items():
        expect_unchanged(pool, ValueError, pool.free, bad)
    pool.free(slots)
    expect_unchanged(pool, ValueError, pool.free, slots, match="double free")


def test_offload_and_restore_errors(pool: KvCachePool) -> None:
    rid = pool.test_rid
    handle = pool.offload_request(rid)
    expect_unchanged(pool, RuntimeError, pool.offload_request, rid, match="already offloaded")
    other = pool.bind_request([42], 4)
    other_handle = pool.offload_request(other)
    expect_unchanged(pool, ValueError, pool.restore_request, rid, other_handle, match="handle")
    expect_unchanged(pool, ValueError, pool.restore_request, 999, handle, match="Unknown request id")
    filler = pool.alloc(pool.free_slots)
    expect_unchanged(pool, KvCacheExhaustedError, pool.restore_request, rid, handle, match="needs 2 pages")
    pool.free(filler)
    pool.restore_request(rid, handle)
    expect_unchanged(pool, RuntimeError, pool.restore_request, rid, handle, match="not offloaded")


def test_page_bytes_errors(pool: KvCachePool) -> None:
    page_bytes = PS * 1 * 2 * 4
    private = int(pool._table.get(pool.test_rid).private_pages(PS)[0])
    tree_page = int(pool._table.get(pool.test_rid).page_ids[0])
    free_page = int(pool._pages.free_list()[0])
    good = bytes(page_bytes)
    expect_unchanged(pool, ValueError, pool.read_page, 0, 16)
    expect_unchanged(pool, ValueError, pool.read_page, 0, -1)
    expect_unchanged(pool, ValueError, pool.write_page, 0, private, good[:-1], good, match=f"one page of one layer is {page_bytes}")
    expect_unchanged(pool, ValueError, pool.write_page, 0, private, good, 12345, match="bytes-like")
    expect_unchanged(pool, ValueError, pool.write_page, 0, tree_page, good, good, match="tree")
    expect_unchanged(pool, ValueError, pool.write_page, 0, free_page, good, good, match="free")
    expect_unchanged(pool, ValueError, pool.write_page, 5, private, good, good)


def test_set_kv_scales_errors(pool: KvCachePool) -> None:
    for bad in (0.0, -1.0, float("nan"), float("inf"), "1", True):
        expect_unchanged(pool, ValueError, pool.set_kv_scales, bad, 1.0)
    expect_unchanged(pool, ValueError, pool.set_kv_scales, 2.0, 1.0, match="only FP8 storage is scaled")
    expect_unchanged(pool, RuntimeError, pool.set_kv_scales, 1.0, 1.0, match="while KV is stored")


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_layers=-1), dict(num_slots=0), dict(num_kv_heads=-1), dict(head_dim=1.5), dict(page_size=0),
        dict(num_slots=30), dict(dtype=torch.int32), dict(fresh_page_fill="nan"), dict(k_scale=0.0),
        dict(v_scale=float("nan")), dict(k_scale=True), dict(k_scale=2.0), dict(v_scale=0.5, dtype=torch.bfloat16),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict) -> None:
    args = dict(num_layers=1, num_slots=32, num_kv_heads=1, head_dim=2, page_size=4)
    args.update(kwargs)
    with pytest.raises(ValueError):
        KvCachePool(**args)


def test_no_active_step_errors_change_nothing(pool: KvCachePool) -> None:
    pool.unbind_request(pool.test_rid)
    expect_unchanged(pool, NoActiveStepError, pool.put, 0, 0, *kv(1, 1))
    expect_unchanged(pool, NoActiveStepError, pool.get, 0, 1)
    expect_unchanged(pool, NoActiveStepError, pool.slot_indices, 1)


def test_every_call_after_close_raises(pool: KvCachePool) -> None:
    pool.close()
    pool.close()  # idempotent
    assert pool.closed
    calls = [
        lambda: pool.bind_request([1], 4), lambda: pool.bind_with_prefix([1], 4), lambda: pool.bind_requests(1, 4),
        lambda: pool.put(0, 0, *kv(1, 1)), lambda: pool.get(0, 1), lambda: pool.alloc(4), lambda: pool.free([]),
        lambda: pool.check_invariants(), lambda: pool.stats(), lambda: pool.free_pages, lambda: pool.key_cache,
        lambda: pool.activate_step(1), lambda: pool.unbind_requests(), lambda: pool.read_page(0, 0),
        lambda: pool.evict(1), lambda: pool.kv_len(1), lambda: pool.is_bound(1),
    ]
    for call in calls:
        with pytest.raises(PoolClosedError, match="closed"):
            call()
    assert isinstance(PoolClosedError("x"), RuntimeError)


def test_slot_idx_must_be_the_step_window(pool: KvCachePool) -> None:
    good = torch.from_numpy(pool.window_slot_indices(11, 2))
    tree_slot = int(pool._table.get(pool.test_rid).page_ids[0]) * PS
    for bad in (torch.tensor([tree_slot, tree_slot + 1]), good.flip(0), torch.tensor([10**6, 0]), good - 1):
        expect_unchanged(pool, ValueError, pool.put, 0, 11, *kv(1, 2), slot_idx=bad, match="window_slot_indices")
    pool.put(0, 11, *kv(1, 2), slot_idx=good)


def test_request_id_queries_accept_only_ints(pool: KvCachePool) -> None:
    rid = pool.test_rid
    for bad in ([rid], float(rid), str(rid), None, True):
        assert pool.is_bound(bad) is False and pool.matched_prefix_len(bad) == 0
    assert pool.is_bound(rid) and pool.is_bound(np.int64(rid)) and pool.matched_prefix_len(np.int32(rid)) == 8
    for args in (("1", 1), (1, "1"), (0, 1), (1, -1), (1.0, 4)):
        expect_unchanged(pool, ValueError, pool.ensure_request, *args)


def test_write_page_from_a_misaligned_view_is_exact_and_atomic(pool: KvCachePool) -> None:
    private = int(pool._table.get(pool.test_rid).private_pages(PS)[0])
    page_bytes = PS * 1 * 2 * 4
    backing = torch.arange(page_bytes + 1, dtype=torch.uint8)
    view = backing[1:]  # odd storage offset: a float32 view of it would be misaligned
    pool.write_page(1, private, view, view.clone())
    assert pool.read_page(1, private) == (view.numpy().tobytes(), view.numpy().tobytes())
    expect_unchanged(pool, ValueError, pool.write_page, 0, private, view, view[:-1])
