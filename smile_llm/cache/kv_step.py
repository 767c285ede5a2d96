"""KvStep: one forward's KV write window over the active step, validated once by
``KvCachePool.kv_step``.

The pool checks the window once, under its lock: the active rows, their capacity, that no row writes
below its matched prefix, and the write index (computed once, or a prepared CUDA-graph index
buffer). Each layer then writes through ``write``, a plain index copy into that layer's buffers with
no lock and no checks, and attention reads the per-layer paged views and the scales the handle
carries. ``commit`` records the write in ``kv_len`` once, after the forward succeeded; a forward
that raises commits nothing, so ``kv_len`` never covers KV that was not computed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from .kv_store import KvStore
from .kv_window import WindowPlan
from .metadata import FlashInferKvMetadata
from .step import ActiveStep


class KvStep:
    """The validated write window ``[start_b, start_b + seqlen)`` of every active row, for one
    forward.

    ``write(layer, k, v)`` trusts its arguments: ``k``/``v`` are ``[B, seqlen, Hkv, D]``
    floating-point tensors on the pool's device that share no memory with the pool (the model's own
    projections); it stores them in the layer's formats (FP8 stores ``x / scale``; a packed layer
    keeps raw tails and quantizes the pages the window completes). Attention then reads
    ``key_pages(layer)``/``value_pages(layer)`` ``[num_pages, page_size, Hkv, D]`` with
    ``k_scale``/``v_scale``, under the CSR of ``attention_csr``: a direct pool's own storage and
    the step CSR (``attention_csr`` None), or else this forward's view of the layer in the compute
    dtype (scales 1.0) and the view's CSR over its sub-rows (``cache.kv_window``).

    The handle is valid while its step stays active and the pool open; the single driver thread that
    owns the step must not unbind, activate or close in between (writes are not checked; ``commit``
    raises then). ``commit`` records the write (a row with ``start <= kv_len`` gets
    ``kv_len = max(kv_len, start + seqlen)``; a gap moves nothing); it is idempotent. A handle over
    a decode prefetch's scratch index records nothing: those slots are not the rows'.
    """

    __slots__ = ("active", "batch", "seqlen", "index", "records", "k_scale", "v_scale", "committed",
                 "plan", "_window", "_kv", "_n", "_on_commit", "_windows", "_views", "_csr")

    def __init__(self, kv: KvStore, active: ActiveStep, window: np.ndarray | int, seqlen: int,
                 index: torch.Tensor, records: bool, on_commit: Callable[[KvStep], None],
                 plan: WindowPlan | None = None) -> None:
        self.active = active  # the step the window was validated against
        self.batch, self.seqlen = active.batch, seqlen
        self.index = index  # int64[B * seqlen] on the pool's device, row-major
        self.records = records  # whether commit advances kv_len
        direct = plan is None
        self.k_scale = kv.k_scale if direct else 1.0
        self.v_scale = kv.v_scale if direct else 1.0
        self.committed = False
        self.plan = plan  # the window's plan on a pool that is not direct (kv_window)
        self._window = window  # an int when every row starts there (the step's scalar fast path)
        self._kv = kv
        self._n = active.batch * seqlen
        self._on_commit = on_commit
        # layer -> the window it wrote (until its view is made), and its view (until V is read)
        self._windows: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._views: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._csr: tuple[FlashInferKvMetadata, torch.Tensor] | None = None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` ``[B, seqlen, Hkv, D]`` into ``layer`` (``0 <= layer < num_layers``) at
        the window's slots. No lock and no checks (see the class docstring); kv_len moves only at
        ``commit``."""
        shape = (self._n, *self._kv.head_shape)
        k, v = k.reshape(shape), v.reshape(shape)
        if self.plan is None:
            self._kv.write(layer, self.index, k, v)
        else:
            self._kv.write_window(layer, self.plan, self.index, k, v)
            self._windows[layer] = (k, v)
            self._views.pop(layer, None)

    def _view(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``layer``'s view of K and V, made once after its write."""
        assert self.plan is not None
        view = self._views.get(layer)
        if view is None:
            window = self._windows.pop(layer, None)
            if window is None:
                raise RuntimeError(f"layer {layer}'s view is made from this forward's write of it; "
                                   f"write the layer first")
            view = self._views[layer] = self._kv.window_view(layer, self.plan, *window)
        return view

    def key_pages(self, layer: int) -> torch.Tensor:
        """``[num_pages, page_size, Hkv, D]`` of ``layer``'s K: the storage (direct pool), or this
        forward's view of it in the compute dtype (read after ``write``)."""
        if self.plan is None:
            return self._kv.k_pages[layer]
        return self._view(layer)[0]

    def value_pages(self, layer: int) -> torch.Tensor:
        """``[num_pages, page_size, Hkv, D]`` of ``layer``'s V (see ``key_pages``)."""
        if self.plan is None:
            return self._kv.v_pages[layer]
        view = self._view(layer)
        del self._views[layer]  # K is read first (attention's argument order); V ends the layer
        return view[1]

    def attention_csr(self) -> tuple[FlashInferKvMetadata, torch.Tensor] | None:
        """The CSR and ``qo_indptr`` (int32, on the pool's device) attention plans with on a pool
        that is not direct: the window's sub-rows over the view's pages. None on a direct pool
        (the step CSR and one query row per active row serve)."""
        plan = self.plan
        if plan is None:
            return None
        if self._csr is None:
            device = self._kv.device
            indptr, indices, last = (torch.from_numpy(a).to(device) for a in
                                     (plan.indptr, plan.indices, plan.last_page_len))
            meta = FlashInferKvMetadata(indptr, indices, last, self._kv.page_size)
            self._csr = (meta, torch.from_numpy(plan.qo_indptr).to(device))
        return self._csr

    def commit(self) -> None:
        """Record the window as written (once; later calls do nothing). RuntimeError if the step is
        no longer the active one (nothing recorded); PoolClosedError after ``close()``."""
        if not self.committed:
            self._on_commit(self)
            self.committed = True

    @property
    def start(self) -> np.ndarray:
        """The window's start of every row, ``int64[B]``."""
        return self.active.start_of(self._window)

    @property
    def window(self) -> np.ndarray | int:
        """The starts as validated: an int when every row starts there, else ``int64[B]``."""
        return self._window

    def __repr__(self) -> str:
        return (f"KvStep(batch={self.batch}, start={self.start.tolist()}, seqlen={self.seqlen}, "
                f"records={self.records}, committed={self.committed})")
