"""StepVerbs: the verbs of a KvCachePool that act on its active step.

Writing and reading the active rows' K/V (``put``, ``kv_step``, ``get``, slot indices), the step CSR
FlashInfer reads (``shared_flashinfer_metadata`` and friends), and what a verify window leaves
behind (``seal_length``, ``truncate_to``, ``move_kv``, ``invalidate_range``). Every check runs
before anything is written, so a verb that raises changes nothing. The methods carry the names of
the pool verbs they implement (``KvCachePool`` delegates to them under its lock, journaling the
state-changing ones); not locked itself.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .bindings import BindingTable
from .checks import as_int, as_layer
from .errors import KvCacheExhaustedError
from .graph_steps import GraphSteps
from .kv_step import KvStep
from .kv_store import KvStore
from .metadata import FlashInferKvMetadata, build_csr
from .step import ActiveStep, StepSlot


class StepVerbs:
    """The active-step verbs of one pool over its step ``slot``, K/V store ``kv`` and the written
    lengths ``table.kv_len``. ``commit`` is the pool's ``KvStep.commit`` (it takes the pool's lock
    and calls ``record_commit``): a bound method of the pool, held weakly so that the pool never
    refers to itself and is freed as soon as it is dropped (each KvStep holds it strongly).
    ``zero_rejected_kv`` is the pool's switch of that name."""

    def __init__(self, slot: StepSlot, graphs: GraphSteps, kv: KvStore, table: BindingTable,
                 num_layers: int, zero_rejected_kv: bool,
                 commit: Callable[[KvStep], None]) -> None:
        self._slot, self._graphs, self._kv, self._table = slot, graphs, kv, table
        self._num_layers = num_layers
        self._commit = weakref.WeakMethod(commit)
        self.zero_rejected_kv = zero_rejected_kv

    def set_zero_rejected_kv(self, on: bool) -> None:
        """Set ``zero_rejected_kv`` (``truncate_to`` zeroes the rejected tail of a verify
        window)."""
        self.zero_rejected_kv = bool(on)

    def ensure_request(self, batch_size: int, end_pos: int) -> None:
        """Raise KvCacheExhaustedError unless the active step has ``batch_size`` rows, each with
        capacity ``>= end_pos``."""
        batch_size = as_int(batch_size, "batch_size", minimum=1)
        end_pos = as_int(end_pos, "end_pos", minimum=0)
        step = self._slot.step
        if step is None:
            raise KvCacheExhaustedError("No request bound; call bind_request/activate_step or "
                                        "bind_with_prefix first")
        if step.batch != batch_size:
            raise KvCacheExhaustedError(
                f"active step has {step.batch} rows, not {batch_size}; activate the batch first")
        if end_pos > step.min_capacity:
            raise KvCacheExhaustedError(
                f"need end_pos={end_pos}, bound capacity={step.min_capacity} (pool does not grow)")

    # ------------------------------------------------------------------ writing KV
    def put(self, layer: int, start_pos: Any, k: torch.Tensor, v: torch.Tensor,
            slot_idx: torch.Tensor | None = None) -> None:
        """Write positions ``[start, start + S)`` of every active row from ``k``/``v``
        ``[B, S, Hkv, D]`` (cast to the pool dtype; FP8 stores ``x / scale``); ``start_pos`` is an
        int or one per row. A put at ``start <= kv_len`` raises ``kv_len`` to ``start + S``. Raises
        KvCacheExhaustedError past a row's capacity and ValueError below its matched prefix, for a
        wrong shape, dtype family or device, or for ``k``/``v`` sharing memory with the pool's
        buffers; nothing is written then. ``slot_idx`` is an optional precomputed ``int64[B*S]``
        equal to ``window_slot_indices(start_pos, S)`` (ValueError otherwise).

        With ``decode_graph_buffers`` on and S == 1, or with ``verify_graph_buffers`` on, the write
        goes through the prepared fixed index buffer: RuntimeError if none is prepared for this step
        and shape, ValueError if ``start_pos`` differs from the prepared positions. A put is
        ``kv_step`` + one layer's write + commit."""
        step = self._slot.require()
        layer = as_layer(layer, self._num_layers)
        seqlen = step.check_kv(self._kv, k, v)
        fixed = self._graphs.put_index(step, start_pos, seqlen)
        kv = self._open(step, start_pos, seqlen, slot_idx if fixed is None else fixed, "put",
                        "slot_idx")
        kv.write(layer, k, v)
        self._record(kv)

    def kv_step(self, start_pos: Any, seqlen: int, index: torch.Tensor | None = None) -> KvStep:
        """The KV write handle of one forward over the active rows: positions
        ``[start, start + seqlen)`` of each row (``start_pos`` an int or one per row), validated
        once here. Every layer writes through ``KvStep.write`` (no lock, no checks) and the forward
        calls ``KvStep.commit`` once it has succeeded, which records the write in ``kv_len`` as
        ``put`` does; a forward that raises never commits.

        ``index``: None (the pool computes the window's slot index), the fixed buffer of
        ``decode_graph_index`` / ``verify_graph_index`` prepared for exactly these positions
        (CUDA-graph runners; a decode prefetch's scratch index records nothing at commit), or a
        caller's ``int64[B*seqlen]`` equal to ``window_slot_indices(start_pos, seqlen)``. Raises
        NoActiveStepError without a step, KvCacheExhaustedError past a row's capacity, ValueError
        below a matched prefix or for a bad ``index``, RuntimeError for a graph buffer not prepared
        for this step; nothing changes then."""
        step = self._slot.require()
        seqlen = as_int(seqlen, "seqlen")
        return self._open(step, start_pos, seqlen, index, "kv_step", "index")

    def _open(self, step: ActiveStep, start_pos: Any, seqlen: int, index: torch.Tensor | None,
              what: str, name: str) -> KvStep:
        """A validated KvStep of the window; ``index`` as ``kv_step`` takes it (``name`` names it in
        errors)."""
        window = step.write_window(start_pos, seqlen, what)
        records = True
        if index is None:
            idx = step.index(window, seqlen)
        else:
            prepared = self._graphs.prepared_index(step, window, seqlen, index)
            if prepared is None:
                idx = step.check_index(index, window, seqlen, name)
            else:
                idx, records = prepared
        commit = self._commit()
        assert commit is not None, "the pool that owns these verbs is gone"
        plan = None
        if not self._kv.direct:
            plan = self._kv.plan_window(step.page_table, step.start_of(window), seqlen,
                                        [b.page_ids for b in step.bindings])
        return KvStep(self._kv, step, window, seqlen, idx, records, commit, plan)

    def _record(self, kv: KvStep) -> None:
        if kv.records:
            kv.active.advance_kv_len(self._table.kv_len, kv.window, kv.seqlen)

    def record_commit(self, kv: KvStep) -> None:
        """``KvStep.commit`` (under the pool's lock): record the window in ``kv_len``. RuntimeError,
        recording nothing, if the active step changed since ``kv_step``."""
        if self._slot.step is not kv.active:
            raise RuntimeError("KvStep.commit: the active step changed since kv_step (a request "
                               "was activated, unbound or offloaded during the forward); nothing "
                               "was recorded")
        self._record(kv)

    # ------------------------------------------------------------------ reading KV
    def get(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions ``[0, length)`` of every active row, ``[B, length, Hkv, D]`` in
        ``compute_dtype``. ``length`` is at most the smallest active capacity (ValueError beyond);
        positions past ``kv_len`` return whatever is stored."""
        return self._slot.require().read(self._kv, as_layer(layer, self._num_layers), length)

    def get_padded(self, layer: int, length: int,
                   idx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``get`` for rows of different capacity: ``length`` up to the largest; positions past
        a row's capacity repeat its last slot (mask them). ``idx`` is an optional precomputed
        ``int64[B*length]`` on the pool's device equal to those slots
        (``window_slot_indices(0, length)`` while every row's capacity covers ``length``);
        ValueError otherwise, before anything is read."""
        return self._slot.require().read(self._kv, as_layer(layer, self._num_layers), length,
                                         padded=True, idx=idx)

    def slot_indices(self, length: int) -> np.ndarray:
        """Host ``int64[B*length]`` physical slots of positions ``[0, length)``, row-major."""
        step = self._slot.require()
        return step.slots(0, step.read_length(length, padded=False))

    def window_slot_indices(self, start_pos: Any, seqlen: int) -> np.ndarray:
        """Host ``int64[B*seqlen]`` physical slots of positions ``[start, start + seqlen)`` per row,
        row-major (the ``slot_idx`` a model precomputes once per step for ``put``).
        KvCacheExhaustedError past a capacity."""
        step = self._slot.require()
        seqlen = as_int(seqlen, "seqlen", minimum=0)
        return step.slots(step.window(start_pos, seqlen, "window"), seqlen)

    def key_layer(self, layer: int) -> torch.Tensor:
        """View ``[num_slots, Hkv, D]`` of one layer's K (storage dtype)."""
        return self._kv.key_cache[as_layer(layer, self._num_layers)]

    def value_layer(self, layer: int) -> torch.Tensor:
        """View ``[num_slots, Hkv, D]`` of one layer's V (storage dtype)."""
        return self._kv.value_cache[as_layer(layer, self._num_layers)]

    # ------------------------------------------------------------------ FlashInfer CSR metadata
    def build_flashinfer_metadata(self, lengths: Any) -> FlashInferKvMetadata:
        """A caller-owned CSR of the active rows at ``lengths`` (an int for every row, or one per
        row; 0 gives an empty row with ``last_page_len`` 0), each at most the row's capacity
        (ValueError beyond)."""
        step = self._slot.require()
        return build_csr(step.page_table32, step.lengths(lengths, "lengths"), step.page_size,
                         step.device)

    def shared_flashinfer_metadata(self, lengths: Any) -> FlashInferKvMetadata:
        """The step-scoped CSR every layer of one forward shares (do not modify it): reused when the
        lengths are unchanged, bumped in place (same tensors, only ``last_page_len`` rewritten) when
        every row keeps its page count, rebuilt otherwise."""
        step = self._graphs.csr_step()
        return step.csr.get(step.page_table32, step.lengths(lengths, "lengths"))[0]

    def clear_step_metadata(self) -> None:
        """Forget the step CSR (the next shared_flashinfer_metadata rebuilds it)."""
        if self._slot.step is not None:
            self._graphs.csr_step().csr.clear()

    def current_step_metadata(self) -> FlashInferKvMetadata | None:
        """The step CSR, or None when there is none."""
        return self._slot.step.csr.meta if self._slot.step is not None else None

    # ------------------------------------------------------------------ seal and truncate
    # (the region table of a row after a verify window is in smile_llm/cache/step.py, above
    # ActiveStep.seal)
    def seal_length(self, sealed_len: Any) -> bool:
        """Attention sees only ``[0, sealed_len)`` of each active row from now on (an int or one per
        row); frees nothing and lowers ``kv_len`` to at most ``sealed_len`` (never below the matched
        prefix). True when the step CSR was kept or bumped in place (tensor addresses survive),
        False when it was rebuilt (drop graphs keyed to the old tensors); sealing every row at 0
        leaves no step CSR."""
        step = self._graphs.csr_step()
        return step.seal(self._kv, self._table.kv_len, step.lengths(sealed_len, "sealed_len"))

    def truncate_to(self, sealed_len: Any, written_end: Any) -> bool:
        """After a verify window wrote up to ``written_end``, seal to ``sealed_len``; with
        ``zero_rejected_kv`` zero ``[sealed_len, written_end)`` first. ValueError if
        ``written_end < sealed_len``, if it exceeds a row's capacity, or if zeroing would reach
        below a row's matched prefix. Returns what ``seal_length`` returns."""
        return self._graphs.csr_step().truncate(self._kv, self._table.kv_len, sealed_len,
                                                written_end, self.zero_rejected_kv)

    def move_kv(self, src_positions: Any, dst_positions: Any) -> None:
        """Copy K and V of positions ``src_positions[b, j]`` to ``dst_positions[b, j]`` of each
        active row b, on every layer (``int64[B, L]``; all sources are read before any write). A
        token-tree verify window compacts the KV of its accepted path into consecutive positions
        with this, then seals the rest with ``truncate_to``. ValueError unless every source is
        written and every destination lies in ``[matched, kv_len)`` of its row; nothing changes
        then."""
        self._slot.require().move(self._kv, self._table.kv_len, src_positions, dst_positions)

    def invalidate_range(self, from_pos: Any, end_pos: Any) -> None:
        """Zero K and V of positions ``[from_pos, end_pos)`` (ints or one per row) on every layer of
        the active rows, always through fresh indices (never the graph buffers); lowers ``kv_len``
        to at most ``from_pos``. ValueError for a negative or reversed range, one past a row's
        capacity, or one below its matched prefix."""
        self._slot.require().invalidate(self._kv, self._table.kv_len, from_pos, end_pos)
