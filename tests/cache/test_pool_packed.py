"""A pool whose layers store K and V in different formats, packed low-bit ones included, against an oracle.

The oracle keeps every position's raw K/V as written and, for each query at position ``q``, reads the pages before
``q``'s page quantized (``codec.decode(codec.encode(page))``, a dense side as its dtype rounds each value) and ``q``'s
own page raw; attention in float64. The pool writes windows through ``kv_step`` (a prefill chunk over several pages,
decode steps, a verify window across a page boundary taken back by ``truncate_to``), and the torch backend attends
over each forward's view under its sub-row CSR: the outputs must match the oracle within float32's tolerance.
Invariants hold after every operation; refusals (a truncate into a quantized page, tails run out) change nothing;
offload and restore bring the values back bit for bit; a second request reads the first one's pages from the prefix
tree, quantized; page bytes and per-layer formats are reported as stored."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from smile_llm.attention.torch.backend import TorchBackend
from smile_llm.cache import KvCacheExhaustedError, KvCachePool, KvCacheLayout
from smile_llm.cache.codecs import codec_for
from smile_llm.cache.kv_dtype import KvFormat, kv_formats

from .snapshot import expect_unchanged

PS, H, D, HQ = 16, 2, 32, 4
FORMATS = kv_formats([{"k": "nvfp4", "v": "nvfp4"}, {"k": "int4", "v": "int2"},
                      {"k": "fp8_e4m3", "v": "bfloat16"}, "int3"], 4, torch.float32)


def make_pool(num_pages: int = 24, num_tails: int = 8) -> KvCachePool:
    return KvCachePool(len(FORMATS), num_pages * PS, H, D, PS, kv_formats=FORMATS, num_tails=num_tails,
                       compute_dtype=torch.float32)


def rounded(fmt: KvFormat, side: str, page: torch.Tensor) -> torch.Tensor:
    """What a complete page of ``fmt`` reads back as ([PS, H, D] float64)."""
    if fmt.packed:
        codec = codec_for(fmt.name, side, PS, H, D)
        return codec.decode(codec.encode(page[None].float()), torch.float64)[0]
    assert fmt.dtype is not None
    return page.to(fmt.dtype).to(torch.float64)


class Oracle:
    """Raw K/V of one row, position by position, per layer; attention as the packed semantics read it."""

    def __init__(self, capacity: int) -> None:
        self.k = torch.zeros(len(FORMATS), capacity, H, D, dtype=torch.float64)
        self.v = torch.zeros_like(self.k)

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer, start : start + len(k)] = k.double()
        self.v[layer, start : start + len(v)] = v.double()

    def keys(self, layer: int, q: int, side: str) -> torch.Tensor:
        """[q + 1, H, D] as a query at position q reads them."""
        fmt = getattr(FORMATS[layer], side)
        raw = (self.k if side == "k" else self.v)[layer]
        own = (q // PS) * PS
        parts = [rounded(fmt, side, raw[p : p + PS]) for p in range(0, own, PS)]
        mine = raw[own : q + 1]
        parts.append(mine if fmt.packed else rounded(fmt, side, mine))
        return torch.cat(parts)

    def attend(self, layer: int, q: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """[len(positions), HQ, D] float64."""
        out = []
        for i, pos in enumerate(positions):
            k, v = self.keys(layer, pos, "k"), self.keys(layer, pos, "v")
            k = k.repeat_interleave(HQ // H, dim=1)
            v = v.repeat_interleave(HQ // H, dim=1)
            s = torch.einsum("hd,phd->hp", q[i].double(), k) / math.sqrt(D)
            out.append(torch.einsum("hp,phd->hd", torch.softmax(s, -1), v))
        return torch.stack(out)


def forward(pool: KvCachePool, oracle: Oracle, start: int, n: int, gen: torch.Generator) -> None:
    """One forward of ``n`` tokens at ``start`` over every layer, checked against the oracle, then committed."""
    kv = pool.kv_step(start, n)
    meta, qo = kv.attention_csr()
    backend = TorchBackend()
    backend.plan(meta, num_qo_heads=HQ, num_kv_heads=H, head_dim=D, qo_indptr=qo, causal=True,
                 q_dtype=torch.float32, kv_dtype=pool.dtype)
    for layer in range(len(FORMATS)):
        k = torch.randn(1, n, H, D, generator=gen) * torch.linspace(0.5, 4, D)  # channels of different size
        v = torch.randn(1, n, H, D, generator=gen)
        q = torch.randn(n, HQ, D, generator=gen)
        kv.write(layer, k, v)
        oracle.write(layer, start, k[0], v[0])
        out = backend.run(q, kv.key_pages(layer), kv.value_pages(layer))
        want = oracle.attend(layer, q, list(range(start, start + n)))
        torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=2e-5)
    kv.commit()
    pool.check_invariants()


def test_every_window_reads_what_the_oracle_reads() -> None:
    pool = make_pool()
    gen = torch.Generator().manual_seed(0)
    rid = pool.bind_request(list(range(37)), 96)
    pool.activate_step(rid)
    oracle = Oracle(96)
    forward(pool, oracle, 0, 37, gen)  # a prefill over three pages: two complete, one partial
    for pos in range(37, 44):  # decode steps inside page 2
        forward(pool, oracle, pos, 1, gen)
    forward(pool, oracle, 44, 7, gen)  # a verify window across the boundary at 48
    pool.truncate_to(46, 51)  # two drafts kept: page 2 is partial again, page 3 unwritten
    pool.check_invariants()
    forward(pool, oracle, 46, 5, gen)  # the next window completes page 2 from its raw values
    forward(pool, oracle, 51, 1, gen)
    assert pool.kv_len(rid) == 52


def test_reads_and_the_tree_see_quantized_complete_pages() -> None:
    pool = make_pool()
    gen = torch.Generator().manual_seed(1)
    prompt = list(range(40))
    rid = pool.bind_request(prompt, 48)
    pool.activate_step(rid)
    oracle = Oracle(48)
    forward(pool, oracle, 0, 40, gen)
    for layer in range(len(FORMATS)):  # get() reads what a query past the pages would
        k, v = pool.get(layer, 40)
        torch.testing.assert_close(k[0].double(), oracle.keys(layer, 40, "k")[:40], atol=0, rtol=0)
        torch.testing.assert_close(v[0].double(), oracle.keys(layer, 40, "v")[:40], atol=0, rtol=0)
    pool.finish_request(rid, prompt)  # two complete pages go to the tree
    pool.check_invariants()
    assert pool.bind_with_prefix(prompt + [99], 64) == 32  # (binds and activates)
    k, _ = pool.get(0, 32)
    torch.testing.assert_close(k[0].double(), oracle.keys(0, 32, "k")[:32], atol=0, rtol=0)


def test_refusals_change_nothing() -> None:
    pool = make_pool(num_tails=1)
    gen = torch.Generator().manual_seed(2)
    rid = pool.bind_request(list(range(40)), 80)
    pool.activate_step(rid)
    forward(pool, Oracle(80), 0, 40, gen)  # a long window: only its first and last pages stay raw
    # into page 1, completed by the prefill and quantized
    expect_unchanged(pool, ValueError, pool.truncate_to, 20, 40, match="quantized and holds no raw values")
    other = pool.bind_request(list(range(40)), 80)
    pool.activate_step(other)
    # needs a tail for its partial last page: the only one is taken
    expect_unchanged(pool, KvCacheExhaustedError, pool.kv_step, 0, 40, match="tails")


def test_offload_and_restore_bring_the_values_back() -> None:
    pool = make_pool()
    gen = torch.Generator().manual_seed(3)
    rid = pool.bind_request(list(range(30)), 48)
    pool.activate_step(rid)
    forward(pool, Oracle(48), 0, 30, gen)
    before = [pool.get(layer, 30) for layer in range(len(FORMATS))]
    handle = pool.offload_request(rid)
    assert handle.nbytes > 0
    pool.check_invariants()
    pool.restore_request(rid, handle)
    pool.check_invariants()
    pool.activate_step(rid)
    for layer, (k, v) in enumerate(before):
        k2, v2 = pool.get(layer, 30)
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_formats_and_bytes_as_stored() -> None:
    pool = make_pool()
    assert [pool.dtype_for_layer(i) for i in range(4)] == ["nvfp4", "k=int4, v=int2", "k=fp8_e4m3, v=bfloat16",
                                                          "int3"]
    layout = KvCacheLayout(4, H, D, 1, 64)
    sizes = layout.layer_page_bytes(FORMATS, PS)
    assert sizes == [(pool.k_block_stride_bytes_for_layer(i), pool.v_block_stride_bytes_for_layer(i))
                     for i in range(4)]
    assert sizes[2] == (PS * H * D * 1, PS * H * D * 2)  # FP8 and bfloat16 elements
    assert sizes[0][0] == codec_for("nvfp4", "k", PS, H, D).page_bytes
    assert layout.page_bytes(FORMATS, PS) == sum(k + v for k, v in sizes)
    assert not pool.direct and pool.packed and pool.dtype == torch.float32
    with pytest.raises(ValueError, match="one buffer only"):
        pool.key_cache
    rid = pool.bind_request(list(range(16)), 32)
    pool.activate_step(rid)
    oracle = Oracle(32)
    forward(pool, oracle, 0, 16, torch.Generator().manual_seed(4))  # page 0 complete, its tail kept
    page = int(pool._table.get(rid).page_ids[0])
    k_bytes, v_bytes = pool.read_page(0, page)
    assert len(k_bytes) == sizes[0][0] and len(v_bytes) == sizes[0][1]
    pool.write_page(0, page, k_bytes, v_bytes)  # its bytes back: the page reads quantized, no tail left
    k, v = pool.get(0, 16)
    assert torch.equal(k[0].double(), oracle.keys(0, 16, "k")[:16])
    assert torch.equal(v[0].double(), oracle.keys(0, 16, "v")[:16])
    with pytest.raises(ValueError, match="16 bytes; one page of one layer is"):
        pool.write_page(0, page, k_bytes[:16], v_bytes)


@pytest.mark.parametrize("kv_dtype, message", [
    ("int5", "kv_dtype must be one of"),
    (["int4"], "lists 1 formats"),
    ({"k": "int4"}, "exactly the keys"),
])
def test_bad_formats_are_refused(kv_dtype: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        kv_formats(kv_dtype, 2, torch.float32)


def test_a_format_the_geometry_does_not_fit_is_refused_before_anything_is_allocated() -> None:
    with pytest.raises(ValueError, match="multiple"):
        KvCachePool(1, 64, 1, 24, 16, kv_formats=kv_formats("nvfp4", 1, torch.float32))
    with pytest.raises(ValueError, match="page_size"):  # int3 keys: 8 codes in 3 bytes along a page's tokens
        KvCachePool(1, 64, 1, 32, 4, kv_formats=kv_formats("int3", 1, torch.float32))
    assert np.array_equal(KvCachePool(1, 64, 1, 32, 16).kv_formats[0].k.name, "float32")


def test_the_static_budget_sizes_packed_pools_by_their_real_bytes() -> None:
    """On CUDA a pool is sized from free memory by the bytes each layer's pages really take (``kv_cost``): nvfp4
    keys and values cost 0.5625 bytes an element plus a float32 scale per (page, head), the tails are set aside
    first."""
    from smile_llm.cache.factories import kv_cost

    layout = KvCacheLayout(4, H, D, 2, 256)
    dense, none = kv_cost(layout, torch.bfloat16, PS, {})
    assert (dense, none) == (2 * 4 * H * D * 2, 0)
    nv = kv_formats("nvfp4", 4, torch.float32)
    per_token, reserved = kv_cost(layout, torch.bfloat16, PS,
                                  {"kv_formats": nv, "num_tails": 8, "compute_dtype": torch.bfloat16})
    per_page = PS * H * D * 9 // 16 + 4 * H  # codes and FP8 scales, and the (page, head) scale
    assert per_token == -(-(2 * 4 * per_page) // PS)
    assert reserved == 8 * 2 * 4 * PS * H * D * 2  # a raw bfloat16 page of every packed layer and side
    assert dense / per_token > 3.5  # bfloat16 -> nvfp4


# ------------------------------------------------------------------------------------------------ found in review
def _packed_pool(kv_dtype, num_tails: int) -> KvCachePool:
    from smile_llm.cache.kv_dtype import kv_formats

    return KvCachePool(1, 8 * 16, 1, 32, 16, kv_formats=kv_formats(kv_dtype, 1, torch.float32),
                       num_tails=num_tails, compute_dtype=torch.float32)


def _write(pool: KvCachePool, rid: int, n: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    pool.activate_step(rid)
    kv = pool.kv_step(0, n)
    kv.write(0, torch.randn(1, n, 1, 32, generator=g), torch.randn(1, n, 1, 32, generator=g))
    kv.commit()


def test_a_restore_short_of_tails_for_packed_values_changes_nothing() -> None:
    """Dense keys, packed values: the restore counts the values' tails too, and refuses before it copies."""
    pool = _packed_pool({"k": "float32", "v": "int4"}, num_tails=2)
    a = pool.bind_request(list(range(20)), 32)
    _write(pool, a, 20, 0)
    handle = pool.offload_request(a)
    b = pool.bind_request(list(range(100, 120)), 32)
    _write(pool, b, 20, 1)  # takes the tails the restore would need
    digest = pool.state_digest()
    with pytest.raises(KvCacheExhaustedError):
        pool.restore_request(a, handle)
    assert pool.state_digest() == digest
    pool.check_invariants()


def test_sealing_below_the_cached_prefix_leaves_the_trees_pages_quantized() -> None:
    pool = _packed_pool("int4", num_tails=4)
    prompt = list(range(40))
    a = pool.bind_request(prompt, 48)
    _write(pool, a, 40, 0)
    pool.finish_request(a, prompt)
    b = pool.bind_request(prompt + [7], 64)
    assert pool.matched_prefix_len(b) == 32
    pool.activate_step(b)
    pool.seal_length(0)
    assert pool.kv_len(b) == 32
    pool.check_invariants()


def test_a_page_a_move_completed_enters_the_tree_quantized() -> None:
    pool = _packed_pool("int4", num_tails=4)
    rid = pool.bind_request(list(range(20)), 32)
    _write(pool, rid, 20, 0)
    pool.move_kv([[3]], [[5]])  # rewrites a position of the complete first page
    pool.finish_request(rid, list(range(20)))
    pool.check_invariants()
