"""KV fingerprints: float64 summaries of one bound request's K and V, for prefix-reuse debugging.

A request's written KV (positions ``[0, kv_len)``) is split at a token position ``boundary`` into
two regions (``REGIONS``):

======== ====================== ==================================================================
region   positions              in a warm request (bound with a radix match of ``boundary`` tokens)
======== ====================== ==================================================================
prefix   ``[0, boundary)``      reused: tree-owned pages another request computed
suffix   ``[boundary, kv_len)`` recomputed: written by this request's own forwards
======== ====================== ==================================================================

Per KV layer and region, ``KvStats`` holds the sum, the sum of squares and the sum of absolute
values of K and of V (one line per layer and region, so a divergence in one layer cannot cancel in
a global sum, and the first layer and region that differ can be named). Per logical page of one
layer, ``PageFingerprint`` holds the sums of squares of K and V of its written slots, in page-table
order, with the physical page it maps to: a page whose contents sit at the wrong position (a
swapped page-table entry) leaves the region sums unchanged but moves these rows.

K/V are read only through ``KvStore.read`` (the compute dtype, whatever the storage format); sums
run in float64 on the store's device, one gather per layer. Nothing here changes the pool; the
pool's ``kv_fingerprint``/``kv_block_fingerprints`` call these under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .bindings import Binding, BindingTable
from .checks import as_int, as_layer
from .errors import RequestOffloadedError
from .kv_store import KvStore
from .pages import page_slots

PREFIX = "prefix"
SUFFIX = "suffix"
REGIONS = (PREFIX, SUFFIX)


@dataclass(frozen=True)
class KvStats:
    """Float64 sums over ``num_values`` elements of K or V: ``sum`` (signed), ``sum_sq`` (of
    squares) and ``sum_abs`` (of absolute values). All 0.0 for an empty region."""

    sum: float
    sum_sq: float
    sum_abs: float
    num_values: int

    @staticmethod
    def of(x: torch.Tensor) -> KvStats:
        """The sums of every element of ``x`` (any shape), in float64."""
        d = x.to(torch.float64)
        sums = torch.stack([d.sum(), (d * d).sum(), d.abs().sum()]).tolist()
        return KvStats(sums[0], sums[1], sums[2], int(d.numel()))


@dataclass(frozen=True)
class RegionFingerprint:
    """K and V sums of one layer over the token positions ``[start, end)`` of region ``region``
    (``"prefix"`` or ``"suffix"``)."""

    region: str
    start: int
    end: int
    k: KvStats
    v: KvStats


@dataclass(frozen=True)
class LayerFingerprint:
    """One KV layer (the pool's layer index: on a hybrid model, its attention layers in order) with
    its two regions and the storage dtype its K/V were kept in (its name, e.g. ``"float32"``)."""

    layer: int
    storage_dtype: str
    prefix: RegionFingerprint
    suffix: RegionFingerprint

    @property
    def regions(self) -> tuple[RegionFingerprint, RegionFingerprint]:
        """``(prefix, suffix)``."""
        return self.prefix, self.suffix


@dataclass(frozen=True)
class KvFingerprint:
    """``KvCachePool.kv_fingerprint``: one request's written KV (``kv_len`` positions) split at
    ``boundary``, one ``LayerFingerprint`` per KV layer in order. ``matched_len`` is the request's
    tree-owned prefix when it was taken (the default boundary)."""

    request_id: int
    kv_len: int
    boundary: int
    matched_len: int
    page_size: int
    layers: tuple[LayerFingerprint, ...]


@dataclass(frozen=True)
class PageFingerprint:
    """One logical page of one layer: its index in the request's page table, the physical page it
    maps to, the region its first slot lies in, the written slots it holds (``page_size`` but for a
    partly written last page) and the float64 sums of squares of K and V over them."""

    logical_page: int
    physical_page: int
    region: str
    num_tokens: int
    k_sum_sq: float
    v_sum_sq: float


@dataclass(frozen=True)
class LayerPages:
    """``PageFingerprint`` rows of one layer, in page-table order."""

    layer: int
    pages: tuple[PageFingerprint, ...]


def _lookup(table: BindingTable, request_id: Any, verb: str) -> Binding:
    """The resident binding of ``request_id``: ValueError for an unknown id (as ``kv_len``),
    RequestOffloadedError for one whose private KV is in host memory."""
    b = None
    if not isinstance(request_id, bool) and isinstance(request_id, (int, np.integer)):
        b = table.get(int(request_id))
    if b is None:
        bound = [x.request_id for x in table]
        raise ValueError(f"{verb}: unknown request id {request_id!r}; bound ids are {bound} "
                         f"(fingerprint a request before it is finished or unbound)")
    if b.offload is not None:
        raise RequestOffloadedError(f"{verb}: request {b.request_id} is offloaded to host "
                                    f"memory; restore_request it before fingerprinting its KV")
    return b


def _written_slots(b: Binding, kv_len: int, page_size: int, device: torch.device) -> torch.Tensor:
    """int64 slot ids of positions ``[0, kv_len)`` of ``b``, on ``device``."""
    pages = b.page_ids[: -(-kv_len // page_size)]
    return torch.from_numpy(page_slots(pages, page_size)[:kv_len]).to(device)


def fingerprint(table: BindingTable, kv: KvStore, num_layers: int, page_size: int,
                storage_dtype: torch.dtype, request_id: Any,
                boundary: Any = None) -> KvFingerprint:
    """``KvCachePool.kv_fingerprint`` (see there) over the pool's ``table`` and ``kv``. Raises
    before reading anything; changes nothing."""
    b = _lookup(table, request_id, "kv_fingerprint")
    kv_len = table.kv_len_of(b)
    if boundary is None:
        boundary = min(b.matched_len, kv_len)
    boundary = as_int(boundary, "boundary", minimum=0, maximum=kv_len)
    slots = _written_slots(b, kv_len, page_size, kv.device)
    names = [str(f) for f in kv.formats] if not kv.direct else \
        [str(storage_dtype).removeprefix("torch.")] * num_layers
    layers = []
    for layer in range(num_layers):
        dtype_name = names[layer]
        k, v = kv.read(layer, slots)
        prefix = RegionFingerprint(PREFIX, 0, boundary, KvStats.of(k[:boundary]),
                                   KvStats.of(v[:boundary]))
        suffix = RegionFingerprint(SUFFIX, boundary, kv_len, KvStats.of(k[boundary:]),
                                   KvStats.of(v[boundary:]))
        layers.append(LayerFingerprint(layer, dtype_name, prefix, suffix))
    return KvFingerprint(b.request_id, kv_len, boundary, b.matched_len, page_size, tuple(layers))


def page_fingerprints(table: BindingTable, kv: KvStore, num_layers: int, page_size: int,
                      request_id: Any, layer: Any,
                      boundary: Any = None) -> tuple[PageFingerprint, ...]:
    """``KvCachePool.kv_block_fingerprints`` (see there) over the pool's ``table`` and ``kv``.
    Raises before reading anything; changes nothing."""
    b = _lookup(table, request_id, "kv_block_fingerprints")
    layer = as_layer(layer, num_layers)
    kv_len = table.kv_len_of(b)
    if boundary is None:
        boundary = min(b.matched_len, kv_len)
    boundary = as_int(boundary, "boundary", minimum=0, maximum=kv_len)
    num_pages = -(-kv_len // page_size)
    if num_pages == 0:
        return ()
    k, v = kv.read(layer, _written_slots(b, kv_len, page_size, kv.device))
    pad = num_pages * page_size - kv_len  # the last page's unwritten slots count as zeros
    rows = []
    for x in (k, v):
        d = x.to(torch.float64).reshape(kv_len, -1)
        d = torch.nn.functional.pad(d, (0, 0, 0, pad))
        rows.append((d * d).reshape(num_pages, -1).sum(dim=1).tolist())
    tokens = np.minimum(page_size, kv_len - np.arange(num_pages) * page_size)
    return tuple(
        PageFingerprint(i, int(b.page_ids[i]), PREFIX if i * page_size < boundary else SUFFIX,
                        int(tokens[i]), rows[0][i], rows[1][i])
        for i in range(num_pages))
