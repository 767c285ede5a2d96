"""The Java interfaces of ``smile.llm`` implemented over ``smile_llm`` objects (JPype proxies).

Every method goes through ``errors.bridged`` (Python errors arrive as Java exceptions with the Python message).
Arguments: Java ``int[]``/``long[]`` arrive as JPype arrays and are read with one copy (``np.array``); K/V cross
as direct ``ByteBuffer``s in native byte order, viewed with ``torch.frombuffer`` from offset 0 without a copy.
Returns are checked ints or numpy arrays of the declared Java type (JPype would silently truncate a float returned
as a long).
Listener callbacks into Java run while no Python lock is held (``generate`` calls them between steps).
"""

from __future__ import annotations

import json
import math
from typing import Any

import jpype
import jpype.nio
import numpy as np
import torch
from jpype import JArray, JClass, JFloat, JImplements, JInt

from smile_llm.cache import KvCacheLayout, KvCachePool
from smile_llm.model import LanguageModel

from .errors import bridged
from .threads import pin_current_thread

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}


def _int(x: Any, what: str) -> int:
    """``x`` as a Java int/long return value; TypeError for anything but an integer."""
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
        raise TypeError(f"{what} must return an integer, got {type(x).__name__} {x!r}")
    return int(x)


def _ints(a: Any) -> np.ndarray:
    """A Java ``int[]``/``long[]`` (or varargs) as int64 numpy (one copy); ValueError for null.

    Always a copy: ``np.asarray`` of a ``long[]`` is a view of JPype's buffer over the Java array, and when that
    view is released while an error unwinds (JPype 1.7.1 releases the array elements through JNI), the Java
    exception already raised for the caller is dropped: ``free(long[])`` then returned normally instead of
    throwing. (Direct ByteBuffer views do not have this problem.)"""
    if a is None:
        raise ValueError("array argument must not be null")
    return np.array(a, dtype=np.int64)


_native_order: Any = None  # java.nio.ByteOrder.nativeOrder(), looked up once


