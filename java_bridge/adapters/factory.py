"""``Bridge.Factory`` (Python-backed pools created from Java) and ``Bridge.pinCurrentThread``."""

from __future__ import annotations

from typing import Any

from jpype import JImplements

from smile_llm.cache import KvCacheLayout, KvCachePool

from ..errors import bridged
from ..threads import pin_current_thread
from .convert import DTYPES
from .pool import KvCachePoolAdapter


@JImplements("smile.llm.python.Bridge$Factory", deferred=True)
@bridged
class FactoryAdapter:
    """Creates Python-backed pools for ``Bridge.newKvCachePool`` / ``Bridge.forTesting``; closes them on exit."""

    def __init__(self) -> None:
        self.pools: list[KvCachePool] = []

    def newKvCachePool(self, layers: int, slots: int, kv_heads: int, head_dim: int, page_size: int,  # noqa: N802
                       dtype: Any) -> Any:
        """``Bridge.newKvCachePool``: a new CPU pool of ``dtype`` (a name such as ``"float32"`` or ``"bfloat16"``;
        IllegalArgumentException for another), closed when the launcher exits."""
        name = str(dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {name!r}")
        pool = KvCachePool(int(layers), int(slots), int(kv_heads), int(head_dim), int(page_size), "cpu",
                           DTYPES[name])
        self.pools.append(pool)
        return KvCachePoolAdapter(pool)

    def forTesting(self, layers: int, kv_heads: int, head_dim: int, max_batch: int, max_seq: int) -> Any:  # noqa: N802
        """``Bridge.forTesting(layout)``: ``KvCachePool.for_testing`` (page size 1, float32, ``maxBatch * maxSeq``
        slots), closed when the launcher exits."""
        pool = KvCachePool.for_testing(KvCacheLayout(int(layers), int(kv_heads), int(head_dim), int(max_batch),
                                                     int(max_seq)))
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
