"""Storage: FP8 with fixed scales, fresh-page fills, page bytes, offload/restore, factories, stats, close."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCacheLayout, KvCachePool, PoolClosedError

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


@pytest.mark.parametrize("dtype", FP8)
def test_fp8_stores_x_over_scale_and_reads_stored_times_scale(dtype: torch.dtype) -> None:
    pool = KvCachePool(1, 16, 2, 4, 4, dtype=dtype, k_scale=0.5, v_scale=4.0)
    assert pool.compute_dtype == torch.float32 and not pool.kv_is_compute_dtype  # FP8 on CPU reads as float32
    pool.bind_request([1, 2], 8)
    k = torch.tensor([0.25, -1.0, 3.0, 100.0]).view(1, 1, 1, 4).expand(1, 2, 2, 4).contiguous()
    v = k * 8
    pool.put(0, 0, k, v)
    got_k, got_v = pool.get(0, 2)
    assert got_k.dtype == torch.float32
    # Exact: each value / scale is representable in both FP8 formats except the saturating one.
    fmax = torch.finfo(dtype).max
    expect_k = torch.clamp(k / 0.5, -fmax, fmax).to(dtype).float() * 0.5
    expect_v = torch.clamp(v / 4.0, -fmax, fmax).to(dtype).float() * 4.0
    assert torch.equal(got_k, expect_k) and torch.equal(got_v, expect_v)
    assert got_k[0, 0, 0, :3].tolist() == [0.25, -1.0, 3.0]
    raw = pool.key_layer(0)[int(pool.slot_indices(1)[0])]
    assert raw.dtype == dtype and raw[0, 1].float().item() == -2.0  # stored as x / k_scale


def test_fp8_saturates_instead_of_overflowing() -> None:
    pool = KvCachePool(1, 4, 1, 1, 4, dtype=torch.float8_e5m2)
    pool.bind_request([1], 4)
    pool.put(0, 0, torch.full((1, 1, 1, 1), 1e9), torch.full((1, 1, 1, 1), -1e9))
    k, v = pool.get(0, 1)
    assert k.item() == 57344.0 and v.item() == -57344.0


def test_fp8_scales_fixed_old_tokens_never_rescaled() -> None:
    # Fix: Smile's running-max scale makes earlier tokens come back scaled by new/old; fixed scales do not.
    pool = KvCachePool(1, 16, 1, 1, 4, dtype=torch.float8_e4m3fn, k_scale=1.0)
    pool.bind_request([1], 8)
    pool.put(0, 0, torch.full((1, 1, 1, 1), 2.0), torch.zeros(1, 1, 1, 1))
    pool.put(0, 1, torch.full((1, 1, 1, 1), 400.0), torch.zeros(1, 1, 1, 1))
    k, _ = pool.get(0, 2)
    assert k.flatten().tolist() == [2.0, 384.0]  # 400 rounds to 384 in e4m3; token 0 unchanged


def test_set_kv_scales_only_while_empty() -> None:
    pool = KvCachePool(1, 16, 1, 1, 4, dtype=torch.float8_e4m3fn)
    pool.set_kv_scales(2.0, 3.0)
    assert (pool.k_scale, pool.v_scale) == (2.0, 3.0)
    pool.bind_request([1], 4)
    with pytest.raises(RuntimeError, match="while KV is stored"):
        pool.set_kv_scales(1.0, 1.0)
    pool.unbind_requests()
    pool.set_kv_scales(1.0, 1.0)
    slots = pool.alloc(4)
    with pytest.raises(RuntimeError):
        pool.set_kv_scales(2.0, 2.0)
    pool.free(slots)
    pool.set_kv_scales(2.0, 2.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_fresh_page_fill_poison_marks_unwritten_slots(dtype: torch.dtype) -> None:
    pool = KvCachePool(2, 16, 1, 2, 4, dtype=dtype, fresh_page_fill="poison")
    pool.bind_request([1], 8)
    pool.put(1, 0, torch.ones(1, 3, 1, 2), torch.ones(1, 3, 1, 2))
    k, v = pool.get(1, 8)
    assert not k[0, :3].isnan().any() and k[0, 3:].isnan().all() and v[0, 3:].isnan().all()
    k0, _ = pool.get(0, 8)
    assert k0.isnan().all()  # layer 0 was never written


def test_fresh_page_fill_zero_clears_reused_pages() -> None:
    pool = KvCachePool(1, 8, 1, 2, 4, fresh_page_fill="zero")
    rid = pool.bind_request([1], 8)
    pool.put(0, 0, torch.full((1, 8, 1, 2), 9.0), torch.full((1, 8, 1, 2), 9.0))
    pool.unbind_request(rid)
    pool.bind_request([1], 8)  # same pages again
    k, v = pool.get(0, 8)
    assert not k.any() and not v.any()
    plain = KvCachePool(1, 8, 1, 2, 4, fresh_page_fill="none")
    rid = plain.bind_request([1], 8)
    plain.put(0, 0, torch.full((1, 8, 1, 2), 9.0), torch.full((1, 8, 1, 2), 9.0))
    plain.unbind_request(rid)
    plain.bind_request([1], 8)
    assert bool((plain.get(0, 8)[0] == 9.0).all())  # "none" leaves stale values (what poison is for)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float8_e5m2])
def test_read_write_page_round_trip_bytes(dtype: torch.dtype) -> None:
    pool = KvCachePool(2, 16, 2, 3, 4, dtype=dtype)
    slots = pool.alloc(4)
    page = int(slots[0]) // 4
    gen = torch.Generator().manual_seed(0)
    k_bytes = torch.randint(0, 256, (4 * 2 * 3 * pool.key_cache.element_size(),), generator=gen, dtype=torch.uint8)
    v_bytes = torch.randint(0, 256, k_bytes.shape, generator=gen, dtype=torch.uint8)
    pool.write_page(1, page, k_bytes.numpy().tobytes(), bytearray(v_bytes.numpy().tobytes()))
    k_out, v_out = pool.read_page(1, page)
    assert k_out == k_bytes.numpy().tobytes() and v_out == v_bytes.numpy().tobytes()
    assert pool.read_page(0, page) != (k_out, v_out)  # another layer is untouched
    pool.write_page(0, page, torch.frombuffer(bytearray(k_out), dtype=torch.uint8), memoryview(v_out))
    assert pool.read_page(0, page) == (k_out, v_out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float8_e4m3fn])
def test_offload_restore_is_byte_identical_into_other_pages(dtype: torch.dtype) -> None:
    pool = KvCachePool(2, 64, 2, 4, 4, dtype=dtype, fresh_page_fill="poison")
    prompt = list(range(1, 10))
    pool.bind_with_prefix(prompt, 12)
    for layer in range(2):
        pool.put(layer, 0, torch.ones(1, 9, 2, 4), torch.ones(1, 9, 2, 4))
    pool.finish_exclusive(prompt)
    rid = pool.bind_request(prompt + [10, 11, 12], 24)  # 8 matched, 4 private pages, writes 8..13
    gen = torch.Generator().manual_seed(1)
    data = torch.randn(2, 1, 6, 2, 4, generator=gen)
    for layer in range(2):
        pool.put(layer, 8, data[layer], -data[layer])
    before = [pool.get(layer, 14) for layer in range(2)]
    raw_before = [pool.read_page(layer, int(p)) for layer in range(2) for p in pool.slot_indices(16)[8::4] // 4]
    free_before = pool.free_pages
    handle = pool.offload_request(rid)
    assert pool.is_bound(rid) and pool.request_capacity == 0  # still bound, step cleared
    assert handle.num_private_pages == 4 and handle.nbytes == 2 * 2 * 4 * 4 * 2 * 4 * dtype.itemsize
    assert pool.free_pages == free_before + 4 and pool.radix.protected_size == 8
    pool.check_invariants()
    squatter = pool.alloc(8)  # the freed pages are reused by someone else
    pool.restore_request(rid, handle)
    pool.check_invariants()
    pool.activate_step(rid)
    assert not set(pool.slot_indices(16)[8:] // 4) & set(squatter // 4)
    for layer in range(2):
        k, v = pool.get(layer, 14)
        assert torch.equal(k, before[layer][0]) and torch.equal(v, before[layer][1])
    raw_after = [pool.read_page(layer, int(p)) for layer in range(2) for p in pool.slot_indices(16)[8::4] // 4]
    assert raw_after == raw_before
    assert pool.kv_len(rid) == 14
    k, _ = pool.get(0, 16)
    assert k[0, 14:].float().isnan().all()  # the never-written tail comes back as it was (poison bytes)


def test_finishing_an_offloaded_request_drops_it_without_inserting() -> None:
    pool = KvCachePool(1, 32, 1, 2, 4)
    rid = pool.bind_request(list(range(1, 6)), 8)
    pool.put(0, 0, torch.ones(1, 5, 1, 2), torch.ones(1, 5, 1, 2))
    pool.offload_request(rid)
    pool.finish_request(rid, list(range(1, 6)))
    assert not pool.is_bound(rid) and pool.radix.total_size() == 0 and pool.free_pages == 8
    pool.check_invariants()


def test_stats_counts_pages_by_owner() -> None:
    pool = KvCachePool(1, 64, 1, 2, 4)
    pool.bind_with_prefix(list(range(1, 10)), 12)
    pool.put(0, 0, torch.ones(1, 9, 1, 2), torch.ones(1, 9, 1, 2))
    pool.finish_exclusive(list(range(1, 10)))
    pool.bind_request(list(range(1, 10)) + [1], 16)
    pool.alloc(4)
    s = pool.stats()
    assert (s["free_pages"], s["tree_pages"], s["private_pages"], s["caller_pages"]) == (11, 2, 2, 1)
    assert s["free_pages"] + s["tree_pages"] + s["private_pages"] + s["caller_pages"] == s["num_pages"] == 16
    assert (s["cached_tokens"], s["protected_tokens"], s["evictable_tokens"]) == (8, 8, 0)
    assert s["bound_requests"] == 1 and s["active_batch"] == 1


def test_factories() -> None:
    layout = KvCacheLayout.of(3, 64, 4, 2, max_batch_size=2, max_seq_len=9)
    mtp = KvCachePool.for_mtp(layout, "cpu", torch.bfloat16, 16)
    assert (mtp.num_slots, mtp.page_size, mtp.dtype, mtp.num_layers) == (32, 16, torch.bfloat16, 3)
    hist = KvCachePool.for_mtp_history(layout, "cpu", torch.float16, 16, 100)
    assert hist.num_slots == 96 and not hist.prefix_reuse_enabled
    with pytest.raises(RuntimeError, match="not enough free memory"):
        KvCachePool.for_mtp_history(layout, "cpu", torch.float16, 16, 15)
    testing = KvCachePool.for_testing(layout)
    assert (testing.num_slots, testing.page_size, testing.dtype) == (18, 1, torch.float32)
    with pytest.raises(ValueError, match="mem_fraction"):
        KvCachePool.allocate(layout, "cpu", torch.float32, 0.0)
    with pytest.raises(ValueError, match="page_size"):
        KvCachePool.allocate(layout, "cpu", torch.float32, 0.5, page_size=0)


def test_zero_rejected_kv_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMILE_MTP_ZERO_REJECTED_KV", "1")
    assert KvCachePool(1, 4, 1, 1, 4).zero_rejected_kv
    assert not KvCachePool(1, 4, 1, 1, 4, zero_rejected_kv=False).zero_rejected_kv
    monkeypatch.delenv("SMILE_MTP_ZERO_REJECTED_KV")
    assert not KvCachePool(1, 4, 1, 1, 4).zero_rejected_kv


def test_close_releases_everything_and_context_manager_closes() -> None:
    with KvCachePool(1, 16, 1, 2, 4) as pool:
        pool.bind_request([1], 8)
        pool.alloc(4)
    assert pool.closed and "closed" in repr(pool)
    for name in ("num_layers", "page_size", "dtype", "k_scale", "radix", "prefix_reuse_enabled", "free_slots",
                 "prefix_match_tokens", "decode_graph_buffers", "fresh_page_fill", "zero_rejected_kv"):
        with pytest.raises(PoolClosedError):
            getattr(pool, name)
    with pytest.raises(PoolClosedError):
        pool.prefix_reuse_enabled = False


def test_read_only_properties_cannot_be_set() -> None:
    pool = KvCachePool(1, 16, 1, 2, 4)
    for name in ("num_layers", "num_slots", "num_kv_heads", "head_dim", "page_size", "device", "dtype",
                 "compute_dtype", "k_scale", "radix", "free_pages", "request_capacity", "fresh_page_fill",
                 "prefix_match_tokens"):
        with pytest.raises(AttributeError):
            setattr(pool, name, 2)
    assert pool.page_size == 4 and pool.num_slots == 16
    pool.prefix_reuse_enabled = False
    pool.decode_graph_buffers = pool.verify_graph_buffers = pool.verify_window_kernel = True
    assert not pool.prefix_reuse_enabled and pool.decode_graph_buffers and pool.verify_window_kernel


def test_slot_indices_are_row_major_physical_slots() -> None:
    pool = KvCachePool(1, 64, 1, 2, 4)
    pool.alloc(8)  # pages 0, 1 go to a caller
    r1 = pool.bind_request([1], 8)  # pages 2, 3
    r2 = pool.bind_request([2], 8)  # pages 4, 5
    pool.activate_step(r2, r1)
    assert pool.slot_indices(6).tolist() == [16, 17, 18, 19, 20, 21, 8, 9, 10, 11, 12, 13]
    assert pool.window_slot_indices([3, 5], 2).tolist() == [19, 20, 13, 14]
    assert isinstance(pool.slot_indices(1), np.ndarray) and pool.slot_indices(1).dtype == np.int64


def test_check_invariants_names_the_first_broken_page() -> None:
    from smile_llm.cache import KvCacheCorruptionError

    pool = KvCachePool(1, 32, 1, 2, 4)
    rid = pool.bind_request([1, 2, 3], 8)
    private = pool._table.get(rid).private_pages(4)
    pool._pages.release(private[:1])  # a page freed behind the pool's back: free and private at once
    with pytest.raises(KvCacheCorruptionError, match=f"page {int(private[0])} is claimed by both"):
        pool.check_invariants()

    pool = KvCachePool(1, 32, 1, 2, 4)
    pool.alloc(4)
    pool._pages.owner[5] = 1  # marked tree-owned, but no node holds it
    with pytest.raises(KvCacheCorruptionError, match="page 5 is held by the free list but the owner table says tree"):
        pool.check_invariants()

    pool = KvCachePool(1, 32, 1, 2, 4)
    prompt = list(range(1, 10))
    pool.bind_with_prefix(prompt, 12)
    pool.put(0, 0, torch.ones(1, 9, 1, 2), torch.ones(1, 9, 1, 2))
    pool.finish_exclusive(prompt)
    pool.bind_request(prompt + [1], 12)
    next(pool.radix.nodes()).lock_ref += 1  # a lock no binding holds
    with pytest.raises(KvCacheCorruptionError, match="lock_ref 2 but 1 bindings lock it"):
        pool.check_invariants()
