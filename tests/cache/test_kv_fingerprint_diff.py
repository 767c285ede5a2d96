"""``compare_kv`` names the first layer, region and page where two fingerprints of the same tokens differ: a
one-element corruption of a private page (written through ``write_page``) or of a tree-owned page (written into the
store's buffer), two swapped pages (their contents, or two entries of a binding's page list: the region sums stay
equal, the per-page rows move); within the tolerance it says they agree."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCachePool
from smile_llm.cache.kv_fingerprint import PREFIX, SUFFIX, KvFingerprint, KvStats, LayerPages
from smile_llm.cache.kv_fingerprint_diff import (
    ACCUMULATION_EPS,
    PAGE_STATISTIC,
    ROUNDING_EPS,
    compare_kv,
    relative_tolerance,
)

PS, LAYERS, HKV, D = 4, 4, 2, 8
PROMPT = list(range(50, 70))  # 20 tokens


def snapshot(p: KvCachePool, rid: int) -> tuple[KvFingerprint, tuple[LayerPages, ...]]:
    fp = p.kv_fingerprint(rid)
    return fp, tuple(LayerPages(layer, p.kv_block_fingerprints(rid, layer)) for layer in range(LAYERS))


def setup() -> tuple[KvCachePool, int]:
    """Request A cached 12 tokens (3 pages); B matched them and wrote positions [12, 20) (2 private pages)."""
    p = KvCachePool(num_layers=LAYERS, num_slots=128, num_kv_heads=HKV, head_dim=D, page_size=PS)
    gen = torch.Generator().manual_seed(0)
    a = p.bind_request(PROMPT[:13], 16)
    p.activate_step(a)
    for layer in range(LAYERS):
        p.put(layer, 0, torch.randn(1, 13, HKV, D, generator=gen), torch.randn(1, 13, HKV, D, generator=gen))
    p.finish_request(a, PROMPT[:13])
    b = p.bind_request(PROMPT, 24)
    assert p.matched_prefix_len(b) == 12
    p.activate_step(b)
    for layer in range(LAYERS):
        p.put(layer, 12, torch.randn(1, 8, HKV, D, generator=gen), torch.randn(1, 8, HKV, D, generator=gen))
    return p, b


def compare(p: KvCachePool, rid: int, ref: tuple[KvFingerprint, tuple[LayerPages, ...]]):
    fp, pages = snapshot(p, rid)
    return compare_kv(fp, ref[0], pages, ref[1])


def test_identical_fingerprints_agree() -> None:
    p, b = setup()
    ref = snapshot(p, b)
    result = compare(p, b, ref)
    assert result.agree and result.divergence is None and result.worst_ratio == 0.0
    assert "agree" in result.describe()


def test_a_one_element_corruption_of_a_private_page_names_its_layer_region_and_page() -> None:
    p, b = setup()
    ref = snapshot(p, b)
    pages = p._table.get(b).page_ids
    k_bytes, v_bytes = p.read_page(2, int(pages[4]))  # logical page 4: positions [16, 20), suffix
    k = torch.frombuffer(bytearray(k_bytes), dtype=torch.float32).clone()
    k[5] += 0.5  # one element of one page of layer 2
    p.write_page(2, int(pages[4]), k, v_bytes)
    d = compare(p, b, ref).divergence
    assert d is not None
    assert (d.layer, d.region, d.tensor, d.logical_page, d.physical_page) == (2, SUFFIX, "k", 4, int(pages[4]))
    assert d.reference_physical_page == int(pages[4])
    assert abs(d.value - d.reference) > d.tolerance > 0
    assert "layer 2, suffix region, logical page 4" in d.describe()


def test_a_corrupted_tree_page_names_the_prefix_region() -> None:
    p, b = setup()
    ref = snapshot(p, b)
    page = int(p._table.get(b).page_ids[1])  # tree-owned: write_page refuses it, so write the buffer itself
    with pytest.raises(ValueError, match="tree"):
        p.write_page(1, page, *p.read_page(1, page))
    p.value_cache[3, page * PS + 2, 1, 7] *= -1.0  # a sign flip: sums move, sums of squares do not
    result = compare(p, b, ref)
    d = result.divergence
    assert d is not None and (d.layer, d.region, d.tensor, d.statistic) == (3, PREFIX, "v", "sum")
    assert d.logical_page is None  # no page's sum of squares moved
    p.value_cache[3, page * PS + 2, 1, 7] *= 3.0
    d = compare(p, b, ref).divergence
    assert d is not None and (d.layer, d.region, d.logical_page, d.physical_page) == (3, PREFIX, 1, page)


def test_swapped_page_contents_move_the_page_rows_but_not_the_region_sums() -> None:
    p, b = setup()
    ref = snapshot(p, b)
    pages = [int(x) for x in p._table.get(b).page_ids[3:5]]  # the two private pages, logical 3 and 4
    for layer in range(LAYERS):
        first, second = p.read_page(layer, pages[0]), p.read_page(layer, pages[1])
        p.write_page(layer, pages[0], *second)
        p.write_page(layer, pages[1], *first)
    fp, _ = snapshot(p, b)
    assert compare_kv(fp, ref[0]).agree  # region sums alone cannot see it
    d = compare(p, b, ref).divergence
    assert d is not None
    assert (d.layer, d.region, d.statistic, d.logical_page, d.physical_page) == (0, SUFFIX, PAGE_STATISTIC, 3,
                                                                                 pages[0])


def test_two_swapped_page_table_entries_name_the_first_misplaced_page() -> None:
    p, b = setup()
    ref = snapshot(p, b)
    binding = p._table.get(b)
    original = binding.page_ids.copy()
    binding.page_ids[[0, 2]] = binding.page_ids[[2, 0]]  # logical pages 0 and 2 of the reused prefix swapped
    try:
        d = compare(p, b, ref).divergence
        assert d is not None
        assert (d.layer, d.region, d.statistic, d.logical_page) == (0, PREFIX, PAGE_STATISTIC, 0)
        assert (d.physical_page, d.reference_physical_page) == (int(original[2]), int(original[0]))
    finally:
        binding.page_ids[:] = original
    p.check_invariants()
    assert compare(p, b, ref).agree


def fingerprint(scale: float = 1.0, layers: int = 2, dtype: str = "float32", boundary: int = 4) -> KvFingerprint:
    """A synthetic fingerprint whose every statistic is ``scale`` times a fixed value."""
    from smile_llm.cache.kv_fingerprint import LayerFingerprint, RegionFingerprint

    def stats(x: float) -> KvStats:
        return KvStats(x * scale, 10.0 * x * scale, 3.0 * x * scale, 64)

    return KvFingerprint(1, 8, boundary, 4, 4, tuple(
        LayerFingerprint(i, dtype, RegionFingerprint(PREFIX, 0, boundary, stats(1.0), stats(2.0)),
                         RegionFingerprint(SUFFIX, boundary, 8, stats(3.0), stats(4.0)))
        for i in range(layers)))


def test_the_tolerance_comes_from_the_dtypes_and_the_magnitude() -> None:
    eps32 = torch.finfo(torch.float32).eps
    eps_bf16 = torch.finfo(torch.bfloat16).eps
    assert relative_tolerance("float32") == pytest.approx((ACCUMULATION_EPS + ROUNDING_EPS) * eps32)
    assert relative_tolerance("bfloat16") == pytest.approx(ACCUMULATION_EPS * eps32 + ROUNDING_EPS * eps_bf16)
    # K/V a bfloat16 model computed, kept in float32: its roundings are bfloat16's
    assert relative_tolerance("float32", torch.bfloat16) == relative_tolerance("bfloat16")
    assert relative_tolerance("float8_e4m3fn", slack=2.0) == pytest.approx(
        2 * (ACCUMULATION_EPS * eps32 + ROUNDING_EPS * 0.125))
    rel = relative_tolerance("float32")
    within, beyond = fingerprint(1 + 0.5 * rel), fingerprint(1 + 1.5 * rel)
    result = compare_kv(within, fingerprint())
    assert result.agree and 0.4 < result.worst_ratio < 0.6 and result.relative_tolerance == rel
    d = compare_kv(beyond, fingerprint()).divergence
    # the signed sum (1) moved 0.5 of its tolerance, which is relative to the larger sum of |x| (3); that sum moved 1.5
    assert d is not None and (d.layer, d.region, d.tensor, d.statistic) == (0, PREFIX, "k", "sum_abs")
    assert d.tolerance == pytest.approx(rel * 3.0 * (1 + 1.5 * rel))
    assert compare_kv(beyond, fingerprint(), slack=2.0).agree
    assert compare_kv(fingerprint(1 + 100 * rel, dtype="bfloat16"), fingerprint(dtype="bfloat16")).agree


def test_non_finite_values_differ_unless_both_sides_hold_the_same() -> None:
    nan = fingerprint(math.nan)
    assert compare_kv(nan, nan).agree
    d = compare_kv(nan, fingerprint()).divergence
    assert d is not None and d.layer == 0 and d.region == PREFIX and math.isnan(d.value)
    assert compare_kv(fingerprint(math.inf), fingerprint(math.inf)).agree
    assert not compare_kv(fingerprint(math.inf), fingerprint(-math.inf)).agree


@pytest.mark.parametrize("other, kwargs, match", [
    (fingerprint(boundary=5), {}, "boundary 4 vs 5"),
    (fingerprint(layers=3), {}, "2 and 3 layers"),
    (fingerprint(), {"slack": 0.0}, "slack must be a finite number > 0"),
    (fingerprint(), {"slack": math.nan}, "slack must be a finite number > 0"),
    (fingerprint(), {"compute_dtype": "int8"}, "not a floating dtype"),
    (fingerprint(), {"compute_dtype": "float33"}, "not a torch dtype"),
])
def test_fingerprints_of_different_kv_or_bad_settings_raise(other, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        compare_kv(fingerprint(), other, **kwargs)


def test_page_rows_of_different_lengths_raise() -> None:
    p, b = setup()
    fp, pages = snapshot(p, b)
    short = tuple(dataclasses.replace(lp, pages=lp.pages[:-1]) for lp in pages)
    with pytest.raises(ValueError, match="5 and 4 page rows"):
        compare_kv(fp, fp, pages, short)
    assert np.isfinite([r.k_sum_sq for lp in pages for r in lp.pages]).all()
