"""``Bridge.Factory`` (Python-backed pools and radix trees created from Java) and ``Bridge.pinCurrentThread``."""

from __future__ import annotations

from typing import Any

from jpype import JImplements

from smile_llm import KvCacheLayout, KvCachePool, RadixCache

from ..errors import bridged
from ..threads import pin_current_thread
from .convert import python_device, python_layout, storage_dtype
from .pool import KvCachePoolAdapter
from .radix import RadixCacheAdapter, Standalone


@JImplements("smile.llm.python.Bridge$Factory", deferred=True)
@bridged
class FactoryAdapter:
    """Creates Python-backed pools for ``Bridge.newKvCachePool``, ``Bridge.forTesting`` and Smile's static
    ``KvCachePool`` factories (closing them on exit), and standalone trees for ``new RadixCache(pageSize)``. Devices
    arrive as torch device strings (``Device.toString()``), dtypes as torch names (``ScalarType.torchName()``)."""

    def __init__(self) -> None:
        self.pools: list[KvCachePool] = []

    def newKvCachePool(self, layers: int, slots: int, kv_heads: int, head_dim: int, page_size: int,  # noqa: N802
                       dtype: Any) -> Any:
        """``Bridge.newKvCachePool``: a new CPU pool of ``dtype`` (a name such as ``"float32"`` or ``"bfloat16"``;
        IllegalArgumentException for another), closed when the launcher exits."""
        pool = KvCachePool(int(layers), int(slots), int(kv_heads), int(head_dim), int(page_size), "cpu",
                           storage_dtype(dtype))
        return self._adopt(pool)

    def forTesting(self, layers: int, kv_heads: int, head_dim: int, max_batch: int, max_seq: int) -> Any:  # noqa: N802
        """``Bridge.forTesting(layout)``: ``KvCachePool.for_testing`` (page size 1, float32, ``maxBatch * maxSeq``
        slots), closed when the launcher exits."""
        pool = KvCachePool.for_testing(KvCacheLayout(int(layers), int(kv_heads), int(head_dim), int(max_batch),
                                                     int(max_seq)))
        return self._adopt(pool)

    def forTestingOn(self, layout: Any, device: Any) -> Any:  # noqa: N802
        """``KvCachePool.forTesting(layout, device)``: ``KvCachePool.for_testing(layout, device)``."""
        return self._adopt(KvCachePool.for_testing(python_layout(layout), python_device(device)))

    def allocate(self, layout: Any, device: Any, dtype: Any, mem_fraction: float, page_size: int) -> Any:
        """``KvCachePool.allocate(layout, device, dtype, memFraction, pageSize)``: ``KvCachePool.allocate`` (on the CPU
        ``floor_page(max(pageSize, maxBatch * maxSeq))`` slots; on CUDA sized from free memory)."""
        return self._adopt(KvCachePool.allocate(python_layout(layout), python_device(device), storage_dtype(dtype),
                                                float(mem_fraction), int(page_size)))

    def forMtp(self, layout: Any, device: Any, dtype: Any, page_size: int) -> Any:  # noqa: N802
        """``KvCachePool.forMtp``: ``maxBatch * ceil_page(maxSeq)`` slots (``KvCachePool.for_mtp``)."""
        return self._adopt(KvCachePool.for_mtp(python_layout(layout), python_device(device), storage_dtype(dtype),
                                               int(page_size)))

    def forMtpHistory(self, layout: Any, device: Any, dtype: Any, page_size: int, want_slots: int) -> Any:  # noqa: N802
        """``KvCachePool.forMtpHistory``: ``floor_page(wantSlots)`` slots, prefix reuse off
        (``KvCachePool.for_mtp_history``; IllegalStateException if not one page fits)."""
        return self._adopt(KvCachePool.for_mtp_history(python_layout(layout), python_device(device),
                                                       storage_dtype(dtype), int(page_size), int(want_slots)))

    def newRadixCache(self, page_size: int) -> Any:  # noqa: N802
        """``new RadixCache(pageSize)``: a standalone Python ``RadixCache`` (IllegalArgumentException if
        ``pageSize < 1``)."""
        return RadixCacheAdapter(Standalone(RadixCache(int(page_size))))

    def _adopt(self, pool: KvCachePool) -> Any:
        self.pools.append(pool)
        return KvCachePoolAdapter(pool)

    def _close_all(self) -> None:
        for pool in self.pools:
            pool.close()


@JImplements("java.lang.Runnable", deferred=True)
@bridged
class PinThread:
    """``Bridge.pinCurrentThread()``: see ``threads.pin_current_thread``."""

    def run(self) -> None:
        """Pin the calling thread's Python thread state (``threads.pin_current_thread``); later calls do nothing."""
        pin_current_thread()
