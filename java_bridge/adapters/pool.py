"""``smile.llm.cache.KvCachePool.Backend`` implemented over a ``smile_llm.cache.KvCachePool`` (its
tree: ``radix``; its CSRs and index buffers: ``csr``; its graph calls: ``pool_graphs``).

The Java ``KvCachePool`` is a class over a backend. Wherever Java expects a ``KvCachePool`` and gets
an adapter (a factory's or the model's return value, an argument), the adapter converts to its Java
pool (a JPype conversion, ``as_java_pool``): the same Java object while Java holds it.

K/V buffers follow Java NIO: each is read or written from its ``position()`` and left with its
position and limit unchanged (``convert.buffer_view``). The step verbs take a scalar (every active
row) or one value per row: the Java overloads arrive at the same Python method
(``convert.int_or_array``)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import jpype
import jpype.nio
import numpy as np
import torch
from jpype import JClass, JConversion, JImplements

from smile_llm import KvCachePool

from ..errors import bridged
from .convert import (
    buffer_view,
    checked_int,
    int_array,
    int_or_array,
    java_device,
    java_scalar_type,
)
from .csr import JavaCsrs
from .pool_graphs import GraphCalls
from .radix import PoolTree, RadixCacheAdapter


def _with_calls_of(part: type) -> Callable[[type], type]:
    """Copies the public methods ``cls`` inherits from ``part`` into ``cls`` itself: JPype accepts
    only a class's own methods as implementations of its interface."""

    def copy(cls: type) -> type:
        for name, value in vars(part).items():
            if callable(value) and not name.startswith("_"):
                setattr(cls, name, value)
        return cls

    return copy


