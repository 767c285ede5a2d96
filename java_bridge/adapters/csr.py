"""A pool's FlashInfer CSRs and fixed index buffers as Java values: ``FlashInferKvMetadata`` objects
and host ``smile.deep.tensor.Tensor`` copies.

Identity follows the Python pool. A CSR the pool owns (the step CSR, the graph CSR, a prefetch CSR)
reaches Java as one ``FlashInferKvMetadata`` per Python object for as long as both live: the pool
rewrites such a CSR in place, so the Java object reads its parts live through a ``Source``
(``CsrSource``) and keeps a part's ``Tensor`` while its values are unchanged. A CSR the pool hands
over (``build_flashinfer_metadata``) is never rewritten: it becomes a fixed Java object of three
host tensors.

No reference cycle crosses the bridge: Python remembers each Java object through a Java
``WeakReference`` (the Java object holds its ``CsrSource``, which holds the Python CSR), so a CSR
the pool dropped and Java no longer holds is freed on both sides.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable
from typing import Any

import numpy as np
import torch
from jpype import JArray, JClass, JImplements, JInt, JLong

from smile_llm.cache.metadata import FlashInferKvMetadata

from ..errors import bridged

_META = "smile.llm.cache.FlashInferKvMetadata"
_PARTS = ("indptr", "indices", "last_page_len")


def host_array(t: torch.Tensor, dtype: type[np.integer[Any]]) -> np.ndarray:
    """A host copy of ``t`` as ``dtype`` (never a view of the tensor: the pool may rewrite it)."""
    return np.array(t.detach().cpu().numpy(), dtype=dtype, copy=True)


def host_tensor(values: np.ndarray) -> Any:
    """A ``smile.deep.tensor.Tensor`` of a 1-D int32 or int64 host array (``Int32``/``Int64``)."""
    java_type = JInt if values.dtype == np.int32 else JLong
    return JClass("smile.deep.tensor.Tensor").of(JArray(java_type)(values))


@JImplements("smile.llm.cache.FlashInferKvMetadata$Source", deferred=True)
@bridged
class CsrSource:
    """``FlashInferKvMetadata.Source`` over one Python CSR: each read copies a part under the pool's
    lock, so it never sees a half-written rewrite."""

    def __init__(self, meta: FlashInferKvMetadata, lock: Any) -> None:
        self.meta = meta
        self._lock = lock

    def read(self, part: int) -> np.ndarray:
        """Java ``int[] read(int part)``: the current values of ``indptr`` (0), ``indices`` (1) or
        ``last_page_len`` (2). IllegalArgumentException for another part."""
        if not 0 <= int(part) < len(_PARTS):
            raise ValueError(f"part must be 0 (indptr), 1 (indices) or 2 (lastPageLen), got {part}")
        with self._lock:
            return host_array(getattr(self.meta, _PARTS[int(part)]), np.int32)


class JavaCsrs:
    """The Java views of one pool's CSRs and index buffers (``lock``: the pool's lock)."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock
        self._mutex = threading.Lock()
        # a pool-owned Python CSR -> a Java WeakReference to its FlashInferKvMetadata
        self._owned: weakref.WeakKeyDictionary[FlashInferKvMetadata, Any] = \
            weakref.WeakKeyDictionary()
        self._tensors: dict[Hashable, tuple[np.ndarray, Any]] = {}

    def owned(self, meta: FlashInferKvMetadata | None) -> Any:
        """The Java object of a pool-owned CSR: the same one for as long as Java holds it (None for
        None)."""
        if meta is None:
            return None
        with self._mutex:
            ref = self._owned.get(meta)
            java = None if ref is None else ref.get()
            if java is None:
                java = JClass(_META)(CsrSource(meta, self._lock), JInt(meta.page_size))
                self._owned[meta] = JClass("java.lang.ref.WeakReference")(java)
            return java

    def fixed(self, meta: FlashInferKvMetadata) -> Any:
        """A fixed Java CSR of host copies of ``meta``'s tensors (a CSR the pool handed over)."""
        parts = [host_tensor(host_array(getattr(meta, p), np.int32)) for p in _PARTS]
        return JClass(_META)(*parts, JInt(meta.page_size))

    def python(self, source: Any, meta: Any, device: torch.device) -> FlashInferKvMetadata:
        """The Python CSR behind a Java one: the pool's own object when ``source`` is a
        ``CsrSource``, else a new CSR on ``device`` built from the Java tensors' values."""
        if isinstance(source, CsrSource):
            return source.meta
        if meta is None:
            raise ValueError("meta must not be null")
        parts = (meta.pagedKvIndptr(), meta.pagedKvIndices(), meta.pagedKvLastPageLen())
        if any(p is None for p in parts):
            raise ValueError("a FlashInferKvMetadata needs indptr, indices and lastPageLen tensors")
        tensors = [torch.tensor(np.asarray(p.intArray(), dtype=np.int32), device=device)
                   for p in parts]
        return FlashInferKvMetadata(tensors[0], tensors[1], tensors[2], int(meta.pageSize()))

    def tensor(self, key: Hashable, t: torch.Tensor, dtype: type[np.integer[Any]]) -> Any:
        """A host ``Tensor`` copy of the fixed buffer ``t`` (read under the pool's lock): the same
        Java object as the previous call for ``key`` while the values are unchanged."""
        with self._lock:
            values = host_array(t, dtype)
        with self._mutex:
            cached = self._tensors.get(key)
            if cached is not None and np.array_equal(cached[0], values):
                return cached[1]
            java = host_tensor(values)
            self._tensors[key] = (values, java)
            return java
