"""Fixed-address buffers that captured CUDA graphs read: the graph CSR, the decode and verify write
indices, the query-side ``qo_indptr``, and the scratch slots a decode prefetch writes to.

Every tensor a graph reads keeps its address and is rewritten in place. The graph CSR
(:class:`GraphCsr`) is one set of buffers for every graph of the pool: ``indptr`` ``[R+1]``,
``last_page_len`` ``[R]`` and ``indices`` for ``R`` rows of the pool's full page count, so a graph
of ``B <= R`` rows reads the leading ``[B+1]``/``[B]`` entries and any row lengths fit (FlashInfer's
graph mode takes an over-provisioned indices buffer). It moves only when more rows are reserved
(``GraphCsr.moved``). Write indices and ``qo_indptr`` exist once per shape for the pool's life.
Buffers are sized by the same rule that fills them (pages for the CSR, tokens for write indices), so
a fill can never overrun them (SGLang PR 24587).

Host-to-device writes are ``non_blocking`` (from pageable memory the copy is staged before the call
returns), and the CSR keeps host mirrors that planners read instead of the device
(:class:`GraphStepCsr`): preparing a graph step never synchronises with the device. Nothing here
runs inside a capture: the pool prepares these before each replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .checks import as_int
from .errors import KvCacheExhaustedError
from .metadata import FlashInferKvMetadata, build_csr, csr_arrays
from .pages import PageOwner, page_slots
from .step import ActiveStep

if TYPE_CHECKING:
    from .binder import Binder


def _copy_in(dst: torch.Tensor, src: np.ndarray) -> None:
    """Rewrite the leading ``len(src)`` entries of the fixed tensor ``dst`` in place (no device
    synchronisation)."""
    dst[: len(src)].copy_(torch.from_numpy(src), non_blocking=True)


_EMPTY32 = np.zeros(0, dtype=np.int32)


@dataclass(eq=False)
class GraphStepCsr(FlashInferKvMetadata):
    """The leading ``B`` rows of the pool's fixed graph CSR, with host mirrors of ``indptr`` and
    ``last_page_len`` that always equal the device tensors after a prepare (a planner reads them
    instead of the device). ``indices`` is the whole over-provisioned buffer: only its leading
    ``host_indptr[-1]`` entries are meaningful."""

    # views of the host mirrors: int32[B+1] and int32[B]
    host_indptr: np.ndarray = field(default_factory=lambda: _EMPTY32)
    host_last_page_len: np.ndarray = field(default_factory=lambda: _EMPTY32)

    @property
    def num_used_pages(self) -> int:
        """``indptr[-1]``: the meaningful leading entries of ``indices``."""
        return int(self.host_indptr[-1])


class GraphCsr:
    """The one fixed CSR every captured graph of a pool reads (decode and verify alike), sized for
    ``rows`` rows of ``num_pages`` pages each: ``4 * rows * (num_pages + 2)`` bytes on the device.
    ``view(B)`` is the cached :class:`GraphStepCsr` of its leading ``B`` rows (the same object, same
    tensors, for the buffers' life). ``write`` rewrites it in place for the active step's lengths,
    from the first row whose page count changed."""

    def __init__(self, page_size: int, num_pages: int, device: torch.device) -> None:
        self.page_size, self.num_pages, self.device = page_size, num_pages, device
        self.rows = 0
        self.moved = False  # set when the buffers are (re)allocated; the pool reports and clears it
        self._indptr = self._indices = self._last = torch.zeros(0, dtype=torch.int32)
        self._host_indptr = np.zeros(1, dtype=np.int32)
        self._host_last = _EMPTY32
        self._views: dict[int, GraphStepCsr] = {}
        # the step and page counts the buffers hold (for partial rewrites)
        self._written_for: ActiveStep | None = None
        self._num_pages: np.ndarray | None = None

    @torch.inference_mode(False)  # fixed buffers outlive the forward that creates them
    def reserve(self, rows: int) -> None:
        """Make room for ``rows`` rows: reallocates (and sets ``moved``) only when ``rows`` exceeds
        the current reservation; graphs on the old tensors must then be dropped."""
        if rows <= self.rows:
            return
        dev = self.device
        self._indptr = torch.zeros(rows + 1, dtype=torch.int32, device=dev)
        self._indices = torch.zeros(rows * self.num_pages, dtype=torch.int32, device=dev)
        self._last = torch.zeros(rows, dtype=torch.int32, device=dev)
        self._host_indptr = np.zeros(rows + 1, dtype=np.int32)
        self._host_last = np.zeros(rows, dtype=np.int32)
        self.rows, self.moved = rows, True
        self._views.clear()
        self._written_for = self._num_pages = None

    def view(self, batch: int) -> GraphStepCsr:
        """The CSR of the leading ``batch`` rows (``batch <= rows``)."""
        v = self._views.get(batch)
        if v is None:
            assert batch <= self.rows, (batch, self.rows)
            v = self._views[batch] = GraphStepCsr(self._indptr[: batch + 1], self._indices,
                                                  self._last[:batch], self.page_size,
                                                  self._host_indptr[: batch + 1],
                                                  self._host_last[:batch])
        return v

    def write(self, step: ActiveStep, lengths: np.ndarray) -> GraphStepCsr:
        """Rewrite the buffers in place for the active rows at ``lengths`` (each >= 1): O(B) when
        every row keeps its page count, else the indices from the first row whose count changed;
        reserves ``step.batch`` rows first."""
        self.reserve(step.batch)
        batch, ps = step.batch, self.page_size
        num_pages = -(-lengths // ps)
        last = ((lengths - 1) % ps + 1).astype(np.int32)
        self._host_last[:batch] = last
        _copy_in(self._last, last)
        written = self._num_pages if self._written_for is step else None
        if written is None or not np.array_equal(num_pages, written):
            # rows before the first changed one keep theirs
            first = 0 if written is None else int(np.argmax(num_pages != written))
            indptr, indices, _ = csr_arrays(step.page_table32[first:], lengths[first:], ps)
            offset = int(self._host_indptr[first])
            self._host_indptr[first : batch + 1] = indptr + offset
            _copy_in(self._indptr[first:], self._host_indptr[first : batch + 1])
            self._indices[offset : offset + len(indices)].copy_(torch.from_numpy(indices),
                                                                non_blocking=True)
            self._written_for, self._num_pages = step, num_pages
        return self.view(batch)


class DecodeGraphBuffers:
    """The ``[B]`` write index of a decode step (one token per row), prepared for one step and
    positions."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.enabled = False
        self.index: torch.Tensor | None = None  # int64[B] of the prepared step
        self._by_batch: dict[int, torch.Tensor] = {}  # one fixed index per batch size, for good
        self.prepared_for: ActiveStep | None = None
        self.positions: np.ndarray | None = None  # int64[B] the index points at
        self.scratch = False  # True while a prefetch capture points every row at scratch slots

    @torch.inference_mode(False)  # fixed buffers outlive the forward that creates them
    def point_at(self, step: ActiveStep, positions: np.ndarray, slots: np.ndarray,
                 scratch: bool) -> None:
        """Rewrite the fixed ``[B]`` write index of this batch size in place with ``slots`` (created
        once per batch size, never moved) and remember the step and ``positions`` it was prepared
        for; ``scratch`` marks a prefetch writing to scratch slots."""
        index = self._by_batch.get(step.batch)
        if index is None:  # graphs keyed to another batch keep theirs: a shape's buffer never moves
            index = torch.zeros(step.batch, dtype=torch.int64, device=self.device)
            self._by_batch[step.batch] = index
        _copy_in(index, slots)
        self.index = index
        self.prepared_for, self.positions, self.scratch = step, positions.copy(), scratch

    def forget(self) -> None:
        """Mark the buffer unprepared (the next graph-mode put raises until a step is prepared
        again); the tensors are kept."""
        self.prepared_for, self.positions, self.scratch = None, None, False

    def prepare(self, step: ActiveStep, kv_len: np.ndarray, csr: GraphCsr, cache_len: Any,
                positions: Any) -> GraphStepCsr:
        """The graph CSR for ``cache_len`` and the write index of ``positions``; counts as a write
        of them. The eager step CSR is left alone."""
        lengths, starts = step.window_lengths(cache_len, positions, 1, "prepare_decode_graph_step")
        meta = csr.write(step, lengths)
        self.point_at(step, starts, step.slots(starts, 1), scratch=False)
        step.advance_kv_len(kv_len, starts, 1)
        return meta

    def index_for(self, step: ActiveStep, start: np.ndarray) -> torch.Tensor:
        """The prepared index for a one-token put at ``start``. RuntimeError if not prepared for
        this step, ValueError if ``start`` differs from the prepared positions."""
        if self.index is None or self.prepared_for is not step or self.positions is None:
            raise RuntimeError(f"decode graph buffers are on but no decode step was prepared for "
                               f"this batch of {step.batch}; call "
                               f"prepare_decode_graph_step(cache_len, positions) first")
        if not np.array_equal(start, self.positions):
            raise ValueError(f"put at start_pos {start.tolist()} but the decode step was prepared "
                             f"for positions {self.positions.tolist()}")
        return self.index


class VerifyGraphBuffers:
    """The ``[B*W]`` write index of verify windows (one per (batch, window) for the pool's life),
    the last verify graph CSR handed out, and one ``qo_indptr`` per (batch, window)."""

    def __init__(self, page_size: int, device: torch.device) -> None:
        self.page_size = page_size
        self.device = device
        self.enabled = False
        self.window_kernel = False
        self.meta: GraphStepCsr | None = None  # the graph CSR of the last prepared verify graph
        self.index: torch.Tensor | None = None  # int64[B*W] of the prepared windows
        # one fixed index per (B, W) for the pool's life
        self._by_shape: dict[tuple[int, int], torch.Tensor] = {}
        self.prepared_for: ActiveStep | None = None
        self.starts: np.ndarray | None = None
        self.window = 0
        self._qo_indptr: dict[tuple[int, int], torch.Tensor] = {}

    @torch.inference_mode(False)  # fixed buffers outlive the forward that creates them
    def write_index(self, step: ActiveStep, starts: np.ndarray, window: int) -> None:
        """Rewrite the fixed ``[B * window]`` write index of this (batch, window) in place with the
        slots of positions ``starts[b] + [0, window)`` of every active row, and remember what it was
        prepared for."""
        key = (step.batch, window)
        index = self._by_shape.get(key)
        if index is None:
            index = torch.zeros(step.batch * window, dtype=torch.int64, device=self.device)
            self._by_shape[key] = index
        _copy_in(index, step.slots(starts, window))
        self.index = index
        self.prepared_for, self.starts, self.window = step, starts.copy(), window

    def index_for(self, step: ActiveStep, start: np.ndarray, seqlen: int) -> torch.Tensor:
        """The prepared verify write index for a put of ``seqlen`` positions at ``start``.
        RuntimeError if none was prepared for this step and window; ValueError if ``start`` differs
        from the prepared start positions."""
        if self.index is None or self.prepared_for is not step or self.starts is None \
                or self.window != seqlen:
            raise RuntimeError(f"verify KV index buffer not prepared for batch {step.batch}, "
                               f"seqlen {seqlen}; call prepare_verify_graph_step or "
                               f"prepare_verify_step first")
        if not np.array_equal(start, self.starts):
            raise ValueError(f"put at start_pos {start.tolist()} but the verify window was "
                             f"prepared at {self.starts.tolist()}")
        return self.index

    def prepare(self, step: ActiveStep, kv_len: np.ndarray, csr: GraphCsr | None, cache_lens: Any,
                start_positions: Any, window_len: int) -> FlashInferKvMetadata:
        """The write index of the windows plus, for a graph (``csr`` given), the graph CSR (and the
        windows count as written), or, eagerly, the step CSR (the puts that follow write them)."""
        window = as_int(window_len, "window_len", minimum=1)
        what = "prepare_verify_graph_step" if csr is not None else "prepare_verify_step"
        lengths, starts = step.window_lengths(cache_lens, start_positions, window, what)
        meta: FlashInferKvMetadata
        if csr is not None:
            meta = self.meta = csr.write(step, lengths)
        else:
            meta = step.csr.get(step.page_table32, lengths)[0]
        self.write_index(step, starts, window)
        if csr is not None:
            step.advance_kv_len(kv_len, starts, window)
        return meta

    @torch.inference_mode(False)  # fixed buffers outlive the forward that creates them
    def qo_indptr(self, batch: int, window: int) -> torch.Tensor:
        """The fixed int32 query indptr ``[0, W, 2W, .., B*W]`` of (``batch``, ``window``): one
        tensor per shape for the pool's life."""
        key = (batch, window)
        t = self._qo_indptr.get(key)
        if t is None:
            t = torch.arange(0, (batch + 1) * window, window, dtype=torch.int32, device=self.device)
            self._qo_indptr[key] = t
        return t

    def forget(self) -> None:
        """Mark the verify write index unprepared; the tensors are kept."""
        self.prepared_for, self.starts, self.window = None, None, 0


class PrefetchState:
    """A decode capture for the next page bucket: the live step CSR saved aside, the CSR built for
    the capture, and the scratch pages (owned by the pool until ``close``) every row writes to
    meanwhile."""

    def __init__(self) -> None:
        self.scratch_pages = np.zeros(0, dtype=np.int64)
        self.active = False
        self.saved_meta: FlashInferKvMetadata | None = None
        self.saved_lengths: np.ndarray | None = None
        self.saved_step: ActiveStep | None = None
        self.meta: FlashInferKvMetadata | None = None

    def begin(self, step: ActiveStep, decode: DecodeGraphBuffers, binder: Binder,
              kv_len: np.ndarray, cache_len: int, cache_pos: int,
              batch: int) -> FlashInferKvMetadata:
        """Start a decode-graph prefetch for the next page bucket: writes of the prepared step go to
        pool-owned scratch slots (allocated on first use) and the returned CSR describes
        ``cache_len`` tokens over the live page table. ValueError if ``batch`` is not the active
        batch or the lengths are out of range; RuntimeError if a prefetch is already in progress."""
        if batch != step.batch:
            raise ValueError(f"prefetch for batch {batch} but the active step has {step.batch} "
                             f"rows")
        if self.active:
            raise RuntimeError("a prefetch is already in progress; end_prefetch_decode_graph_step "
                               "first")
        cache_len = as_int(cache_len, "cache_len", minimum=1, maximum=step.min_capacity)
        cache_pos = as_int(cache_pos, "cache_pos", minimum=0, maximum=cache_len - 1)
        ps = step.page_size
        need = -(-cache_len // ps) - len(self.scratch_pages)
        if need > 0:
            if need > binder.available_pages():
                raise KvCacheExhaustedError(f"prefetch needs {need} more scratch pages, have "
                                            f"{binder.available_pages()} free or evictable")
            added = binder.take(need, PageOwner.SCRATCH)
            binder.kv.zero_slots(page_slots(added, ps))  # scratch never holds NaN
            self.scratch_pages = np.concatenate([self.scratch_pages, added])
        # The capture attends to [0, cache_len) of the live rows; what lies past a row's kv_len
        # there is no live KV (at most rejected drafts), so it is zeroed: the capture never reads
        # NaN or stale values.
        kv_end = np.minimum(kv_len[step.rows], cache_len)
        lengths = np.full(step.batch, cache_len, dtype=np.int64)
        binder.kv.zero_slots(step.range_slots(kv_end, lengths))
        self.saved_meta, self.saved_lengths, self.saved_step = step.csr.meta, step.csr.lengths, step
        self.meta = build_csr(step.page_table32, lengths, ps, step.device)
        step.csr.install(self.meta, lengths)
        slot = int(self.scratch_pages[cache_pos // ps]) * ps + cache_pos % ps
        decode.point_at(step, np.full(step.batch, cache_pos, dtype=np.int64),
                        np.full(step.batch, slot, np.int64), scratch=True)
        self.active = True
        return self.meta

    def end(self, step: ActiveStep | None, decode: DecodeGraphBuffers) -> FlashInferKvMetadata:
        """End the prefetch: restore the live step CSR (or clear it if the step changed meanwhile),
        forget the scratch write index and return the prefetch CSR. RuntimeError if no prefetch is
        in progress."""
        meta = self.meta
        if not self.active or meta is None:
            raise RuntimeError("no prefetch in progress; call begin_prefetch_decode_graph_step "
                               "first")
        if step is not None and step is self.saved_step:
            if self.saved_meta is not None and self.saved_lengths is not None:
                step.csr.install(self.saved_meta, self.saved_lengths)
            else:
                step.csr.clear()
        decode.forget()
        self.meta, self.active = None, False
        self.saved_meta, self.saved_lengths, self.saved_step = None, None, None
        return meta
