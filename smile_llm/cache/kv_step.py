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
from .step import ActiveStep


class KvStep:
    """The validated write window ``[start_b, start_b + seqlen)`` of every active row, for one
    forward.

    ``write(layer, k, v)`` trusts its arguments: ``k``/``v`` are ``[B, seqlen, Hkv, D]``
    floating-point tensors on the pool's device that share no memory with the pool (the model's own
    projections); it casts to the storage dtype (FP8 stores ``x / scale``).
    ``key_pages(layer)``/``value_pages(layer)`` are ``[num_pages, page_size, Hkv, D]`` views of the
    storage (FlashInfer's NHD layout); pass ``k_scale``/``v_scale`` to attention with them.

    The handle is valid while its step stays active and the pool open; the single driver thread that
    owns the step must not unbind, activate or close in between (writes are not checked; ``commit``
    raises then). ``commit`` records the write (a row with ``start <= kv_len`` gets
    ``kv_len = max(kv_len, start + seqlen)``; a gap moves nothing); it is idempotent. A handle over
    a decode prefetch's scratch index records nothing: those slots are not the rows'.
    """

    __slots__ = ("active", "batch", "seqlen", "index", "records", "k_scale", "v_scale", "committed",
                 "_window", "_kv", "_n", "_on_commit")

    def __init__(self, kv: KvStore, active: ActiveStep, window: np.ndarray | int, seqlen: int,
                 index: torch.Tensor, records: bool, on_commit: Callable[[KvStep], None]) -> None:
        self.active = active  # the step the window was validated against
        self.batch, self.seqlen = active.batch, seqlen
        self.index = index  # int64[B * seqlen] on the pool's device, row-major
        self.records = records  # whether commit advances kv_len
        self.k_scale, self.v_scale = kv.k_scale, kv.v_scale
        self.committed = False
        self._window = window  # an int when every row starts there (the step's scalar fast path)
        self._kv = kv
        self._n = active.batch * seqlen
        self._on_commit = on_commit

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write ``k``/``v`` ``[B, seqlen, Hkv, D]`` into ``layer`` (``0 <= layer < num_layers``) at
        the window's slots. No lock and no checks (see the class docstring); kv_len moves only at
        ``commit``."""
        shape = (self._n, *self._kv.head_shape)
        self._kv.write(layer, self.index, k.reshape(shape), v.reshape(shape))

    def key_pages(self, layer: int) -> torch.Tensor:
        """``[num_pages, page_size, Hkv, D]`` view of ``layer``'s K in the storage dtype."""
        return self._kv.k_pages[layer]

    def value_pages(self, layer: int) -> torch.Tensor:
        """``[num_pages, page_size, Hkv, D]`` view of ``layer``'s V in the storage dtype."""
        return self._kv.v_pages[layer]

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