def _view(buf: Any, dtype: torch.dtype, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """A zero-copy tensor over a direct ByteBuffer's first ``prod(shape)`` elements."""
    global _native_order
    if buf is None:
        raise ValueError(f"{what} must not be null")
    if not buf.isDirect():
        raise ValueError(f"{what} must be a direct ByteBuffer (ByteBuffer.allocateDirect(n).order(nativeOrder()))")
    if _native_order is None:
        _native_order = JClass("java.nio.ByteOrder").nativeOrder()
    if buf.order() != _native_order:
        raise ValueError(f"{what} must be in native byte order: call .order(ByteOrder.nativeOrder())")
    n = math.prod(shape)
    need = n * dtype.itemsize
    if buf.capacity() < need:
        raise ValueError(f"{what} holds {buf.capacity()} bytes, need {need} for {list(shape)} {dtype}")
    if n == 0:  # torch.frombuffer rejects count=0; an empty put/get is valid (the pool treats it as a no-op)
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(buf, dtype=dtype, count=n).view(shape)


@JImplements("smile.llm.cache.RadixCache", deferred=True)
@bridged
class RadixCacheAdapter:
    """``smile.llm.cache.RadixCache`` over a pool's prefix tree, read-only (mutate the tree through the pool)."""

    def __init__(self, pool: KvCachePool) -> None:
        self._pool = pool

    def matchPrefix(self, tokens: Any) -> np.ndarray:  # noqa: N802 - Java names
        """Java ``int[] matchPrefix(int[] tokens)``: the slot ids of the longest cached page-aligned prefix, without
        splitting nodes, locking or touching LRU times (changes nothing)."""
        return self._pool.peek_prefix_slots(_ints(tokens)).astype(np.int32)  # changes nothing

    def totalSize(self) -> int:  # noqa: N802
        """Java ``totalSize()``: cached tokens."""
        return _int(self._pool.radix.total_size(), "totalSize")

    def evictableSize(self) -> int:  # noqa: N802
        """Java ``evictableSize()``: cached tokens no request holds."""
        return _int(self._pool.radix.evictable_size, "evictableSize")

    def protectedSize(self) -> int:  # noqa: N802
        """Java ``protectedSize()``: cached tokens locked by bound requests."""
        return _int(self._pool.radix.protected_size, "protectedSize")

    def pageSize(self) -> int:  # noqa: N802
        """Java ``pageSize()``."""
        return _int(self._pool.page_size, "pageSize")


@JImplements("smile.llm.cache.KvCachePool", deferred=True)
@bridged
class KvCachePoolAdapter:
    """``smile.llm.cache.KvCachePool`` over a ``smile_llm.cache.KvCachePool``."""

    def __init__(self, pool: KvCachePool) -> None:
        self.pool = pool
        self._radix = RadixCacheAdapter(pool)
        self._exported: dict[tuple[str, int], Any] = {}  # keeps exported memory alive as long as the adapter

    # geometry and counters
    def numLayers(self) -> int:  # noqa: N802
        """Java ``numLayers()``."""
        return _int(self.pool.num_layers, "numLayers")

    def numSlots(self) -> int:  # noqa: N802
        """Java ``numSlots()``."""
        return _int(self.pool.num_slots, "numSlots")

    def numKvHeads(self) -> int:  # noqa: N802
        """Java ``numKvHeads()``."""
        return _int(self.pool.num_kv_heads, "numKvHeads")

    def headDim(self) -> int:  # noqa: N802
        """Java ``headDim()``."""
        return _int(self.pool.head_dim, "headDim")

    def pageSize(self) -> int:  # noqa: N802
        """Java ``pageSize()``."""
        return _int(self.pool.page_size, "pageSize")

    def dtype(self) -> str:
        """Java ``dtype()``: the storage dtype as torch names it (``"torch.float32"``)."""
        return str(self.pool.dtype)

    def freePages(self) -> int:  # noqa: N802
        """Java ``freePages()``."""
        return _int(self.pool.free_pages, "freePages")

    def freeSlots(self) -> int:  # noqa: N802
        """Java ``freeSlots()``."""
        return _int(self.pool.free_slots, "freeSlots")

    def requestCapacity(self) -> int:  # noqa: N802
        """Java ``requestCapacity()``: the smallest capacity among the active rows (0 if none)."""
        return _int(self.pool.request_capacity, "requestCapacity")

    def boundRequestCount(self) -> int:  # noqa: N802
        """Java ``boundRequestCount()``."""
        return _int(self.pool.bound_request_count, "boundRequestCount")

    def isPrefixReuseEnabled(self) -> bool:  # noqa: N802
        """Java ``isPrefixReuseEnabled()``."""
        return bool(self.pool.prefix_reuse_enabled)

    def setPrefixReuseEnabled(self, enabled: bool) -> None:  # noqa: N802
        """Java ``setPrefixReuseEnabled(boolean)``."""
        self.pool.prefix_reuse_enabled = bool(enabled)

    def prefixPromptTokens(self) -> int:  # noqa: N802
        """Java ``prefixPromptTokens()``: prompt tokens seen by binds (cumulative)."""
        return _int(self.pool.prefix_prompt_tokens, "prefixPromptTokens")

    def prefixMatchTokens(self) -> int:  # noqa: N802
        """Java ``prefixMatchTokens()``: prompt tokens served from the tree (cumulative)."""
        return _int(self.pool.prefix_match_tokens, "prefixMatchTokens")

    def prefixInsertTokens(self) -> int:  # noqa: N802
        """Java ``prefixInsertTokens()``: tokens newly inserted by finishes (cumulative)."""
        return _int(self.pool.prefix_insert_tokens, "prefixInsertTokens")

    def prefixEvictTokens(self) -> int:  # noqa: N802
        """Java ``prefixEvictTokens()``: tokens the pool evicted from the tree (cumulative)."""
        return _int(self.pool.prefix_evict_tokens, "prefixEvictTokens")

    def radixCache(self) -> Any:  # noqa: N802
        """Java ``radixCache()``: a read-only ``RadixCache`` view of the pool's tree (the same object every call)."""
        return self._radix

    # binding
    def bindRequest(self, prompt: Any, capacity: int) -> int:  # noqa: N802
        """Java ``int bindRequest(int[] prompt, int capacity)``: ``bind_request``; ``KvCacheExhaustedException`` when it
        does not fit (nothing changes)."""
        return _int(self.pool.bind_request(_ints(prompt), int(capacity)), "bindRequest")

    def bindWithPrefix(self, prompt: Any, capacity: int) -> int:  # noqa: N802
        """Java ``int bindWithPrefix(int[] prompt, int capacity)``: ``bind_with_prefix``; returns the matched prefix
        length."""
        return _int(self.pool.bind_with_prefix(_ints(prompt), int(capacity)), "bindWithPrefix")

    def bindRequests(self, batch: int, capacity: int) -> np.ndarray:  # noqa: N802
        """Java ``int[] bindRequests(int batch, int capacity)``: ``bind_requests``; returns the request ids."""
        return np.asarray(self.pool.bind_requests(int(batch), int(capacity)), dtype=np.int32)

    def finishRequest(self, *args: Any) -> None:  # noqa: N802 - (int id, int[] seq) or (int[] seq)
        """Java ``finishRequest(int id, int[] sequence)`` (``finish_request``) or ``finishRequest(int[] sequence)``
        (``finish_exclusive``)."""
        if len(args) == 1:
            self.pool.finish_exclusive(_ints(args[0]))
        else:
            self.pool.finish_request(int(args[0]), None if args[1] is None else _ints(args[1]))

    def unbindRequest(self, request_id: int) -> None:  # noqa: N802
        """Java ``unbindRequest(int id)``: instant eviction, nothing inserted; unknown ids do nothing."""
        self.pool.unbind_request(int(request_id))

    def unbindRequests(self) -> None:  # noqa: N802
        """Java ``unbindRequests()``: release every binding without inserting."""
        self.pool.unbind_requests()

    def isBound(self, request_id: int) -> bool:  # noqa: N802
        """Java ``isBound(int id)``."""
        return bool(self.pool.is_bound(int(request_id)))

    def matchedPrefixLen(self, request_id: int) -> int:  # noqa: N802
        """Java ``matchedPrefixLen(int id)`` (0 for an unknown id)."""
        return _int(self.pool.matched_prefix_len(int(request_id)), "matchedPrefixLen")

    def kvLen(self, request_id: int) -> int:  # noqa: N802
        """Java ``kvLen(int id)``: the end of the request's contiguous written prefix."""
        return _int(self.pool.kv_len(int(request_id)), "kvLen")

    def activateStep(self, ids: Any) -> None:  # noqa: N802
        """Java ``activateStep(int... ids)``: the batch, in order, that step calls act on."""
        self.pool.activate_step(*(int(i) for i in _ints(ids)))

    def activeRequestIds(self) -> np.ndarray:  # noqa: N802
        """Java ``int[] activeRequestIds()``: the active batch in order (empty when there is none)."""
        return np.asarray(self.pool.active_request_ids, dtype=np.int32)

    def ensureRequest(self, batch: int, end_pos: int) -> None:  # noqa: N802
        """Java ``ensureRequest(int batch, int endPos)``: ``KvCacheExhaustedException`` if an active row's capacity is
        below ``endPos``."""
        self.pool.ensure_request(int(batch), int(end_pos))

    # K/V
    def _shape(self, seqlen: int) -> tuple[int, ...]:
        rows = len(self.pool.active_request_ids)
        if rows == 0:
            raise RuntimeError("no active step: bind a request or call activateStep first")
        return rows, int(seqlen), self.pool.num_kv_heads, self.pool.head_dim

    def put(self, layer: int, start: Any, seqlen: int, k: Any, v: Any) -> None:
        """Java ``put(int layer, int startPos | int[] startPositions, int seqLen, ByteBuffer k, ByteBuffer v)``: write
        ``[B, seqLen, Hkv, D]`` values of the compute dtype from direct native-order buffers, viewed without a copy.
        IllegalArgumentException for a heap buffer, wrong byte order or a buffer too small; IllegalStateException
        without an active step."""
        shape = self._shape(seqlen)
        dtype = self.pool.compute_dtype
        start_pos = int(start) if isinstance(start, int) else _ints(start)
        self.pool.put(int(layer), start_pos, _view(k, dtype, shape, "k"), _view(v, dtype, shape, "v"))

    def get(self, layer: int, length: int, k: Any, v: Any) -> None:
        """Java ``get(int layer, int length, ByteBuffer k, ByteBuffer v)``: copy positions ``[0, length)`` of every
        active row into the caller's direct native-order buffers (``[B, length, Hkv, D]``, compute dtype). Same buffer
        errors as ``put``."""
        shape = self._shape(length)
        dtype = self.pool.compute_dtype
        k_out, v_out = _view(k, dtype, shape, "k"), _view(v, dtype, shape, "v")
        k_in, v_in = self.pool.get(int(layer), int(length))
        k_out.copy_(k_in)
        v_out.copy_(v_in)

    def _export(self, which: str, layer: int) -> Any:
        key = (which, int(layer))
        if key not in self._exported:
            pool = self.pool
            if pool.device.type != "cpu":
                raise RuntimeError(f"the pool is on {pool.device}: its K/V stay in Python (use get/put with host "
                                   f"buffers instead)")
            t = pool.key_layer(int(layer)) if which == "k" else pool.value_layer(int(layer))
            raw = t.view(torch.uint8).numpy()  # bytes of the pool's own storage, any dtype
            buf = jpype.nio.convertToDirectBuffer(raw)
            self._exported[key] = (raw, buf.order(JClass("java.nio.ByteOrder").nativeOrder()))
        return self._exported[key][1]

    def keyLayer(self, layer: int) -> Any:  # noqa: N802
        """Java ``ByteBuffer keyLayer(int layer)``: the pool's own K storage of ``layer`` as a direct native-order
        buffer, shared without a copy (cached per layer). RuntimeError (IllegalStateException) for a pool off the CPU.
        """
        return self._export("k", layer)

    def valueLayer(self, layer: int) -> Any:  # noqa: N802
        """Java ``ByteBuffer valueLayer(int layer)``: the V storage; see ``keyLayer``."""
        return self._export("v", layer)

    def slotIndices(self, length: int) -> np.ndarray:  # noqa: N802
        """Java ``long[] slotIndices(int length)``: the physical slots of positions ``[0, length)`` of every active row,
        row-major."""
        return np.asarray(self.pool.slot_indices(int(length)), dtype=np.int64)

    def alloc(self, num_tokens: int) -> np.ndarray:
        """Java ``long[] alloc(int numTokens)``: page-aligned caller-owned slot ids; ``KvCacheExhaustedException`` if
        they do not fit."""
        return np.asarray(self.pool.alloc(int(num_tokens)), dtype=np.int64)

    def free(self, slots: Any) -> None:
        """Java ``free(long[] slots)``: return caller-owned whole pages; IllegalArgumentException for a double free or a
        page the caller does not own."""
        self.pool.free(_ints(slots))

    def evict(self, num_tokens: int) -> int:
        """Java ``int evict(int numTokens)``: evict at least that many unlocked cached tokens (LRU) unless the tree runs
        out; returns the tokens evicted."""
        return _int(self.pool.evict(int(num_tokens)), "evict")

    # metadata, seal and truncate
    @staticmethod
    def _csr(meta: Any) -> Any:
        rows = [t.detach().cpu().numpy().astype(np.int32).tolist()
                for t in (meta.indptr, meta.indices, meta.last_page_len)]
        return JArray(JInt, 2)(rows)

    def sharedFlashInferMetadata(self, lengths: Any) -> Any:  # noqa: N802
        """Java ``int[][] sharedFlashInferMetadata(int... lengths)``: ``{indptr, indices, lastPageLen}`` of the step CSR
        (reused / bumped / rebuilt), copied to the host."""
        return self._csr(self.pool.shared_flashinfer_metadata(_ints(lengths)))

    def buildFlashInferMetadata(self, lengths: Any) -> Any:  # noqa: N802
        """Java ``int[][] buildFlashInferMetadata(int... lengths)``: ``{indptr, indices, lastPageLen}`` of a fresh CSR
        of the active rows."""
        return self._csr(self.pool.build_flashinfer_metadata(_ints(lengths)))

    def clearStepMetadata(self) -> None:  # noqa: N802
        """Java ``clearStepMetadata()``."""
        self.pool.clear_step_metadata()

    def sealLength(self, sealed: Any) -> bool:  # noqa: N802
        """Java ``boolean sealLength(int... sealedLen)``: true when the step CSR kept its tensors."""
        return bool(self.pool.seal_length(_ints(sealed)))

    def truncateTo(self, sealed: Any, written_end: Any) -> bool:  # noqa: N802
        """Java ``boolean truncateTo(int[] sealedLen, int[] writtenEnd)``: ``truncate_to``; IllegalArgumentException if
        ``writtenEnd < sealedLen`` or beyond a row's capacity."""
        return bool(self.pool.truncate_to(_ints(sealed), _ints(written_end)))

    def invalidateRange(self, from_pos: Any, end_pos: Any) -> None:  # noqa: N802
        """Java ``invalidateRange(int[] fromPos, int[] endPos)``: zero those positions on every layer; ``kvLen`` drops
        to at most ``fromPos``."""
        self.pool.invalidate_range(_ints(from_pos), _ints(end_pos))

    # page buckets
    def numPagesForLength(self, n: int) -> int:  # noqa: N802
        """Java ``numPagesForLength(int n)``: ``ceil(n / pageSize)``."""
        return _int(self.pool.num_pages_for_length(int(n)), "numPagesForLength")

    def stepsUntilPageBoundary(self, n: int) -> int:  # noqa: N802
        """Java ``stepsUntilPageBoundary(int cacheLen)``."""
        return _int(self.pool.steps_until_page_boundary(int(n)), "stepsUntilPageBoundary")

    def firstCacheLenInNextPageBucket(self, n: int) -> int:  # noqa: N802
        """Java ``firstCacheLenInNextPageBucket(int numPages)``: ``numPages * pageSize + 1``."""
        return _int(self.pool.first_cache_len_in_next_page_bucket(int(n)), "firstCacheLenInNextPageBucket")

    # audit
    def checkInvariants(self) -> None:  # noqa: N802
        """Java ``checkInvariants()``: IllegalStateException naming the first broken page (``KvCacheCorruptionError``).
        """
        self.pool.check_invariants()

    def statsJson(self) -> str:  # noqa: N802
        """Java ``String statsJson()``: ``stats()`` as a JSON object with sorted keys."""
        return json.dumps(self.pool.stats(), default=str, sort_keys=True)

    def close(self) -> None:
        """Java ``close()``: release the pool (idempotent); exported ``keyLayer``/``valueLayer`` buffers stay valid."""
        self.pool.close()


class _JavaListener:
    """A ``GenerationListener`` (Java) seen from ``generate()``."""

    def __init__(self, listener: Any) -> None:
        self._l = listener

    def on_input_tokens(self, n: int) -> None:
        self._l.onInputTokens(int(n))

    def on_cached_input_tokens(self, n: int) -> None:
        self._l.onCachedInputTokens(int(n))

    def on_generated_tokens(self, n: int) -> None:
        self._l.onGeneratedTokens(int(n))

    def on_thinking_tokens(self, n: int) -> None:
        self._l.onThinkingTokens(int(n))

    def on_text(self, chunk: str) -> None:
        self._l.onText(chunk)


@JImplements("smile.llm.LanguageModel", deferred=True)
@bridged
class LanguageModelAdapter:
    """``smile.llm.LanguageModel`` over a ``smile_llm.LanguageModel``."""

    def __init__(self, model: LanguageModel) -> None:
        self.model = model
        self._pool = KvCachePoolAdapter(model.pool)

    def encode(self, text: Any) -> np.ndarray:
        """Java ``int[] encode(String text)``; IllegalArgumentException for null or empty text."""
        if text is None:
            raise ValueError("text must not be null")
        return np.asarray(self.model.encode(str(text)), dtype=np.int32)

    def decode(self, tokens: Any) -> str:
        """Java ``String decode(int[] tokens)``: ``LanguageModel.decode`` (IllegalArgumentException for any id outside
        the vocabulary)."""
        return self.model.decode(_ints(tokens).tolist())

    def generate(self, prompt: Any, max_gen_len: int, temperature: float, topp: float, logprobs: bool, seed: int,
                 listener: Any, cancel: Any = None) -> Any:
        """Java ``Completion generate(int[] prompt, int maxGenLen, double temperature, double topp, boolean logprobs,
        long seed, GenerationListener listener[, BooleanSupplier cancelRequested])``: ``LanguageModel.generate`` (a
        negative ``maxGenLen`` means 0; a negative ``seed`` is read as the unsigned 64-bit value of its bits, as in
        Python),
        listener callbacks forwarded to Java. IllegalArgumentException for bad input,
        CancellationException when cancelled."""
        if prompt is None:
            raise ValueError("prompt must not be null")
        ids = _ints(prompt).tolist()
        out = self.model.generate(
            ids, max(0, int(max_gen_len)), temperature=float(temperature), top_p=float(topp),
            logprobs=bool(logprobs), seed=int(seed), listener=None if listener is None else _JavaListener(listener),
            cancel=None if cancel is None else (lambda: bool(cancel.getAsBoolean())))
        lp = None if out.logprobs is None else JArray(JFloat)(out.logprobs)
        return JClass("smile.llm.Completion")(out.text, JArray(JInt)(out.prompt_tokens), JArray(JInt)(out.tokens),
                                              out.finish_reason, lp, json.dumps(out.stats, default=str))

    def kvCachePool(self) -> Any:  # noqa: N802
        """Java ``kvCachePool()``: the model's pool (the same adapter every call)."""
        return self._pool

    def vocabSize(self) -> int:  # noqa: N802
        """Java ``vocabSize()``."""
        return _int(self.model.config.vocab_size, "vocabSize")

    def maxSeqLen(self) -> int:  # noqa: N802
        """Java ``maxSeqLen()``: the longest prompt plus new tokens one request may hold."""
        return _int(self.model.max_seq_len, "maxSeqLen")


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
class PinThread:
    """``Bridge.pinCurrentThread()``: see ``threads.pin_current_thread``."""

    from jpype import JOverride as _override

    @_override
    def run(self) -> None:
        """Pin the calling thread's Python thread state (``threads.pin_current_thread``); later calls do nothing."""
        pin_current_thread()
