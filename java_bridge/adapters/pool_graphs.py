"""The CUDA-graph calls of ``smile.llm.cache.KvCachePool.Backend``: the fixed graph buffers of a
``smile_llm.cache.KvCachePool`` (``graph_steps.GraphSteps``) and the decode prefetch, by their
Java names.

Every CSR they return is pool-owned (``csr.JavaCsrs.owned``: one Java object per Python CSR, read
live); the fixed index buffers cross as host ``Tensor`` copies (``csr.JavaCsrs.tensor``). The calls
work on every device; nothing here synchronises with the device except reading a buffer back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from smile_llm import KvCachePool

from ..errors import bridged
from .convert import int_array, int_or_array
from .csr import JavaCsrs


@bridged
class GraphCalls:
    """The graph calls of ``KvCachePoolAdapter`` (which sets ``pool`` and ``csrs``)."""

    pool: KvCachePool
    csrs: JavaCsrs

    # switches
    def decodeGraphBuffers(self) -> bool:  # noqa: N802 - Java names
        """Java ``decodeGraphBuffers()``: a one-token put writes through the prepared decode
        index."""
        return bool(self.pool.decode_graph_buffers)

    def setDecodeGraphBuffers(self, on: bool) -> None:  # noqa: N802
        """Java ``setDecodeGraphBuffers(boolean)``."""
        self.pool.decode_graph_buffers = bool(on)

    def verifyGraphBuffers(self) -> bool:  # noqa: N802
        """Java ``verifyGraphBuffers()``: a put writes through the prepared verify index."""
        return bool(self.pool.verify_graph_buffers)

    def setVerifyGraphBuffers(self, on: bool) -> None:  # noqa: N802
        """Java ``setVerifyGraphBuffers(boolean)``."""
        self.pool.verify_graph_buffers = bool(on)

    def verifyWindowKernel(self) -> bool:  # noqa: N802
        """Java ``verifyWindowKernel()``."""
        return bool(self.pool.verify_window_kernel)

    def setVerifyWindowKernel(self, on: bool) -> None:  # noqa: N802
        """Java ``setVerifyWindowKernel(boolean)``."""
        self.pool.verify_window_kernel = bool(on)

    # decode graphs
    def prepareDecodeGraphStep(self, cache_len: Any, positions: Any) -> Any:  # noqa: N802
        """Java ``FlashInferKvMetadata prepareDecodeGraphStep(int | int[] cacheLen, int[]
        positions)``: ``prepare_decode_graph_step``; returns the graph CSR."""
        meta = self.pool.prepare_decode_graph_step(int_or_array(cache_len), int_array(positions))
        return self.csrs.owned(meta)

    def reserveGraphRows(self, rows: int) -> None:  # noqa: N802
        """Java ``reserveGraphRows(int rows)``."""
        self.pool.reserve_graph_rows(int(rows))

    def decodeGraphMetadata(self, batch: int) -> Any:  # noqa: N802
        """Java ``decodeGraphMetadata(int batch)``: the graph CSR of ``batch`` rows;
        IllegalStateException if fewer rows are reserved."""
        return self.csrs.owned(self.pool.decode_graph_metadata(int(batch)))

    def decodeGraphIndex(self, batch: int) -> Any:  # noqa: N802
        """Java ``Tensor decodeGraphIndex(int batch)``: a host Int64 copy of the fixed decode write
        index."""
        index = self.pool.decode_graph_index(int(batch))
        return self.csrs.tensor(("decode", int(batch)), index, np.int64)

    # decode prefetch
    def beginPrefetchDecodeGraphStep(self, cache_len: int, cache_pos: int,  # noqa: N802
                                     batch: int) -> Any:
        """Java ``beginPrefetchDecodeGraphStep(int cacheLen, int cachePos, int batch)``: returns the
        prefetch CSR (installed as the step CSR until the prefetch ends)."""
        meta = self.pool.begin_prefetch_decode_graph_step(int(cache_len), int(cache_pos),
                                                          int(batch))
        return self.csrs.owned(meta)

    def endPrefetchDecodeGraphStep(self) -> Any:  # noqa: N802
        """Java ``endPrefetchDecodeGraphStep()``: restores the live step CSR, returns the prefetch
        one."""
        return self.csrs.owned(self.pool.end_prefetch_decode_graph_step())

    def installPrefetchedStepMetadata(self, source: Any, meta: Any,  # noqa: N802
                                      uniform_len: int) -> None:
        """Java ``installPrefetchedStepMetadata(FlashInferKvMetadata meta, int uniformLen)``: the
        pool's own CSR when ``meta`` is one of its pool-owned ones (``source``), else one built from
        ``meta``'s values."""
        python_meta = self.csrs.python(source, meta, self.pool.device)
        self.pool.install_prefetched_step_metadata(python_meta, int(uniform_len))

    # verify windows
    def prepareVerifyGraphStep(self, cache_lens: Any, starts: Any,  # noqa: N802
                               window_len: int) -> Any:
        """Java ``prepareVerifyGraphStep(int | int[] cacheLen, int[] startPositions, int
        windowLen)``: ``prepare_verify_graph_step``; returns the graph CSR."""
        meta = self.pool.prepare_verify_graph_step(int_or_array(cache_lens), int_array(starts),
                                                   int(window_len))
        return self.csrs.owned(meta)

    def prepareVerifyStep(self, cache_lens: Any, starts: Any, window_len: int) -> Any:  # noqa: N802
        """Java ``prepareVerifyStep(int | int[] cacheLen, int[] startPositions, int windowLen)``:
        the eager form; returns the step CSR."""
        meta = self.pool.prepare_verify_step(int_or_array(cache_lens), int_array(starts),
                                             int(window_len))
        return self.csrs.owned(meta)

    def verifyGraphIndex(self, batch: int, window_len: int) -> Any:  # noqa: N802
        """Java ``Tensor verifyGraphIndex(int batch, int windowLen)``: a host Int64 copy of the
        fixed verify write index."""
        index = self.pool.verify_graph_index(int(batch), int(window_len))
        return self.csrs.tensor(("verify", int(batch), int(window_len)), index, np.int64)

    def verifyGraphMetadata(self) -> Any:  # noqa: N802
        """Java ``verifyGraphMetadata()``: the graph CSR of the last verify graph step."""
        return self.csrs.owned(self.pool.verify_graph_metadata())

    def consumeVerifyGraphMetaRealloc(self) -> bool:  # noqa: N802
        """Java ``consumeVerifyGraphMetaRealloc()``: true once after the graph CSR moved."""
        return bool(self.pool.consume_verify_graph_meta_realloc())

    def verifyQoIndptrBuf(self, batch: int, window_len: int) -> Any:  # noqa: N802
        """Java ``Tensor verifyQoIndptrBuf(int batch, int windowLen)``: a host Int32 copy of the
        fixed ``[0, W, .., B*W]`` query indptr, the same Java object for every call of a shape."""
        qo = self.pool.verify_qo_indptr(int(batch), int(window_len))
        return self.csrs.tensor(("qo", int(batch), int(window_len)), qo, np.int32)
