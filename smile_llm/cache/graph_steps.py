"""GraphSteps: the CUDA-graph side of a KvCachePool, the one object through which the pool reaches
its fixed graph buffers (:mod:`smile_llm.cache.graph_buffers`).

It prepares decode and verify graph steps (the graph CSR rewritten in place, the fixed write
indices, ``qo_indptr``), hands the prepared buffers to graph runners, runs decode prefetch captures
for a later page bucket, and tells the pool's K/V verbs which fixed index a put or ``kv_step``
writes through. Its methods carry the names of the pool verbs they implement (``KvCachePool``
delegates to them under its lock). Not locked itself; nothing here synchronises with the device.

The active step is the pool's (``StepSlot``); the graph indices prepared for a step stop applying
when the pool drops the step (``forget``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .binder import Binder
from .bindings import BindingTable
from .checks import as_int
from .graph_buffers import (
    DecodeGraphBuffers,
    GraphCsr,
    GraphStepCsr,
    PrefetchState,
    VerifyGraphBuffers,
)
from .metadata import FlashInferKvMetadata
from .step import ActiveStep, StepSlot


class GraphSteps:
    """The graph buffers of one pool (``decode``, ``verify``, the graph CSR ``csr`` every graph
    reads, and the ``prefetch`` state) and the graph verbs over them, for the active step in
    ``slot``. ``kv_len`` (the pool's ``BindingTable.kv_len``) is advanced when a prepared step
    counts as a write.
    """

    def __init__(self, slot: StepSlot, table: BindingTable, binder: Binder, page_size: int,
                 num_pages: int, device: torch.device) -> None:
        self._slot, self._table, self._binder = slot, table, binder
        self._num_pages = num_pages
        self.decode = DecodeGraphBuffers(device)
        self.verify = VerifyGraphBuffers(page_size, device)
        self.csr = GraphCsr(page_size, num_pages, device)
        self.prefetch = PrefetchState()

    # ------------------------------------------------------------------ for the pool's other parts
    def csr_step(self) -> ActiveStep:
        """The active step, for a verb that changes its CSR: RuntimeError while a prefetch capture
        holds it; NoActiveStepError without a step."""
        if self.prefetch.active:
            raise RuntimeError("a decode prefetch capture holds the step CSR; "
                               "end_prefetch_decode_graph_step first")
        return self._slot.require()

    def forget(self) -> None:
        """The pool dropped its active step: the prepared write indices no longer apply to any batch
        (the next graph-mode put raises until a step is prepared again); the tensors are kept."""
        self.decode.forget()
        self.verify.forget()

    def put_index(self, step: ActiveStep, start_pos: Any, seqlen: int) -> torch.Tensor | None:
        """The prepared fixed index a ``put`` of ``seqlen`` positions at ``start_pos`` must write
        through when ``decode_graph_buffers`` (S == 1) or ``verify_graph_buffers`` is on, else None.
        RuntimeError if none is prepared for this step and shape, ValueError if ``start_pos``
        differs from the prepared positions."""
        if self.decode.enabled and seqlen == 1:
            return self.decode.index_for(step, step.start_of(start_pos))
        if self.verify.enabled:
            return self.verify.index_for(step, step.start_of(start_pos), seqlen)
        return None

    def prepared_index(self, step: ActiveStep, window: np.ndarray | int, seqlen: int,
                       index: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
        """``(index, records)`` when ``index`` is the fixed decode (``seqlen == 1``) or verify write
        index, checked against what it was prepared for (errors as ``put_index``); ``records`` is
        False for a prefetch capture's scratch index (those writes are not the rows' KV). None for
        any other tensor."""
        if seqlen == 1 and index is self.decode.index:
            return self.decode.index_for(step, step.start_of(window)), not self.decode.scratch
        if index is self.verify.index:
            return self.verify.index_for(step, step.start_of(window), seqlen), True
        return None

    # ------------------------------------------------------------------ decode graphs
    def prepare_decode_graph_step(self, cache_len: Any, positions: Any) -> GraphStepCsr:
        """Prepare a decode step writing position ``positions[b]`` of each row
        (``cache_len == position + 1``, an int or one per row): the graph CSR of ``B`` rows
        rewritten in place for ``cache_len`` (its tensors stay the same across page boundaries; see
        ``reserve_graph_rows``) and the fixed ``[B]`` write index. Counts as a write of those
        positions (a replayed graph never calls put). The eager step CSR is left alone. Returns the
        graph CSR; nothing here synchronises with the device."""
        return self.decode.prepare(self.csr_step(), self._table.kv_len, self.csr, cache_len,
                                   positions)

    def reserve_graph_rows(self, rows: int) -> None:
        """Size the graph CSR every decode and verify graph reads for up to ``rows`` rows of the
        pool's full page count (``4 * rows * (num_pages + 2)`` bytes), so no later graph step of at
        most ``rows`` rows moves it. Growing it moves it: ``consume_verify_graph_meta_realloc``
        reports that, and graphs on the old tensors must be dropped (their backends' ``is_bound_to``
        turns False)."""
        self.csr.reserve(as_int(rows, "rows", minimum=1))

    def decode_graph_metadata(self, batch: int) -> GraphStepCsr:
        """The graph CSR a decode (or verify) graph of ``batch`` rows reads: the same tensors for
        the buffers' life, whatever the rows' lengths. RuntimeError if fewer than ``batch`` rows are
        reserved."""
        batch = as_int(batch, "batch", minimum=1)
        if batch > self.csr.rows:
            raise RuntimeError(f"no graph CSR for batch {batch} ({self.csr.rows} rows reserved); "
                               f"prepare_decode_graph_step or reserve_graph_rows first")
        return self.csr.view(batch)

    def decode_graph_index(self, batch: int) -> torch.Tensor:
        """The fixed ``int64[batch]`` write index of the prepared decode step (or of a prefetch
        capture), for ``kv_step(positions, 1, index=...)``: one tensor per batch size for the pool's
        life, rewritten in place by every prepare. RuntimeError unless a decode step of ``batch``
        rows is prepared for the active step."""
        d, step = self.decode, self._slot.step
        if d.index is None or step is None or d.prepared_for is not step or step.batch != batch:
            raise RuntimeError(f"no decode write index prepared for batch {batch}; call "
                               f"prepare_decode_graph_step (or begin_prefetch_decode_graph_step) "
                               f"first")
        return d.index

    # ------------------------------------------------------------------ decode prefetch captures
    def begin_prefetch_decode_graph_step(self, cache_len: int, cache_pos: int,
                                         batch: int) -> FlashInferKvMetadata:
        """Start capturing a decode graph for a later page bucket: the live step CSR is set aside, a
        CSR for ``cache_len`` is built from the live page table and installed, and every row's write
        index points at scratch slots the pool owns until ``close()``, so the capture never writes a
        live request's KV (and a put meanwhile does not count as a write). Slots past a row's
        ``kv_len`` up to ``cache_len`` hold no live KV and are zeroed, so the capture never reads
        NaN. Verbs that change the step CSR raise RuntimeError until
        ``end_prefetch_decode_graph_step``. KvCacheExhaustedError if the scratch pages cannot be
        had."""
        return self.prefetch.begin(self._slot.require(), self.decode, self._binder,
                                   self._table.kv_len, cache_len, cache_pos, batch)

    def end_prefetch_decode_graph_step(self) -> FlashInferKvMetadata:
        """Restore the live step CSR and return the prefetch one (for
        ``install_prefetched_step_metadata``). The decode write index must be prepared again before
        the next decode put."""
        return self.prefetch.end(self._slot.step, self.decode)

    def install_prefetched_step_metadata(self, meta: FlashInferKvMetadata,
                                         uniform_len: int) -> None:
        """Make ``meta`` (a prefetched CSR) the step CSR for length ``uniform_len``; ValueError if
        its batch differs from the active step's or the length is out of range."""
        step = self.csr_step()
        if not isinstance(meta, FlashInferKvMetadata) or meta.batch_size != step.batch:
            got = getattr(meta, "batch_size", type(meta).__name__)
            raise ValueError(f"install_prefetched_step_metadata needs a FlashInferKvMetadata of "
                             f"batch {step.batch}, got {got}")
        lengths = step.lengths(as_int(uniform_len, "uniform_len", minimum=1), "uniform_len")
        step.check_describes(meta, lengths, self._num_pages)
        step.csr.install(meta, lengths)

    # ------------------------------------------------------------------ verify windows
    def prepare_verify_graph_step(self, cache_lens: Any, start_positions: Any,
                                  window_len: int) -> FlashInferKvMetadata:
        """Prepare a verify window of ``window_len`` tokens per row
        (``cache_lens[b] == start_positions[b] + window_len``; an int means uniform): the graph CSR
        of ``B`` rows rewritten in place (the one decode graphs read; it moves only when more rows
        are reserved: see ``consume_verify_graph_meta_realloc``) and the fixed ``[B*W]`` write
        index. Counts as a write of the windows. Returns the graph CSR; nothing here synchronises
        with the device."""
        return self.verify.prepare(self._slot.require(), self._table.kv_len, self.csr, cache_lens,
                                   start_positions, window_len)

    def prepare_verify_step(self, cache_lens: Any, start_positions: Any,
                            window_len: int) -> FlashInferKvMetadata:
        """Eager ragged verify: the step CSR for ``cache_lens`` (reuse / bump / rebuild) and the
        ``[B*W]`` write index for ``put`` with ``verify_graph_buffers``. Returns the step CSR."""
        return self.verify.prepare(self.csr_step(), self._table.kv_len, None, cache_lens,
                                   start_positions, window_len)

    def verify_graph_index(self, batch: int, window_len: int) -> torch.Tensor:
        """The fixed ``int64[batch * window_len]`` write index of the prepared verify windows, for
        ``kv_step(starts, window_len, index=...)``: one tensor per (batch, window) for the pool's
        life. RuntimeError unless ``prepare_verify_graph_step``/``prepare_verify_step`` prepared
        that shape for the active step."""
        vb, step = self.verify, self._slot.step
        if vb.index is None or step is None or vb.prepared_for is not step or step.batch != batch \
                or vb.window != window_len:
            raise RuntimeError(f"no verify write index prepared for batch {batch}, window "
                               f"{window_len}; call prepare_verify_graph_step first")
        return vb.index

    def verify_graph_metadata(self) -> GraphStepCsr:
        """The graph CSR of the last ``prepare_verify_graph_step``; RuntimeError if never
        prepared."""
        if self.verify.meta is None:
            raise RuntimeError("verify graph metadata not prepared; call prepare_verify_graph_step "
                               "first")
        return self.verify.meta

    def consume_verify_graph_meta_realloc(self) -> bool:
        """True once after the graph CSR (decode and verify graphs alike) moved to new tensors: its
        first allocation and every growth of ``reserve_graph_rows``. Drop graphs captured on the old
        ones."""
        moved, self.csr.moved = self.csr.moved, False
        return moved

    def verify_qo_indptr(self, batch: int, window_len: int) -> torch.Tensor:
        """int32 ``[0, W, 2W, .., B*W]`` on the pool's device: one fixed tensor per shape for the
        pool's life."""
        return self.verify.qo_indptr(as_int(batch, "batch", minimum=1),
                                     as_int(window_len, "window_len", minimum=1))