@JImplements("smile.llm.cache.KvCachePool$Backend", deferred=True)
@_with_calls_of(GraphCalls)
@bridged
class KvCachePoolAdapter(GraphCalls):
    """``smile.llm.cache.KvCachePool.Backend`` over a ``smile_llm.cache.KvCachePool`` (the graph
    calls are ``GraphCalls``')."""

    def __init__(self, pool: KvCachePool) -> None:
        self.pool = pool
        self.csrs = JavaCsrs(pool.lock)
        self._radix: Any = None  # the Java RadixCache over the pool's tree, made on first use
        self._lazy_lock = threading.Lock()  # guards the Java objects made on first use
        self._java: Any = None  # a Java WeakReference to the Java KvCachePool over this adapter
        # keeps exported memory alive as long as the adapter
        self._exported: dict[tuple[str, int], Any] = {}

    def _java_pool(self) -> Any:
        """The Java ``KvCachePool`` over this adapter: the same object while Java holds it (held
        through a Java WeakReference, so that no reference cycle crosses the bridge)."""
        with self._lazy_lock:
            java = None if self._java is None else self._java.get()
            if java is None:
                java = JClass("smile.llm.cache.KvCachePool")(self)
                self._java = JClass("java.lang.ref.WeakReference")(java)
            return java

    # geometry and counters
    def numLayers(self) -> int:  # noqa: N802
        """Java ``numLayers()``."""
        return checked_int(self.pool.num_layers, "numLayers")

    def numSlots(self) -> int:  # noqa: N802
        """Java ``numSlots()``."""
        return checked_int(self.pool.num_slots, "numSlots")

    def numKvHeads(self) -> int:  # noqa: N802
        """Java ``numKvHeads()``."""
        return checked_int(self.pool.num_kv_heads, "numKvHeads")

    def headDim(self) -> int:  # noqa: N802
        """Java ``headDim()``."""
        return checked_int(self.pool.head_dim, "headDim")

    def pageSize(self) -> int:  # noqa: N802
        """Java ``pageSize()``."""
        return checked_int(self.pool.page_size, "pageSize")

    def dtype(self) -> str:
        """Java ``dtype()``: the storage dtype as torch names it (``"torch.float32"``)."""
        return str(self.pool.dtype)

    def dtypeForLayer(self, layer: int) -> str:  # noqa: N802
        """Java ``dtypeForLayer(int)``: the model's KV layer's storage format (``"nvfp4"``, or
        ``"k=..., v=..."`` when its sides differ); IllegalArgumentException (``LayerNotHeldError``)
        for a layer the pool does not hold."""
        return self.pool.dtype_for_layer(int(layer))

    def kBlockStrideBytesForLayer(self, layer: int) -> int:  # noqa: N802
        """Java ``long kBlockStrideBytesForLayer(int)``: one page of the layer's K as stored."""
        return int(self.pool.k_block_stride_bytes_for_layer(int(layer)))

    def vBlockStrideBytesForLayer(self, layer: int) -> int:  # noqa: N802
        """Java ``long vBlockStrideBytesForLayer(int)``: one page of the layer's V as stored."""
        return int(self.pool.v_block_stride_bytes_for_layer(int(layer)))

    def computeDtype(self) -> Any:  # noqa: N802
        """Java ``ScalarType computeDtype()``: the dtype ``get`` returns and ``put`` takes."""
        return java_scalar_type(self.pool.compute_dtype)

    def kvIsComputeDtype(self) -> bool:  # noqa: N802
        """Java ``kvIsComputeDtype()``: K/V are stored in the compute dtype (not FP8)."""
        return bool(self.pool.kv_is_compute_dtype)

    def kScale(self) -> float:  # noqa: N802
        """Java ``float kScale()``: the FP8 K scale (1.0 for float storage)."""
        return float(self.pool.k_scale)

    def vScale(self) -> float:  # noqa: N802
        """Java ``float vScale()``: the FP8 V scale (1.0 for float storage)."""
        return float(self.pool.v_scale)

    def device(self) -> Any:
        """Java ``Device device()``: the pool's device (``Device.CPU()`` for a CPU pool)."""
        return java_device(self.pool.device)

    def freePages(self) -> int:  # noqa: N802
        """Java ``freePages()``."""
        return checked_int(self.pool.free_pages, "freePages")

    def freeSlots(self) -> int:  # noqa: N802
        """Java ``freeSlots()``."""
        return checked_int(self.pool.free_slots, "freeSlots")

    def requestCapacity(self) -> int:  # noqa: N802
        """Java ``requestCapacity()``: the smallest capacity among the active rows (0 if none)."""
        return checked_int(self.pool.request_capacity, "requestCapacity")

    def boundRequestCount(self) -> int:  # noqa: N802
        """Java ``boundRequestCount()``."""
        return checked_int(self.pool.bound_request_count, "boundRequestCount")

    def isPrefixReuseEnabled(self) -> bool:  # noqa: N802
        """Java ``isPrefixReuseEnabled()``."""
        return bool(self.pool.prefix_reuse_enabled)

    def setPrefixReuseEnabled(self, enabled: bool) -> None:  # noqa: N802
        """Java ``setPrefixReuseEnabled(boolean)``."""
        self.pool.prefix_reuse_enabled = bool(enabled)

    def prefixPromptTokens(self) -> int:  # noqa: N802
        """Java ``prefixPromptTokens()``: prompt tokens seen by binds (cumulative)."""
        return checked_int(self.pool.prefix_prompt_tokens, "prefixPromptTokens", bits=64)

    def prefixMatchTokens(self) -> int:  # noqa: N802
        """Java ``prefixMatchTokens()``: prompt tokens served from the tree (cumulative)."""
        return checked_int(self.pool.prefix_match_tokens, "prefixMatchTokens", bits=64)

    def prefixInsertTokens(self) -> int:  # noqa: N802
        """Java ``prefixInsertTokens()``: tokens newly inserted by finishes (cumulative)."""
        return checked_int(self.pool.prefix_insert_tokens, "prefixInsertTokens", bits=64)

    def prefixEvictTokens(self) -> int:  # noqa: N802
        """Java ``prefixEvictTokens()``: tokens the pool evicted from the tree (cumulative)."""
        return checked_int(self.pool.prefix_evict_tokens, "prefixEvictTokens", bits=64)

    def radix(self) -> Any:
        """Java ``RadixCache radix()``: the pool's tree (the same object every call): queries and
        ``matchPrefix`` under the pool's lock; mutations throw IllegalStateException
        (``radix.PoolTree``). IllegalStateException once the pool is closed."""
        self.pool.radix  # noqa: B018 - PoolClosedError (IllegalStateException) after close()
        with self._lazy_lock:
            if self._radix is None:
                self._radix = JClass("smile.llm.cache.RadixCache")(
                    RadixCacheAdapter(PoolTree(self.pool)))
            return self._radix

    def radixCache(self) -> Any:  # noqa: N802
        """Java ``radixCache()``: the same tree as ``radix()``."""
        return self.radix()

    # binding
    def bindRequest(self, prompt: Any, capacity: int) -> int:  # noqa: N802
        """Java ``int bindRequest(int[] prompt, int capacity)``: ``bind_request``;
        ``KvCacheExhaustedException`` when it does not fit (nothing changes)."""
        return checked_int(self.pool.bind_request(int_array(prompt), int(capacity)), "bindRequest")

    def bindWithPrefix(self, prompt: Any, capacity: int) -> int:  # noqa: N802
        """Java ``int bindWithPrefix(int[] prompt, int capacity)``: ``bind_with_prefix``; returns
        the matched prefix length."""
        return checked_int(self.pool.bind_with_prefix(int_array(prompt), int(capacity)),
                           "bindWithPrefix")

    def bindRequests(self, batch: int, capacity: int) -> np.ndarray:  # noqa: N802
        """Java ``int[] bindRequests(int batch, int capacity)``: ``bind_requests``; returns the
        request ids."""
        return np.asarray(self.pool.bind_requests(int(batch), int(capacity)), dtype=np.int32)

    def finishRequest(self, *args: Any) -> None:  # noqa: N802 - (int id, int[] seq) or (int[] seq)
        """Java ``finishRequest(int id, int[] sequence)`` (``finish_request``) or
        ``finishRequest(int[] sequence)`` (``finish_exclusive``)."""
        if len(args) == 1:
            self.pool.finish_exclusive(int_array(args[0]))
        else:
            self.pool.finish_request(int(args[0]), None if args[1] is None else int_array(args[1]))

    def unbindRequest(self, request_id: int) -> None:  # noqa: N802
        """Java ``unbindRequest(int id)``: instant eviction, nothing inserted; unknown ids do
        nothing."""
        self.pool.unbind_request(int(request_id))

    def unbindRequests(self) -> None:  # noqa: N802
        """Java ``unbindRequests()``: release every binding without inserting."""
        self.pool.unbind_requests()

    def isBound(self, request_id: int) -> bool:  # noqa: N802
        """Java ``isBound(int id)``."""
        return bool(self.pool.is_bound(int(request_id)))

    def matchedPrefixLen(self, request_id: int) -> int:  # noqa: N802
        """Java ``matchedPrefixLen(int id)`` (0 for an unknown id)."""
        return checked_int(self.pool.matched_prefix_len(int(request_id)), "matchedPrefixLen")

    def kvLen(self, request_id: int) -> int:  # noqa: N802
        """Java ``kvLen(int id)``: the end of the request's contiguous written prefix."""
        return checked_int(self.pool.kv_len(int(request_id)), "kvLen")

    def activateStep(self, ids: Any) -> None:  # noqa: N802
        """Java ``activateStep(int... ids)``: the batch, in order, that step calls act on."""
        self.pool.activate_step(*(int(i) for i in int_array(ids)))

    def activeRequestIds(self) -> np.ndarray:  # noqa: N802
        """Java ``int[] activeRequestIds()``: the active batch in order (empty when there is
        none)."""
        return np.asarray(self.pool.active_request_ids, dtype=np.int32)

    def ensureRequest(self, batch: int, end_pos: int) -> None:  # noqa: N802
        """Java ``ensureRequest(int batch, int endPos)``: ``KvCacheExhaustedException`` if an active
        row's capacity is below ``endPos``."""
        self.pool.ensure_request(int(batch), int(end_pos))

    # K/V
    def _shape(self, seqlen: int) -> tuple[int, ...]:
        rows = len(self.pool.active_request_ids)
        if rows == 0:
            raise RuntimeError("no active step: bind a request or call activateStep first")
        return rows, int(seqlen), self.pool.num_kv_heads, self.pool.head_dim

    def put(self, layer: int, start: Any, seqlen: int, k: Any, v: Any) -> None:
        """Java ``put(int layer, int startPos | int[] startPositions, int seqLen, ByteBuffer k,
        ByteBuffer v)``: write ``[B, seqLen, Hkv, D]`` values of the compute dtype from direct
        native-order buffers, viewed from their positions without a copy (read-only buffers too).
        IllegalArgumentException for a heap buffer, wrong byte order or too few bytes remaining;
        IllegalStateException without an active step."""
        shape = self._shape(seqlen)
        dtype = self.pool.compute_dtype
        k_in = buffer_view(k, dtype, shape, "k", output=False)
        v_in = buffer_view(v, dtype, shape, "v", output=False)
        self.pool.put(int(layer), int_or_array(start), k_in, v_in)

    def get(self, layer: int, length: int, k: Any, v: Any) -> None:
        """Java ``get(int layer, int length, ByteBuffer k, ByteBuffer v)``: copy positions
        ``[0, length)`` of every active row into the caller's direct native-order buffers
        (``[B, length, Hkv, D]``, compute dtype), from their positions. Same buffer errors as
        ``put``, and IllegalArgumentException for a read-only buffer."""
        k_out, v_out = self._outputs(length, k, v)
        k_in, v_in = self.pool.get(int(layer), int(length))
        k_out.copy_(k_in)
        v_out.copy_(v_in)

    def getPadded(self, layer: int, length: int, k: Any, v: Any) -> None:  # noqa: N802
        """Java ``getPadded(int layer, int length, ByteBuffer k, ByteBuffer v)``: ``get_padded``
        into the caller's buffers: ``length`` up to the largest active capacity, positions past a
        row's capacity repeat its last slot. Same buffer rules as ``get``."""
        k_out, v_out = self._outputs(length, k, v)
        k_in, v_in = self.pool.get_padded(int(layer), int(length))
        k_out.copy_(k_in)
        v_out.copy_(v_in)

    def _outputs(self, length: int, k: Any, v: Any) -> tuple[torch.Tensor, torch.Tensor]:
        shape = self._shape(length)
        dtype = self.pool.compute_dtype
        return (buffer_view(k, dtype, shape, "k", output=True),
                buffer_view(v, dtype, shape, "v", output=True))

    def _export(self, which: str, layer: int) -> Any:
        key = (which, int(layer))
        if key not in self._exported:
            pool = self.pool
            if pool.device.type != "cpu":
                raise RuntimeError(f"the pool is on {pool.device}: its K/V stay in Python (use "
                                   f"get/put with host buffers instead)")
            t = pool.key_layer(int(layer)) if which == "k" else pool.value_layer(int(layer))
            raw = t.view(torch.uint8).numpy()  # bytes of the pool's own storage, any dtype
            buf = jpype.nio.convertToDirectBuffer(raw)
            self._exported[key] = (raw, buf.order(JClass("java.nio.ByteOrder").nativeOrder()))
        return self._exported[key][1]

    def keyLayer(self, layer: int) -> Any:  # noqa: N802
        """Java ``ByteBuffer keyLayer(int layer)``: the pool's own K storage of ``layer`` as a
        direct native-order buffer, shared without a copy (cached per layer). RuntimeError
        (IllegalStateException) for a pool off the CPU.
        """
        return self._export("k", layer)

    def valueLayer(self, layer: int) -> Any:  # noqa: N802
        """Java ``ByteBuffer valueLayer(int layer)``: the V storage; see ``keyLayer``."""
        return self._export("v", layer)

    def slotIndices(self, first: Any, seqlen: Any = None) -> np.ndarray:  # noqa: N802
        """Java ``long[] slotIndices(int length)``: the physical slots of positions ``[0, length)``
        of every active row, row-major; ``long[] slotIndices(int[] startPos, int seqlen)``: of
        ``[startPos[b], startPos[b] + seqlen)`` (``window_slot_indices``)."""
        if seqlen is None:
            return np.asarray(self.pool.slot_indices(int(first)), dtype=np.int64)
        return np.asarray(self.pool.window_slot_indices(int_array(first), int(seqlen)),
                          dtype=np.int64)

    def alloc(self, num_tokens: int) -> np.ndarray:
        """Java ``long[] alloc(int numTokens)``: page-aligned caller-owned slot ids;
        ``KvCacheExhaustedException`` if they do not fit."""
        return np.asarray(self.pool.alloc(int(num_tokens)), dtype=np.int64)

    def free(self, slots: Any) -> None:
        """Java ``free(long[] slots)``: return caller-owned whole pages; IllegalArgumentException
        for a double free or a page the caller does not own."""
        self.pool.free(int_array(slots))

    def evict(self, num_tokens: int) -> int:
        """Java ``int evict(int numTokens)``: evict at least that many unlocked cached tokens (LRU)
        unless the tree runs out; returns the tokens evicted."""
        return checked_int(self.pool.evict(int(num_tokens)), "evict")

    # metadata, seal and truncate
    def sharedFlashInferMetadata(self, lengths: Any) -> Any:  # noqa: N802
        """Java ``FlashInferKvMetadata sharedFlashInferMetadata(int[] lengths | int length)``: the
        step CSR (reused / bumped / rebuilt), the same Java object while the pool keeps it."""
        return self.csrs.owned(self.pool.shared_flashinfer_metadata(int_or_array(lengths)))

    def buildFlashInferMetadata(self, lengths: Any) -> Any:  # noqa: N802
        """Java ``FlashInferKvMetadata buildFlashInferMetadata(int[] lengths | int length)``: a
        fixed CSR of the active rows, a new object every call."""
        return self.csrs.fixed(self.pool.build_flashinfer_metadata(int_or_array(lengths)))

    def currentStepFlashInferMetadata(self) -> Any:  # noqa: N802
        """Java ``currentStepFlashInferMetadata()``: the step CSR as it stands, or null."""
        return self.csrs.owned(self.pool.current_step_metadata())

    def clearStepMetadata(self) -> None:  # noqa: N802
        """Java ``clearStepMetadata()``: forget the step CSR."""
        self.pool.clear_step_metadata()

    def clearStepFlashInferMetadata(self) -> None:  # noqa: N802
        """Java ``clearStepFlashInferMetadata()`` (Smile's name of ``clearStepMetadata``)."""
        self.pool.clear_step_metadata()

    def sealLength(self, sealed: Any) -> bool:  # noqa: N802
        """Java ``boolean sealLength(int[] sealedLen | int sealedLen)``: true when the step CSR kept
        its tensors."""
        return bool(self.pool.seal_length(int_or_array(sealed)))

    def truncateTo(self, sealed: Any, written_end: Any, zero: Any = None) -> bool:  # noqa: N802
        """Java ``boolean truncateTo(int[] sealedLen, int[] writtenEnd[, boolean zeroRejected])`` or
        ``(int, int[, boolean])``: ``truncate_to``. Without ``zeroRejected`` the pool's
        ``zero_rejected_kv`` decides whether ``[sealed, written_end)`` is zeroed first; with it, the
        switch is set to it for this one call under the pool's lock (so no other thread sees the
        change) and restored after, also when the call fails. IllegalArgumentException if
        ``writtenEnd < sealedLen``, beyond a row's capacity, or zeroing below a matched prefix."""
        pool = self.pool
        sealed, written_end = int_or_array(sealed), int_or_array(written_end)
        if zero is None:
            return bool(pool.truncate_to(sealed, written_end))
        with pool.lock:
            before = bool(pool.zero_rejected_kv)
            if before == bool(zero):
                return bool(pool.truncate_to(sealed, written_end))
            pool.zero_rejected_kv = bool(zero)
            try:
                return bool(pool.truncate_to(sealed, written_end))
            finally:
                pool.zero_rejected_kv = before

    def zeroRejectedKv(self) -> bool:  # noqa: N802
        """Java ``zeroRejectedKv()``: the pool's ``zero_rejected_kv`` switch."""
        return bool(self.pool.zero_rejected_kv)

    def setZeroRejectedKv(self, on: bool) -> None:  # noqa: N802
        """Java ``setZeroRejectedKv(boolean)``."""
        self.pool.zero_rejected_kv = bool(on)

    def invalidateRange(self, from_pos: Any, end_pos: Any) -> None:  # noqa: N802
        """Java ``invalidateRange(int[] fromPos, int[] endPos)`` or ``(int, int)``: zero those
        positions on every layer; ``kvLen`` drops to at most ``fromPos``."""
        self.pool.invalidate_range(int_or_array(from_pos), int_or_array(end_pos))

    # page buckets
    def numPagesForLength(self, n: int) -> int:  # noqa: N802
        """Java ``numPagesForLength(int n)``: ``ceil(n / pageSize)``."""
        return checked_int(self.pool.num_pages_for_length(int(n)), "numPagesForLength")

    def stepsUntilPageBoundary(self, n: int) -> int:  # noqa: N802
        """Java ``stepsUntilPageBoundary(int cacheLen)``."""
        return checked_int(self.pool.steps_until_page_boundary(int(n)), "stepsUntilPageBoundary")

    def firstCacheLenInNextPageBucket(self, n: int) -> int:  # noqa: N802
        """Java ``firstCacheLenInNextPageBucket(int numPages)``: ``numPages * pageSize + 1``."""
        return checked_int(self.pool.first_cache_len_in_next_page_bucket(int(n)),
                           "firstCacheLenInNextPageBucket")

    # audit
    def checkInvariants(self) -> None:  # noqa: N802
        """Java ``checkInvariants()``: IllegalStateException naming the first broken page
        (``KvCacheCorruptionError``).
        """
        self.pool.check_invariants()

    def statsJson(self) -> str:  # noqa: N802
        """Java ``String statsJson()``: ``stats()`` as a JSON object with sorted keys."""
        return json.dumps(self.pool.stats(), default=str, sort_keys=True)

    def close(self) -> None:
        """Java ``close()``: release the pool (idempotent); exported ``keyLayer``/``valueLayer``
        buffers stay valid."""
        self.pool.close()


@JConversion("smile.llm.cache.KvCachePool", instanceof=KvCachePoolAdapter)
def as_java_pool(_cls: Any, adapter: KvCachePoolAdapter) -> Any:
    """An adapter where Java expects a ``KvCachePool``: its Java pool (``_java_pool``)."""
    return adapter._java_pool()  # noqa: SLF001 - the conversion is the adapter's own
