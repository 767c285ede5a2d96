"""``Bridge.Factory`` (Python-backed pools and radix trees created from Java, and
``Device.emptyCache()``) and ``Bridge.pinCurrentThread``."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from jpype import JArray, JImplements, JInt

from smile_llm import KvCacheLayout, KvCachePool, RadixCache
from smile_llm.cache import compute_static_kv_budget, slots_from_budget

from ..errors import bridged
from ..threads import pin_current_thread
from .convert import checked_int, python_device, python_layout, storage_dtype
from .pool import KvCachePoolAdapter
from .radix import RadixCacheAdapter, Standalone


@JImplements("smile.llm.python.Bridge$Factory", deferred=True)
@bridged
class FactoryAdapter:
    """Creates Python-backed pools for ``Bridge.newKvCachePool``, ``Bridge.forTesting`` and Smile's
    static ``KvCachePool`` factories (closing them on exit), and standalone trees for
    ``new RadixCache(pageSize)``. Devices arrive as torch device strings (``Device.toString()``),
    dtypes as torch names (``ScalarType.torchName()``)."""

    def __init__(self) -> None:
        self.pools: list[KvCachePool] = []

    def newKvCachePool(self, layers: int, slots: int, kv_heads: int, head_dim: int,  # noqa: N802
                       page_size: int, dtype: Any) -> Any:
        """``Bridge.newKvCachePool``: a new CPU pool of ``dtype`` (a name such as ``"float32"`` or
        ``"bfloat16"``; IllegalArgumentException for another, or a layer count below 1), closed when
        the launcher exits."""
        if int(layers) < 1:
            raise ValueError(f"num_layers must be >= 1, got {int(layers)}")
        pool = KvCachePool(int(layers), int(slots), int(kv_heads), int(head_dim), int(page_size),
                           "cpu", storage_dtype(dtype))
        return self._adopt(pool)

    def newKvCachePoolBackend(self, layers: int, slots: int, kv_heads: int,  # noqa: N802
                              head_dim: int, page_size: int, device: Any, dtype: Any) -> Any:
        """Smile's ``new KvCachePool(numLayers, numSlots, numKvHeads, headDim, pageSize, device,
        dtype)``: a new pool on ``device`` (a torch device string) of ``dtype`` (a torch name),
        closed when the launcher exits. IllegalArgumentException for bad geometry, a device torch
        cannot use or a dtype the pool cannot store (Smile's: a layer count below 1 too; the Python
        pool also takes 0, for a pipeline stage without attention layers)."""
        if int(layers) < 1:
            raise ValueError(f"num_layers must be >= 1, got {int(layers)}")
        pool = KvCachePool(int(layers), int(slots), int(kv_heads), int(head_dim), int(page_size),
                           python_device(device), storage_dtype(dtype))
        return self._adopt(pool)

    def computeStaticKvBudget(self, total: int, free: int, mem_fraction: float,  # noqa: N802
                              bytes_per_token: int, page_size: int, max_batch: int,
                              max_seq: int) -> np.ndarray:
        """``KvCachePool.computeStaticKvBudget``: ``compute_static_kv_budget`` as the seven fields
        of ``StaticKvBudget`` (``long[]``). IllegalArgumentException for bad arguments,
        IllegalStateException when not one page fits."""
        b = compute_static_kv_budget(int(total), int(free), float(mem_fraction),
                                     int(bytes_per_token), int(page_size), int(max_batch),
                                     int(max_seq))
        checked_int(b.num_slots, "numSlots")
        checked_int(b.max_useful_slots, "maxUsefulSlots")
        return np.array([b.total, b.used, b.static_budget, b.kv_budget, b.dynamic_reserve,
                         b.num_slots, b.max_useful_slots], dtype=np.int64)

    def slotsFromBudget(self, kv_budget: int, bytes_per_token: int, page_size: int,  # noqa: N802
                        max_batch: int, max_seq: int) -> Any:
        """``KvCachePool.slotsFromBudget``: ``slots_from_budget`` as
        ``int[] {numSlots, maxUsefulSlots}``. IllegalArgumentException for a page size, bytes per
        token, batch or length below 1."""
        for name, value in (("pageSize", page_size), ("bytesPerToken", bytes_per_token),
                            ("maxBatchSize", max_batch), ("maxSeqLen", max_seq)):
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {int(value)}")
        c = slots_from_budget(int(kv_budget), int(bytes_per_token), int(page_size), int(max_batch),
                              int(max_seq))
        return JArray(JInt)([checked_int(c.num_slots, "numSlots"),
                             checked_int(c.max_useful_slots, "maxUsefulSlots")])

    def forTesting(self, layers: int, kv_heads: int, head_dim: int, max_batch: int,  # noqa: N802
                   max_seq: int) -> Any:
        """``Bridge.forTesting(layout)``: ``KvCachePool.for_testing`` (page size 1, float32,
        ``maxBatch * maxSeq`` slots), closed when the launcher exits."""
        pool = KvCachePool.for_testing(KvCacheLayout(int(layers), int(kv_heads), int(head_dim),
                                                     int(max_batch), int(max_seq)))
        return self._adopt(pool)

    def forTestingOn(self, layout: Any, device: Any) -> Any:  # noqa: N802
        """``KvCachePool.forTesting(layout, device)``:
        ``KvCachePool.for_testing(layout, device)``."""
        return self._adopt(KvCachePool.for_testing(python_layout(layout), python_device(device)))

    def allocate(self, layout: Any, device: Any, dtype: Any, mem_fraction: float,
                 page_size: int) -> Any:
        """``KvCachePool.allocate(layout, device, dtype, memFraction, pageSize)``:
        ``KvCachePool.allocate`` (on the CPU ``floor_page(max(pageSize, maxBatch * maxSeq))`` slots;
        on CUDA sized from free memory)."""
        return self._adopt(KvCachePool.allocate(python_layout(layout), python_device(device),
                                                storage_dtype(dtype), float(mem_fraction),
                                                int(page_size)))

    def forMtp(self, layout: Any, device: Any, dtype: Any, page_size: int) -> Any:  # noqa: N802
        """``KvCachePool.forMtp``: ``maxBatch * ceil_page(maxSeq)`` slots
        (``KvCachePool.for_mtp``)."""
        return self._adopt(KvCachePool.for_mtp(python_layout(layout), python_device(device),
                                               storage_dtype(dtype), int(page_size)))

    def forMtpHistory(self, layout: Any, device: Any, dtype: Any, page_size: int,  # noqa: N802
                      want_slots: int) -> Any:
        """``KvCachePool.forMtpHistory``: ``floor_page(wantSlots)`` slots, prefix reuse off
        (``KvCachePool.for_mtp_history``; IllegalStateException if not one page fits)."""
        return self._adopt(KvCachePool.for_mtp_history(python_layout(layout), python_device(device),
                                                       storage_dtype(dtype), int(page_size),
                                                       int(want_slots)))

    def newRadixCache(self, page_size: int) -> Any:  # noqa: N802
        """``new RadixCache(pageSize)``: a standalone Python ``RadixCache``
        (IllegalArgumentException if ``pageSize < 1``)."""
        return RadixCacheAdapter(Standalone(RadixCache(int(page_size))))

    def emptyCache(self, device: Any) -> None:  # noqa: N802
        """``Device.emptyCache()`` for a device other than the CPU: see ``empty_cache``."""
        empty_cache(python_device(device))

    def _adopt(self, pool: KvCachePool) -> Any:
        self.pools.append(pool)
        return KvCachePoolAdapter(pool)

    def _close_all(self) -> None:
        for pool in self.pools:
            pool.close()


def empty_cache(device: str) -> None:
    """Release the unoccupied blocks cached by the allocator of ``device`` (a torch device string):
    ``torch.cuda.empty_cache()`` for CUDA (which does nothing while CUDA is not initialised),
    ``torch.mps.empty_cache()`` for MPS when torch has MPS, nothing for the CPU. ValueError for a
    string that names no torch device."""
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"not a torch device: {device!r} ({exc})") from None
    if kind == "cuda":
        torch.cuda.empty_cache()
    elif kind == "mps" and torch.backends.mps.is_available():
        torch.mps.empty_cache()


@JImplements("java.lang.Runnable", deferred=True)
@bridged
class PinThread:
    """``Bridge.pinCurrentThread()``: see ``threads.pin_current_thread``."""

    def run(self) -> None:
        """Pin the calling thread's Python thread state (``threads.pin_current_thread``); later
        calls do nothing."""
        pin_current_thread()
