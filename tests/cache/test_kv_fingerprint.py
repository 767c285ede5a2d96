"""``KvCachePool.kv_fingerprint`` and ``kv_block_fingerprints`` against a float64 oracle kept by the test (what it
wrote at each position), read-only, with typed errors for bad input that change nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCachePool, PoolClosedError, RequestOffloadedError
from smile_llm.cache.kv_fingerprint import PREFIX, SUFFIX

from .snapshot import assert_same_state, expect_unchanged, pool_snapshot

PS, LAYERS, HKV, D = 4, 3, 2, 3
PROMPT_A = list(range(100, 111))  # 11 tokens: 2 full pages enter the tree
PROMPT_B = PROMPT_A[:9] + [7, 8, 9, 10]  # shares 9 tokens with A: matches its 2 pages (8 tokens)


def make_pool(dtype: torch.dtype = torch.float32, **kw) -> KvCachePool:
    return KvCachePool(num_layers=LAYERS, num_slots=64, num_kv_heads=HKV, head_dim=D, page_size=PS, dtype=dtype,
                       **kw)


def write(p: KvCachePool, rid: int, start: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K/V at positions [start, start + n) of every layer; returns them as [L, n, Hkv, D]."""
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(LAYERS, n, HKV, D, generator=gen)
    v = torch.randn(LAYERS, n, HKV, D, generator=gen) * 3
    p.activate_step(rid)
    for layer in range(LAYERS):
        p.put(layer, start, k[layer][None], v[layer][None])
    return k, v


def setup() -> tuple[KvCachePool, int, torch.Tensor, torch.Tensor]:
    """A finished request A cached 8 tokens; B matched them and wrote 5 more (13 positions, a partial last page).
    Returns the pool, B's id and B's K/V per position as the test wrote them ([L, 13, Hkv, D])."""
    p = make_pool()
    a = p.bind_request(PROMPT_A, 16)
    ka, va = write(p, a, 0, len(PROMPT_A), seed=1)
    p.finish_request(a, PROMPT_A)
    b = p.bind_request(PROMPT_B, 16)
    assert p.matched_prefix_len(b) == 8
    kb, vb = write(p, b, 8, 5, seed=2)
    p.check_invariants()
    return p, b, torch.cat([ka[:, :8], kb], dim=1), torch.cat([va[:, :8], vb], dim=1)


def sums(x: torch.Tensor) -> tuple[float, float, float]:
    d = x.double()
    return d.sum().item(), (d * d).sum().item(), d.abs().sum().item()


def test_region_sums_match_the_written_values_in_float64() -> None:
    p, b, k, v = setup()
    for boundary, expect in ((None, 8), (8, 8), (5, 5), (0, 0), (13, 13)):
        fp = p.kv_fingerprint(b) if boundary is None else p.kv_fingerprint(b, boundary=boundary)
        assert (fp.request_id, fp.kv_len, fp.boundary, fp.matched_len, fp.page_size) == (b, 13, expect, 8, PS)
        assert [lf.layer for lf in fp.layers] == list(range(LAYERS))
        for lf in fp.layers:
            assert lf.storage_dtype == "float32"
            assert (lf.prefix.region, lf.prefix.start, lf.prefix.end) == (PREFIX, 0, expect)
            assert (lf.suffix.region, lf.suffix.start, lf.suffix.end) == (SUFFIX, expect, 13)
            for region, rows in ((lf.prefix, slice(0, expect)), (lf.suffix, slice(expect, 13))):
                for got, want in ((region.k, k[lf.layer, rows]), (region.v, v[lf.layer, rows])):
                    assert (got.sum, got.sum_sq, got.sum_abs) == pytest.approx(sums(want), rel=1e-12, abs=1e-12)
                    assert got.num_values == want.numel()


def test_page_rows_follow_the_page_table_in_order() -> None:
    p, b, k, v = setup()
    page_ids = p._table.get(b).page_ids
    for layer in range(LAYERS):
        rows = p.kv_block_fingerprints(b, layer)
        assert [r.logical_page for r in rows] == [0, 1, 2, 3]  # 13 positions: 4 pages, the last holds 1
        assert [r.physical_page for r in rows] == page_ids[:4].tolist()
        assert [r.num_tokens for r in rows] == [4, 4, 4, 1]
        assert [r.region for r in rows] == [PREFIX, PREFIX, SUFFIX, SUFFIX]
        for r in rows:
            span = slice(4 * r.logical_page, 4 * r.logical_page + r.num_tokens)
            assert r.k_sum_sq == pytest.approx(sums(k[layer, span])[1], rel=1e-12)
            assert r.v_sum_sq == pytest.approx(sums(v[layer, span])[1], rel=1e-12)
    assert [r.region for r in p.kv_block_fingerprints(b, 0, boundary=5)] == [PREFIX, PREFIX, SUFFIX, SUFFIX]
    assert [r.region for r in p.kv_block_fingerprints(b, 0, boundary=0)] == [SUFFIX] * 4


