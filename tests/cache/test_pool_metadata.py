"""FlashInfer CSR metadata, speculative seal/truncate and the CUDA-graph fixed buffers (docs/contract.md).

Smile's KvCachePoolTest 20-30 and FlashInferKvMetadataTest, adapted where a Fix rule applies (docs/contract.md),
plus address-stability checks: after a bump and after ``prepare_verify_graph_step`` across page growth, every fixed
buffer keeps its ``data_ptr()``, and ``consume_verify_graph_meta_realloc`` is True exactly when one moved.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCacheExhaustedError, KvCacheLayout, KvCachePool
from smile_llm.attention.torch.backend import paged_attention
from smile_llm.cache.metadata import FlashInferKvMetadata

from .snapshot import expect_unchanged


def pool16(num_slots: int = 64, layers: int = 1, **kw) -> KvCachePool:
    pool = KvCachePool(layers, num_slots, 2, 16, 16, **kw)
    pool.prefix_reuse_enabled = False
    return pool


def ones(b: int, s: int, value: float = 1.0) -> torch.Tensor:
    return torch.full((b, s, 2, 16), value)


def ptrs(meta: FlashInferKvMetadata) -> tuple[int, int, int]:
    return meta.indptr.data_ptr(), meta.indices.data_ptr(), meta.last_page_len.data_ptr()


def test_flashinfer_metadata_for_one_request_of_twenty_tokens() -> None:  # Smile FlashInferKvMetadataTest
    pool = KvCachePool(1, 64, 2, 8, 16)
    pool.bind_requests(1, 20)
    meta = pool.build_flashinfer_metadata(20)
    assert meta.page_size == 16 and meta.indptr.dtype == torch.int32 and meta.indptr.shape == (2,)
    assert meta.indptr.tolist() == [0, 2] and meta.indices.tolist() == [0, 1] and meta.last_page_len.tolist() == [4]
    meta.validate(pool.num_slots // 16)


def test_given_ragged_lengths_when_build_flashinfer_metadata_then_indptr_matches() -> None:  # Smile 20
    pool = pool16(128)
    id1, id2 = pool.bind_request([1], 32), pool.bind_request([2], 48)
    pool.activate_step(id1, id2)
    meta = pool.build_flashinfer_metadata([10, 25])
    assert meta.indptr.tolist() == [0, 1, 3] and meta.last_page_len.tolist() == [10, 9]
    assert meta.indices.tolist() == [0, 2, 3]  # row 1's pages follow row 0's two
    empty = pool.build_flashinfer_metadata([0, 25])
    assert empty.indptr.tolist() == [0, 0, 2] and empty.last_page_len.tolist() == [0, 9]
    assert pool.build_flashinfer_metadata(0).indptr.tolist() == [0, 0, 0]
    assert list(empty.kv_lens()) == [0, 25]


def test_given_ragged_put_when_build_metadata_then_last_page_lens_match_positions() -> None:  # Smile 21
    pool = pool16(128)
    id1, id2 = pool.bind_request([1], 64), pool.bind_request([2], 64)
    pool.activate_step(id1, id2)
    pool.put(0, [9, 24], ones(2, 1), ones(2, 1))
    meta = pool.build_flashinfer_metadata([10, 25])
    assert meta.indptr.tolist() == [0, 1, 3] and meta.last_page_len.tolist() == [10, 9]


def test_given_cache_len_when_steps_until_page_boundary_then_matches_page_size() -> None:  # Smile 22
    pool = pool16()
    assert [pool.steps_until_page_boundary(n) for n in (481, 495, 496, 497)] == [15, 1, 0, 15]
    assert pool.first_cache_len_in_next_page_bucket(31) == 497
    assert pool.num_pages_for_length(496) == 31 and pool.num_pages_for_length(497) == 32


def test_given_batch_one_decode_when_length_increments_within_page_then_reuses_metadata() -> None:  # Smile 23
    pool = pool16()
    rid = pool.bind_request([1], 32)
    meta = pool.shared_flashinfer_metadata(10)
    assert pool.shared_flashinfer_metadata(10) is meta
    pool.activate_step(rid)  # same cohort keeps the step CSR
    bumped = pool.shared_flashinfer_metadata(11)
    assert bumped is meta and ptrs(bumped) == ptrs(meta) and meta.last_page_len.tolist() == [11]
    grown = pool.shared_flashinfer_metadata(17)  # crosses into page 2: rebuilt
    assert grown is not meta and grown.indptr.tolist() == [0, 2]


def test_given_uniform_batch_when_length_increments_within_page_then_reuses_metadata() -> None:  # Smile 24
    pool = pool16(128)
    ids = [pool.bind_request([1], 32), pool.bind_request([2], 32)]
    pool.activate_step(*ids)
    meta = pool.shared_flashinfer_metadata([10, 10])
    pool.activate_step(*ids)
    assert pool.shared_flashinfer_metadata([11, 11]) is meta and meta.last_page_len.tolist() == [11, 11]
    # Fix: any lengths that keep every row's page count bump in place (Smile's ragged bump needed exactly +1).
    assert pool.shared_flashinfer_metadata([3, 16]) is meta and meta.last_page_len.tolist() == [3, 16]


def test_given_activate_step_when_shared_flashinfer_metadata_then_reuses_same_instance() -> None:  # Smile 25
    pool = pool16(128)
    id1, id2 = pool.bind_request([1], 32), pool.bind_request([2], 48)
    pool.activate_step(id1, id2)
    meta = pool.shared_flashinfer_metadata([10, 25])
    assert pool.shared_flashinfer_metadata([10, 25]) is meta
    pool.activate_step(id1, id2)
    assert pool.shared_flashinfer_metadata([10, 25]) is meta
    pool.activate_step(id1)
    assert pool.shared_flashinfer_metadata(10) is not meta


def test_given_speculative_window_when_truncate_to_then_seals_and_tail_zeroing_is_opt_in() -> None:  # Smile 26
    for zero in (False, True):
        pool = pool16(layers=2, zero_rejected_kv=zero)
        pool.bind_requests(1, 32)
        for layer in range(2):
            pool.put(layer, 0, ones(1, 20), ones(1, 20, 3.0))
        assert pool.shared_flashinfer_metadata(20).last_page_len.tolist() == [4]
        pool.truncate_to(17, 20)
        meta = pool.shared_flashinfer_metadata(17)
        assert meta.last_page_len.tolist() == [1] and pool.shared_flashinfer_metadata(17) is meta
        k, _ = pool.get(0, 20)
        assert k[0, 16, 0, 0].item() == 1.0
        expect = 0.0 if zero else 1.0
        assert k[0, 17, 0, 0].item() == expect and k[0, 19, 1, 15].item() == expect
        pool.invalidate_range(17, 20)
        k1, v1 = pool.get(1, 20)
        assert k1[0, 16, 0, 0].item() == 1.0 and k1[0, 17].abs().sum() == 0 and k1[0, 19].abs().sum() == 0
        assert v1[0, 18].abs().sum() == 0 and v1[0, 16, 0, 0].item() == 3.0
        assert pool.kv_len(pool._step.ids[0]) == 17


def test_given_truncate_to_when_written_equals_sealed_then_no_op_invalidate() -> None:  # Smile 27
    pool = KvCachePool.for_testing(KvCacheLayout.of(1, 64, 4, 2, 1, 16))
    pool.bind_requests(1, 8)
    pool.put(0, 0, ones(1, 4), ones(1, 4))
    pool.truncate_to(4, 4)
    assert pool.get(0, 4)[0][0, 0, 0, 0].item() == 1.0


def test_given_mtp_round_trip_when_seal_and_regrow_same_page_then_reuses_csr_tensors() -> None:  # Smile 28
    pool = pool16()
    pool.bind_requests(1, 32)
    pool.put(0, 0, ones(1, 14), ones(1, 14))
    meta0 = pool.shared_flashinfer_metadata(10)
    addresses = ptrs(meta0)
    assert pool.truncate_to(13, 13) is True
    assert pool.shared_flashinfer_metadata(13) is meta0 and ptrs(meta0) == addresses
    assert pool.truncate_to(11, 16) is True and meta0.last_page_len.tolist() == [11]
    assert pool.truncate_to(14, 14) is True and meta0.last_page_len.tolist() == [14]
    assert ptrs(pool.shared_flashinfer_metadata(14)) == addresses
    assert pool.truncate_to(17, 17) is False  # a page boundary: rebuilt, graphs keyed to meta0 must go
    assert pool.current_step_metadata() is not meta0
    assert pool.seal_length(0) is False and pool.current_step_metadata() is None


def test_given_verify_graph_buffers_when_put_then_writes_same_slots_as_fresh_index_path() -> None:  # Smile 29
    pool = pool16(128)
    id1, id2 = pool.bind_request([1], 32), pool.bind_request([2], 32)
    pool.activate_step(id1, id2)
    pool.put(0, [4, 4], ones(2, 3, 9.0), ones(2, 3, 9.0))
    _, v = pool.get(0, 7)
    assert v[0, 6, 0, 0].item() == 9.0 and v[1, 4, 0, 0].item() == 9.0
    pool.activate_step(id1, id2)
    pool.prepare_verify_graph_step(7, [4, 4], 3)
    pool.verify_graph_buffers = True
    pool.put(0, [4, 4], ones(2, 3, 42.0), ones(2, 3, 42.0))
    _, v = pool.get(0, 7)
    assert [v[r, p, 0, 0].item() for r in (0, 1) for p in (4, 6)] == [42.0] * 4
    assert pool.verify_graph_metadata().last_page_len.tolist() == [7, 7]


def test_given_verify_graph_buffers_when_buffer_not_prepared_then_throws() -> None:  # Smile 30
    pool = pool16()
    pool.bind_requests(1, 32)
    pool.verify_graph_buffers = True
    expect_unchanged(pool, RuntimeError, pool.put, 0, 0, ones(1, 3), ones(1, 3), match="not prepared")
    pool.prepare_verify_graph_step(3, 0, 3)
    expect_unchanged(pool, ValueError, pool.put, 0, 1, ones(1, 3), ones(1, 3), match="prepared at")
    expect_unchanged(pool, RuntimeError, pool.put, 0, 0, ones(1, 2), ones(1, 2), match="seqlen 2")


def test_sealing_lowers_kv_len_so_rejected_tokens_are_never_inserted() -> None:
    pool = KvCachePool(1, 64, 2, 16, 4)
    prompt = list(range(1, 9))
    pool.bind_with_prefix(prompt, 32)
    pool.put(0, 0, ones(1, 8), ones(1, 8))
    pool.put(0, 8, ones(1, 5), ones(1, 5))  # a verify window of 5 drafts
    rid = pool._step.ids[0]
    assert pool.kv_len(rid) == 13
    pool.truncate_to(10, 13)  # 2 accepted
    assert pool.kv_len(rid) == 10
    pool.finish_exclusive(prompt + [20, 21, 22, 23, 24])
    assert pool.radix.total_size() == 8  # floor_page(min(13, kv_len=10)) = 8: no rejected draft is cached


def test_seal_never_lowers_kv_len_below_the_matched_prefix() -> None:
    pool = KvCachePool(1, 64, 2, 16, 4)
    prompt = list(range(1, 10))
    pool.bind_with_prefix(prompt, 16)
    pool.put(0, 0, ones(1, 9), ones(1, 9))
    pool.finish_exclusive(prompt)
    assert pool.bind_with_prefix(prompt + [5], 16) == 8
    rid = pool._step.ids[0]
    assert pool.seal_length(4) is False  # attention sees 4 tokens, but the cached prefix stays written
    assert pool.kv_len(rid) == 8
    expect_unchanged(pool, ValueError, pool.invalidate_range, 6, 10, match="below its matched prefix")
    pool.zero_rejected_kv = True
    expect_unchanged(pool, ValueError, pool.truncate_to, 6, 10, match="below its matched prefix")
    pool.check_invariants()


def test_ragged_truncate_zeroes_each_row_tail() -> None:
    pool = pool16(128, zero_rejected_kv=True)
    ids = [pool.bind_request([1], 32), pool.bind_request([2], 32)]
    pool.activate_step(*ids)
    pool.put(0, 0, ones(2, 12), ones(2, 12))
    assert pool.truncate_to([9, 11], [12, 12]) is False  # no CSR yet: built
    k, _ = pool.get(0, 12)
    assert k[0, :, 0, 0].tolist() == [1.0] * 9 + [0.0] * 3 and k[1, :, 0, 0].tolist() == [1.0] * 11 + [0.0]
    assert [pool.kv_len(i) for i in ids] == [9, 11]
    meta = pool.current_step_metadata()  # rebuilt for the sealed lengths
    assert meta.last_page_len.tolist() == [9, 11] and pool.shared_flashinfer_metadata([9, 11]) is meta


def test_decode_graph_step_writes_through_the_fixed_index_and_the_graph_csr_in_place() -> None:
    pool = pool16(128)
    ids = [pool.bind_request([1], 48), pool.bind_request([2], 48)]
    pool.activate_step(*ids)
    pool.put(0, 0, ones(2, 20), ones(2, 20))
    pool.decode_graph_buffers = True
    meta = pool.prepare_decode_graph_step(21, 20)
    index = pool._graphs.decode.index
    addresses, index_ptr = ptrs(meta), index.data_ptr()
    assert pool.decode_graph_metadata(2) is meta and meta.last_page_len.tolist() == [5, 5]
    assert index.tolist() == pool.window_slot_indices(20, 1).tolist()
    assert [pool.kv_len(i) for i in ids] == [21, 21]  # a replayed graph never calls put
    pool.put(0, 20, ones(2, 1, 5.0), ones(2, 1, 5.0))
    for step in range(21, 32):  # stays inside page 2: bumped in place, same addresses
        meta = pool.prepare_decode_graph_step(step + 1, step)
        pool.put(0, step, ones(2, 1, float(step)), ones(2, 1, float(step)))
        assert ptrs(meta) == addresses and pool._graphs.decode.index.data_ptr() == index_ptr
    k, _ = pool.get(0, 32)
    assert k[:, 20:, 0, 0].tolist() == [[5.0] + [float(s) for s in range(21, 32)]] * 2
    assert ptrs(pool.prepare_decode_graph_step(33, 32)) == addresses  # page 3: the graph CSR never moves
    assert pool.decode_graph_metadata(2).indptr.tolist() == [0, 3, 6]
    expect_unchanged(pool, ValueError, pool.put, 0, 31, ones(2, 1), ones(2, 1), match="prepared for positions")
    expect_unchanged(pool, RuntimeError, pool.decode_graph_metadata, 3, match="batch 3")  # 2 rows reserved
    expect_unchanged(pool, ValueError, pool.prepare_decode_graph_step, 34, 32, match="must equal")
    pool.activate_step(ids[0])
    expect_unchanged(pool, RuntimeError, pool.put, 0, 33, ones(1, 1), ones(1, 1), match="prepare_decode_graph_step")


def test_prefetch_capture_writes_only_scratch_slots() -> None:
    pool = pool16(512, fresh_page_fill="poison")
    ids = [pool.bind_request([1], 64), pool.bind_request([2], 64)]
    pool.activate_step(*ids)
    pool.put(0, 0, ones(2, 30), ones(2, 30))
    pool.decode_graph_buffers = True
    pool.prepare_decode_graph_step(31, 30)
    live = pool.shared_flashinfer_metadata(31)
    pool.put(0, 30, ones(2, 1, 2.0), ones(2, 1, 2.0))
    before = pool.key_cache.clone()
    kv_before = [pool.kv_len(i) for i in ids]
    pf = pool.begin_prefetch_decode_graph_step(33, 32, 2)
    assert pool.current_step_metadata() is pf and pf.indptr.tolist() == [0, 3, 6]
    assert pool.stats()["scratch_pages"] == 3
    pool.check_invariants()
    # The capture attends over [0, 33) of the live rows: positions 31 and 32 were never written (poison), so
    # begin zeroed them; what the rows wrote stays exactly as it was.
    pool.decode_graph_buffers = False
    k_live, _ = pool.get(0, 33)
    assert k_live[:, :31].equal(ones(2, 31).clone().index_fill_(1, torch.tensor([30]), 2.0))
    assert k_live[:, 31:].eq(0).all()
    pool.decode_graph_buffers = True
    q = torch.randn(2, 2, 16)
    pf_out = paged_attention(q, pool.key_layer(0).view(-1, 16, 2, 16), pool.value_layer(0).view(-1, 16, 2, 16), pf)
    assert not pf_out.isnan().any()  # the capture never computes on NaN
    live_slots = set(pool.slot_indices(64).tolist())
    before = pool.key_cache.clone()
    pool.put(0, 32, ones(2, 1, 99.0), ones(2, 1, 99.0))  # what a capture does
    after = pool.key_cache
    differs = (after != before) & ~(after.isnan() & before.isnan())
    changed = set(differs.any(dim=-1).any(dim=-1)[0].nonzero().flatten().tolist())
    scratch = set((pool._graphs.prefetch.scratch_pages[:, None] * 16 + np.arange(16)).reshape(-1).tolist())
    assert changed and changed <= scratch and not changed & live_slots  # no live slot was written
    assert not pool.key_cache[0, sorted(scratch)].isnan().any()  # scratch pages are zeroed, never poison
    assert [pool.kv_len(i) for i in ids] == kv_before
    for verb, args in ((pool.seal_length, (34,)), (pool.shared_flashinfer_metadata, (34,)),
                       (pool.prepare_decode_graph_step, (32, 31)), (pool.truncate_to, (31, 31)),
                       (pool.clear_step_metadata, ()), (pool.install_prefetched_step_metadata, (pf, 33))):
        expect_unchanged(pool, RuntimeError, verb, *args, match="prefetch capture holds the step CSR")
    assert pool.end_prefetch_decode_graph_step() is pf and pool.current_step_metadata() is live
    expect_unchanged(pool, RuntimeError, pool.put, 0, 31, ones(2, 1), ones(2, 1), match="prepare_decode_graph_step")
    expect_unchanged(pool, RuntimeError, pool.end_prefetch_decode_graph_step, match="no prefetch")
    expect_unchanged(pool, ValueError, pool.install_prefetched_step_metadata, _single_row_meta(), 33,
                     match="batch 2")
    expect_unchanged(pool, ValueError, pool.install_prefetched_step_metadata, pf, 40, match="does not describe")
    pool.install_prefetched_step_metadata(pf, 33)
    assert pool.current_step_metadata() is pf and pool.shared_flashinfer_metadata(34) is pf  # bumped in place
    other = [pool.bind_request([3], 64), pool.bind_request([4], 64)]
    pool.activate_step(*other)  # another cohort of the same batch: the CSR lists the wrong pages
    expect_unchanged(pool, ValueError, pool.install_prefetched_step_metadata, pf, 34, match="does not describe")
    bad = FlashInferKvMetadata(pf.indptr.long(), pf.indices, pf.last_page_len, 16)
    expect_unchanged(pool, ValueError, pool.install_prefetched_step_metadata, bad, 34)
    pool.check_invariants()


def _single_row_meta() -> FlashInferKvMetadata:
    return FlashInferKvMetadata(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0], dtype=torch.int32),
                                torch.tensor([1], dtype=torch.int32), 16)


def test_verify_graph_csr_keeps_its_address_across_page_growth() -> None:
    pool = pool16(256)
    ids = [pool.bind_request([1], 64), pool.bind_request([2], 48)]
    pool.activate_step(*ids)
    pool.put(0, 0, ones(2, 10), ones(2, 10))
    meta = pool.prepare_verify_graph_step(14, 10, 4)
    assert pool.consume_verify_graph_meta_realloc() is True and pool.consume_verify_graph_meta_realloc() is False
    addresses = ptrs(meta)
    assert meta.indices.shape == (2 * 16,)  # every row at the pool's full page count
    index_ptr = pool._graphs.verify.index.data_ptr()
    for start in range(14, 44, 4):  # grows from 1 to 3 pages per row
        meta = pool.prepare_verify_graph_step([start + 4, start + 4], [start, start], 4)
        assert ptrs(meta) == addresses and pool._graphs.verify.index.data_ptr() == index_ptr
        assert pool.consume_verify_graph_meta_realloc() is False
        pages = -(-(start + 4) // 16)
        assert meta.indptr.tolist() == [0, pages, 2 * pages]
        assert meta.indices[: 2 * pages].tolist() == pool.build_flashinfer_metadata(start + 4).indices.tolist()
        assert [pool.kv_len(i) for i in ids] == [start + 4] * 2
    ragged = pool.prepare_verify_graph_step([47, 30], [43, 26], 4)  # ragged rows, same buffers
    assert ptrs(ragged) == addresses and ragged.indptr.tolist() == [0, 3, 5]
    assert ragged.last_page_len.tolist() == [15, 14]
    qo = pool.verify_qo_indptr(2, 4)
    assert qo.tolist() == [0, 4, 8] and qo.dtype == torch.int32 and pool.verify_qo_indptr(2, 4) is qo
    pool.activate_step(ids[0])  # the batch changes: the leading row of the same buffers
    one = pool.prepare_verify_graph_step(51, 47, 4)
    assert pool.consume_verify_graph_meta_realloc() is False and pool.verify_qo_indptr(2, 4) is qo
    assert one.indices.data_ptr() == addresses[1] and one.indptr.tolist() == [0, 4]
    pool.reserve_graph_rows(3)  # more rows: the graph CSR moves, and says so
    assert pool.consume_verify_graph_meta_realloc() is True
    pool.check_invariants()


def test_prepare_verify_step_is_eager_ragged_through_the_step_csr() -> None:
    pool = pool16(256)
    ids = [pool.bind_request([1], 64), pool.bind_request([2], 64)]
    pool.activate_step(*ids)
    pool.put(0, 0, ones(2, 10), ones(2, 10))
    meta = pool.prepare_verify_step([13, 15], [10, 12], 3)
    assert meta is pool.current_step_metadata() and meta.last_page_len.tolist() == [13, 15]
    assert [pool.kv_len(i) for i in ids] == [10, 10]  # eager: the put writes, not the prepare
    pool.verify_graph_buffers = True
    pool.put(0, [10, 12], ones(2, 3, 7.0), ones(2, 3, 7.0))
    k, _ = pool.get(0, 15)
    assert k[0, 10:13, 0, 0].tolist() == [7.0] * 3 and k[1, 12:15, 0, 0].tolist() == [7.0] * 3


def test_invalidate_range_uses_fresh_indices_even_with_graph_buffers_on() -> None:
    # Smile quirk 6: invalidate_range went through put and tripped over the verify buffer; here it never does.
    pool = pool16(layers=2)
    pool.bind_requests(1, 32)
    pool.put(0, 0, ones(1, 12), ones(1, 12))
    pool.put(1, 0, ones(1, 12), ones(1, 12))
    pool.prepare_verify_graph_step(12, 9, 3)
    pool.verify_graph_buffers = pool.decode_graph_buffers = True
    pool.invalidate_range(9, 12)
    for layer in range(2):
        k, v = pool.get(layer, 12)
        assert k[0, :9].eq(1).all() and k[0, 9:].eq(0).all() and v[0, 9:].eq(0).all()
    pool.invalidate_range(5, 5)  # empty: nothing changes
    assert pool.get(0, 12)[0][0, 5, 0, 0].item() == 1.0


def test_metadata_verbs_reject_bad_input_and_change_nothing() -> None:
    pool = pool16(128)
    ids = [pool.bind_request([1], 32), pool.bind_request([2], 48)]
    pool.activate_step(*ids)
    pool.shared_flashinfer_metadata([4, 4])
    for verb, args, exc in [
        (pool.build_flashinfer_metadata, ([10, 49],), ValueError),
        (pool.build_flashinfer_metadata, ([10],), ValueError),
        (pool.shared_flashinfer_metadata, (-1,), ValueError),
        (pool.seal_length, (33,), ValueError),
        (pool.seal_length, ([1.5, 2],), ValueError),
        (pool.truncate_to, (5, 4), ValueError),
        (pool.truncate_to, (5, 33), ValueError),
        (pool.invalidate_range, (5, 4), ValueError),
        (pool.invalidate_range, (-1, 4), ValueError),
        (pool.invalidate_range, (30, 40), ValueError),
        (pool.prepare_decode_graph_step, (33, 32), KvCacheExhaustedError),
        (pool.prepare_verify_graph_step, (12, 8, 0), ValueError),
        (pool.prepare_verify_graph_step, (12, 8, 3), ValueError),
        (pool.prepare_verify_graph_step, (34, 30, 4), KvCacheExhaustedError),
        (pool.verify_qo_indptr, (0, 3), ValueError),
        (pool.begin_prefetch_decode_graph_step, (20, 19, 3), ValueError),
        (pool.begin_prefetch_decode_graph_step, (40, 39, 2), ValueError),
        (pool.install_prefetched_step_metadata, ("meta", 3), ValueError),
        (pool.verify_graph_metadata, (), RuntimeError),
    ]:
        expect_unchanged(pool, exc, verb, *args)
    pool.unbind_requests()
    for verb, args in [(pool.shared_flashinfer_metadata, (1,)), (pool.seal_length, (1,)),
                       (pool.prepare_decode_graph_step, (1, 0)), (pool.truncate_to, (1, 1))]:
        with pytest.raises(RuntimeError, match="No request bound"):
            verb(*args)
    assert pool.current_step_metadata() is None


def test_metadata_validate_catches_what_flashinfer_does_not() -> None:
    good = FlashInferKvMetadata(torch.tensor([0, 2, 2], dtype=torch.int32), torch.tensor([3, 1], dtype=torch.int32),
                                torch.tensor([16, 0], dtype=torch.int32), 16)
    good.validate(num_pages=4)
    bad = [
        FlashInferKvMetadata(good.indptr, good.indices, torch.tensor([17, 0], dtype=torch.int32), 16),
        FlashInferKvMetadata(good.indptr, good.indices, torch.tensor([0, 0], dtype=torch.int32), 16),
        FlashInferKvMetadata(good.indptr, good.indices, torch.tensor([4, 1], dtype=torch.int32), 16),
        FlashInferKvMetadata(torch.tensor([0, 3, 2], dtype=torch.int32), good.indices, good.last_page_len, 16),
        FlashInferKvMetadata(good.indptr, good.indices.long(), good.last_page_len, 16),
    ]
    for meta in bad:
        with pytest.raises(ValueError):
            meta.validate(4)
    with pytest.raises(ValueError, match="outside the pool's 3 pages"):
        good.validate(num_pages=3)


def test_verify_csr_partial_rewrites_match_a_fresh_build() -> None:
    # The fixed verify CSR rewrites only from the first row whose page count changed; over many ragged rounds it
    # must always equal a CSR built from scratch, and never move.
    rng = np.random.default_rng(0)
    pool = pool16(16 * 64 * 5)
    ids = [pool.bind_request([1], 16 * 60) for _ in range(5)]
    pool.activate_step(*ids)
    starts = rng.integers(0, 40, size=5)
    pool.put(0, 0, ones(5, 40), ones(5, 40))
    addresses = None
    for _ in range(120):
        window = int(rng.integers(1, 6))
        meta = pool.prepare_verify_graph_step(starts + window, starts, window)
        fresh = pool.build_flashinfer_metadata(starts + window)
        n = int(fresh.indptr[-1])
        assert meta.indptr.tolist() == fresh.indptr.tolist()
        assert meta.indices[:n].tolist() == fresh.indices.tolist()
        assert meta.last_page_len.tolist() == fresh.last_page_len.tolist()
        addresses = addresses or ptrs(meta)
        assert ptrs(meta) == addresses
        starts = starts + rng.integers(1, window + 1, size=5)  # each row accepts its own number of tokens
    assert pool.consume_verify_graph_meta_realloc() is True and pool.consume_verify_graph_meta_realloc() is False


def test_write_indices_and_qo_indptr_are_fixed_per_shape_for_the_pool_life() -> None:
    pool = pool16(512)
    ids = [pool.bind_request([1], 64) for _ in range(3)]
    pool.activate_step(*ids[:2])
    pool.put(0, 0, ones(2, 8), ones(2, 8))
    pool.prepare_decode_graph_step(9, 8)
    decode2 = pool._graphs.decode.index
    pool.prepare_verify_graph_step(11, 8, 3)
    verify23 = pool._graphs.verify.index
    qo23 = pool.verify_qo_indptr(2, 3)
    pool.activate_step(*ids)  # batch 3: other buffers
    pool.put(0, 0, ones(3, 8), ones(3, 8))
    pool.prepare_decode_graph_step(9, 8)
    pool.prepare_verify_graph_step(12, 8, 4)
    assert pool._graphs.decode.index is not decode2 and pool._graphs.verify.index is not verify23
    assert pool.verify_qo_indptr(3, 4).tolist() == [0, 4, 8, 12]
    pool.activate_step(*ids[:2])  # back to batch 2: the very same tensors graphs captured
    pool.prepare_decode_graph_step(10, 9)
    pool.prepare_verify_graph_step(12, 9, 3)
    assert pool._graphs.decode.index is decode2 and pool._graphs.verify.index is verify23 and pool.verify_qo_indptr(2, 3) is qo23
    assert decode2.tolist() == pool.window_slot_indices(9, 1).tolist()


def test_graph_csr_moves_only_when_more_rows_are_reserved() -> None:
    pool = pool16(512)
    small = [pool.bind_request([1], 32), pool.bind_request([2], 32)]
    large = [pool.bind_request([3], 64), pool.bind_request([4], 64)]
    smaller = [pool.bind_request([5], 16), pool.bind_request([6], 16)]
    pool.activate_step(*small)
    first = ptrs(pool.prepare_verify_graph_step(4, 0, 4))
    assert pool.consume_verify_graph_meta_realloc() is True
    for rows in (smaller, large):  # any capacity: the same buffers
        pool.activate_step(*rows)
        assert ptrs(pool.prepare_verify_graph_step(4, 0, 4)) == first and not pool.consume_verify_graph_meta_realloc()
        assert ptrs(pool.prepare_decode_graph_step(5, 4)) == first
    pool.activate_step(*(large + small[:1]))  # three rows: moved, and reported
    assert ptrs(pool.prepare_verify_graph_step(4, 0, 4)) != first and pool.consume_verify_graph_meta_realloc()


def test_reference_attention_never_sees_a_rejected_tail() -> None:
    # Keys past the sealed length hold rejected drafts (left in place without zero_rejected_kv): attention over the
    # step CSR after truncate_to equals attention over a pool where they were never written.
    torch.manual_seed(0)
    pools = [pool16(64, zero_rejected_kv=False), pool16(64)]
    k, v = torch.randn(1, 24, 2, 16), torch.randn(1, 24, 2, 16)
    q = torch.randn(1, 4, 16)
    outs = []
    for pool, written in zip(pools, (24, 19)):
        pool.bind_requests(1, 32)
        pool.put(0, 0, k[:, :written], v[:, :written])
        if written == 24:
            assert pool.truncate_to(19, 24) is False  # no step CSR yet
        meta = pool.shared_flashinfer_metadata(19)
        outs.append(paged_attention(q, pool.key_layer(0).view(-1, 16, 2, 16), pool.value_layer(0).view(-1, 16, 2, 16),
                                    meta))
    assert torch.equal(outs[0], outs[1])  # one call on equal CSRs over equal slots (the tails are never read)


def test_graph_and_metadata_verbs_raise_after_close() -> None:
    pool = pool16()
    pool.bind_requests(1, 16)
    pool.close()
    for verb, args in ((pool.num_pages_for_length, (5,)), (pool.steps_until_page_boundary, (5,)),
                       (pool.first_cache_len_in_next_page_bucket, (1,)), (pool.shared_flashinfer_metadata, (1,)),
                       (pool.seal_length, (1,)), (pool.prepare_decode_graph_step, (1, 0)),
                       (pool.verify_qo_indptr, (1, 1)), (pool.current_step_metadata, ())):
        with pytest.raises(RuntimeError, match="closed"):
            verb(*args)
