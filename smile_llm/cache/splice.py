"""SpliceVerbs: copy one bound request's written KV into another request's private pages, shifted by
a whole number of pages, its keys turned by a caller's transform (``KvCachePool.splice_kv``).

A registered segment (``docs/segments.md``) is a binding that holds the segment's KV at positions
``[0, N)``: its whole pages in the prefix tree, locked by it, and its last partial page private. A
request that names the segment at offset ``M`` gets the KV at ``[M, M + N)`` of its own private
pages, written here: K read from the source, turned by ``rotate_k(layer, k, M)`` (the model's RoPE
delta, ``models/rope_delta.py``) and V copied, through ``KvStore.read`` / ``KvStore.write`` (so
every storage format keeps its contract). At ``M = 0`` the request shares the segment's whole pages
through an ordinary prefix match and a splice copies the partial last page only, unturned.

Region table of the destination row around one splice (positions in tokens)::

    [0, matched_len)                 tree-owned pages, never written
    [matched_len, dst_start)         written KV (dst_start == kv_len: a splice appends)
    [dst_start, dst_start + length)  written here; kv_len moves to its end once every layer is
                                     written
    [dst_start + length, capacity)   private pages, unwritten

The source keeps its pages, locks and ``kv_len``; the destination's page table does not change (its
capacity must already cover the splice: ``grow_request`` first). Every check runs before the first
write, and ``kv_len`` moves only after the last: a transform that raises leaves K/V written past
``kv_len`` only, where nothing reads it, and the pool's digest unchanged. Not locked itself: the
pool delegates to it under its lock.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from .binder import Binder
from .bindings import Binding
from .checks import as_int
from .errors import KvCacheExhaustedError, RequestOffloadedError
from .kv_store import KvStore


class KeyTransform(Protocol):
    """``rotate_k(layer, k, delta)``: keys ``k`` ``[N, Hkv, D]`` (compute dtype) of KV layer
    ``layer`` read at positions ``p`` as the keys at ``p + delta``; the same shape (any float dtype,
    cast to the storage on write)."""

    def __call__(self, layer: int, k: torch.Tensor, delta: int) -> torch.Tensor: ...


class SpliceVerbs:
    """The splice verb of one pool over its ``binder`` (pages, tree, bindings) and K/V ``kv``."""

    def __init__(self, binder: Binder, kv: KvStore, num_layers: int) -> None:
        self._binder, self._kv, self._num_layers = binder, kv, num_layers
        self._table, self._page_size = binder.table, binder.page_size

    def _resident(self, request_id: Any, name: str) -> Binding:
        b = None
        if not isinstance(request_id, bool) and isinstance(request_id, (int, np.integer)):
            b = self._table.get(int(request_id))
        if b is None:
            bound = [x.request_id for x in self._table]
            raise ValueError(f"splice_kv: {name} {request_id!r} is not a bound request; bound ids "
                             f"are {bound}")
        if b.offload is not None:
            raise RequestOffloadedError(f"splice_kv: {name} {b.request_id} is offloaded to host "
                                        f"memory; restore_request it first")
        return b

    def _slots(self, b: Binding, start: int, length: int) -> torch.Tensor:
        """Physical slots of positions ``[start, start + length)`` of ``b``, on the pool's
        device."""
        pos = np.arange(start, start + length, dtype=np.int64)
        slots = b.page_ids[pos // self._page_size] * self._page_size + pos % self._page_size
        return torch.from_numpy(slots).to(self._kv.device)

    def splice_kv(self, request_id: int, dst_start: int, source_id: int, src_start: int,
                  length: int, rotate_k: KeyTransform | None = None) -> int:
        """Write positions ``[src_start, src_start + length)`` of bound request ``source_id`` (a
        registered segment's binding) into positions ``[dst_start, dst_start + length)`` of bound
        request ``request_id``, on every layer: V copied, K turned by
        ``rotate_k(layer, k, dst_start - src_start)`` (None, or a shift of 0: copied unturned). The
        shift must be a whole number of pages, the splice appends (``dst_start`` is the request's
        ``kv_len``), fits its bound capacity, and reads only written source positions; then the
        request's ``kv_len`` becomes ``dst_start + length``. Returns ``length``.

        ValueError for an unknown id, the same id twice, a shift that is not a multiple of
        ``page_size``, ``dst_start`` other than ``kv_len``, source positions past the source's
        ``kv_len``, a bad ``rotate_k`` (not callable, or a result of another shape), a pool with a
        packed low-bit layer (its pages are written a window at a time);
        RequestOffloadedError for an offloaded request; KvCacheExhaustedError past the request's
        capacity (``grow_request`` it first). Nothing changes then (a bad transform's result is
        found after writes past ``kv_len``, which nothing reads)."""
        dst = self._resident(request_id, "request_id")
        src = self._resident(source_id, "source_id")
        if dst is src:
            raise ValueError(f"splice_kv: request_id and source_id are both {dst.request_id}; a "
                             f"request cannot be spliced into itself")
        dst_start = as_int(dst_start, "dst_start")
        src_start = as_int(src_start, "src_start")
        length = as_int(length, "length")
        if self._kv.packed:
            raise ValueError("splice_kv: this pool stores some layer in a packed low-bit format, "
                             "written a whole window at a time; splices need dense storage")
        if rotate_k is not None and not callable(rotate_k):
            raise ValueError(f"rotate_k must be None or a callable (layer, k, delta) -> k, got "
                             f"{type(rotate_k).__name__}")
        ps = self._page_size
        delta = dst_start - src_start
        if delta % ps:
            raise ValueError(f"splice_kv: the shift {delta} (dst_start {dst_start} - src_start "
                             f"{src_start}) is not a multiple of page_size {ps}; place the segment "
                             f"at a page-aligned offset")
        kv_len = self._table.kv_len_of(dst)
        if dst_start != kv_len:
            raise ValueError(f"splice_kv: request {dst.request_id} has kv_len {kv_len}; a splice "
                             f"appends there (dst_start {dst_start})")
        if dst_start + length > dst.capacity:
            raise KvCacheExhaustedError(
                f"splice_kv: positions [{dst_start}, {dst_start + length}) pass request "
                f"{dst.request_id}'s capacity {dst.capacity}; grow_request it first")
        src_len = self._table.kv_len_of(src)
        if src_start + length > src_len:
            raise ValueError(f"splice_kv: source {src.request_id} has {src_len} written positions; "
                             f"[{src_start}, {src_start + length}) is past them")
        if length == 0:
            return 0
        src_slots = self._slots(src, src_start, length)
        dst_slots = self._slots(dst, dst_start, length)
        turn = rotate_k if delta else None
        for layer in range(self._num_layers):
            k, v = self._kv.read(layer, src_slots)  # [length, Hkv, D], compute dtype
            if turn is not None:
                turned = turn(layer, k, delta)
                if not isinstance(turned, torch.Tensor) or turned.shape != k.shape:
                    raise ValueError(f"rotate_k returned {getattr(turned, 'shape', turned)!r} for "
                                     f"keys of shape {tuple(k.shape)}; it must keep the shape")
                k = turned
            self._kv.write(layer, dst_slots, k, v)
        self._table.kv_len[dst.row] = dst_start + length
        return length