def test_a_request_with_nothing_written_has_empty_regions_and_no_pages() -> None:
    p = make_pool()
    rid = p.bind_request([1, 2, 3], 8)
    fp = p.kv_fingerprint(rid)
    assert fp.kv_len == 0 and fp.boundary == 0
    assert all(lf.prefix.k.num_values == lf.suffix.v.num_values == 0 and lf.suffix.k.sum_sq == 0.0
               for lf in fp.layers)
    assert p.kv_block_fingerprints(rid, 0) == ()


def test_fingerprints_change_nothing() -> None:
    p, b, _, _ = setup()
    digest, before = p.state_digest(), pool_snapshot(p)
    p.kv_fingerprint(b)
    p.kv_fingerprint(b, boundary=3)
    for layer in range(LAYERS):
        p.kv_block_fingerprints(b, layer)
    assert p.state_digest() == digest
    assert_same_state(before, pool_snapshot(p))


@pytest.mark.parametrize("call, args, kwargs, exc, match", [
    ("kv_fingerprint", (999,), {}, ValueError, "unknown request id 999"),
    ("kv_fingerprint", (True,), {}, ValueError, "unknown request id True"),
    ("kv_fingerprint", ("1",), {}, ValueError, "unknown request id"),
    ("kv_fingerprint", (None,), {"boundary": -1}, ValueError, "boundary must be >= 0"),
    ("kv_fingerprint", (None,), {"boundary": 14}, ValueError, "boundary must be <= 13"),
    ("kv_fingerprint", (None,), {"boundary": 4.0}, ValueError, "boundary must be an int"),
    ("kv_block_fingerprints", (999, 0), {}, ValueError, "unknown request id"),
    ("kv_block_fingerprints", (None, -1), {}, ValueError, "layer must be >= 0"),
    ("kv_block_fingerprints", (None, LAYERS), {}, ValueError, f"layer must be <= {LAYERS - 1}"),
    ("kv_block_fingerprints", (None, "0"), {}, ValueError, "layer must be an int"),
    ("kv_block_fingerprints", (None, 0), {"boundary": 99}, ValueError, "boundary must be <= 13"),
])
def test_bad_input_raises_a_typed_error_and_changes_nothing(call, args, kwargs, exc, match) -> None:
    p, b, _, _ = setup()
    args = tuple(b if a is None else a for a in args)
    digest = p.state_digest()
    expect_unchanged(p, exc, getattr(p, call), *args, match=match, **kwargs)
    assert p.state_digest() == digest


def test_an_offloaded_or_closed_pool_request_raises_its_typed_error() -> None:
    p, b, _, _ = setup()
    handle = p.offload_request(b)
    digest = p.state_digest()
    expect_unchanged(p, RequestOffloadedError, p.kv_fingerprint, b, match="restore_request it")
    expect_unchanged(p, RequestOffloadedError, p.kv_block_fingerprints, b, 0, match="restore_request it")
    assert p.state_digest() == digest
    p.restore_request(b, handle)
    assert p.kv_fingerprint(b).kv_len == 13
    p.close()
    with pytest.raises(PoolClosedError):
        p.kv_fingerprint(b)
    with pytest.raises(PoolClosedError):
        p.kv_block_fingerprints(b, 0)


def test_fp8_storage_is_fingerprinted_in_the_compute_dtype_with_its_scale() -> None:
    """Reads go through the store's decoding: the sums are of ``stored * scale``, not of the raw bytes."""
    p = make_pool(torch.float8_e4m3fn, k_scale=0.5, v_scale=2.0)
    rid = p.bind_request(list(range(6)), 8)
    k, v = write(p, rid, 0, 6, seed=3)
    fp = p.kv_fingerprint(rid, boundary=4)
    for lf in fp.layers:
        assert lf.storage_dtype == "float8_e4m3fn"
        for got, x, scale in ((lf.prefix.k, k[lf.layer, :4], 0.5), (lf.suffix.v, v[lf.layer, 4:], 2.0)):
            stored = (x / scale).to(torch.float8_e4m3fn).to(torch.float32) * scale
            assert (got.sum, got.sum_sq, got.sum_abs) == pytest.approx(sums(stored), rel=1e-12)
            assert not math.isclose(got.sum_sq, sums(x)[1], rel_tol=1e-6)  # rounding to fp8 is visible
    rows = p.kv_block_fingerprints(rid, 1)
    assert np.allclose([r.v_sum_sq for r in rows],
                       [sums((v[1, s] / 2.0).to(torch.float8_e4m3fn).to(torch.float32) * 2.0)[1]
                        for s in (slice(0, 4), slice(4, 6))], rtol=1e-12)
