"""KvCachePool: the one owner of pages and K/V buffers; binding verbs; put/get.

The pool composes a :class:`PageAllocator` (who owns each page, FIFO free list), a :class:`RadixCache` (a pure
prefix index), a :class:`BindingTable` (one record per bound request), a :class:`KvStore` (the buffers) and a
:class:`Binder` (every change of page ownership). The pool validates arguments, holds the one lock, owns the active
step and runs the K/V verbs. Every public call is transactional: it validates and plans first and raises before it
changes anything.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from .. import env
from . import audit, factories
from .binder import PREFIX_NAMESPACE, Binder
from .bindings import Binding, BindingTable
from .graph_buffers import DecodeGraphBuffers, GraphCsr, GraphStepCsr, PrefetchState, VerifyGraphBuffers
from .metadata import FlashInferKvMetadata, build_csr
from .checks import as_device, as_int
from .errors import KvCacheExhaustedError, NoActiveStepError, PoolClosedError, RequestOffloadedError
from .kv_step import KvStep
from .kv_store import FILL_MODES, FP8_DTYPES, KvStore
from .layout import ceil_page, floor_page
from .offload import OffloadedKv
from .pages import PageAllocator, PageOwner
from .radix import RadixCache
from .state_pool import StatePool
from .step import ActiveStep
from .tokens import EMPTY, as_int_array

F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: KvCachePool, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            if self._closed:
                raise PoolClosedError(f"KvCachePool.{method.__name__}: the pool is closed; create a new pool")
            return method(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _journaled(method: F) -> F:
    """A state-changing verb: once it has returned (a verb that raises changes nothing, so it is not recorded), the
    pool's journal, if any, receives ``(name, args, kwargs)`` (``KvCachePool.record_calls``). Inside ``_locked``, so
    calls are recorded in the order they took effect."""

    @functools.wraps(method)
    def wrapper(self: KvCachePool, *args: Any, **kwargs: Any) -> Any:
        self._journal_depth += 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            self._journal_depth -= 1
        if self._journal is not None and self._journal_depth == 0:  # a verb another verb called is not recorded
            self._journal(method.__name__, args, kwargs)
        return result

    return wrapper  # type: ignore[return-value]


def _state(getter: Callable[[Any], Any], setter: Callable[[Any, Any], None] | None = None,
           doc: str | None = None) -> property:
    """A pool property read (and optionally written) under the lock; PoolClosedError after close()."""

    def get(self: KvCachePool) -> Any:
        with self._lock:
            if self._closed:
                raise PoolClosedError("the pool is closed; create a new pool")
            return getter(self)

    def put(self: KvCachePool, value: Any) -> None:
        with self._lock:
            if self._closed:
                raise PoolClosedError("the pool is closed; create a new pool")
            assert setter is not None
            setter(self, value)

    return property(get, put if setter is not None else None, doc=doc)


def _counter(getter: Callable[[Any], int], doc: str | None = None) -> property:
    """A pool counter read without the lock: ``getter`` reads one int attribute, which the GIL reads atomically,
    so the value is the counter before or after any concurrent call (as if read under the lock just before or
    after it). PoolClosedError after close(). For counters callers poll often (``free_pages`` from a JVM thread
    costs a lock round trip less)."""

    def get(self: KvCachePool) -> int:
        if self._closed:
            raise PoolClosedError("the pool is closed; create a new pool")
        return getter(self)

    return property(get, None, doc=doc)


def _check_scales(dtype: torch.dtype, k_scale: Any, v_scale: Any) -> None:
    """Scales are finite floats > 0, and only FP8 storage has scales other than 1.0 (float storage is unscaled,
    so a scale there would be reported to attention but never applied)."""
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"{name} must be a finite float > 0, got {scale!r}")
        if scale != 1.0 and dtype not in FP8_DTYPES:
            raise ValueError(f"{name}={scale} on a {dtype} pool: only FP8 storage is scaled; leave scales at 1.0")


class KvCachePool:
    """Static paged K/V pool with an embedded radix prefix cache. See docs/contract.md for the contract."""

    DEFAULT_PAGE_SIZE = 16

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int, page_size: int = 16,
                 device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, *, k_scale: float = 1.0,
                 v_scale: float = 1.0, zero_rejected_kv: bool | None = None, fresh_page_fill: str = "none") -> None:
        for name, value in (("num_layers", num_layers), ("num_slots", num_slots), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim), ("page_size", page_size)):
            as_int(value, name, minimum=1)
        if num_slots % page_size:
            raise ValueError(f"num_slots {num_slots} must be a multiple of page_size {page_size}; "
                             f"use {floor_page(num_slots, page_size) or page_size}")
        if fresh_page_fill not in FILL_MODES:
            raise ValueError(f"fresh_page_fill must be one of {FILL_MODES}, got {fresh_page_fill!r}")
        _check_scales(dtype, k_scale, v_scale)
        self._num_layers, self._num_slots = int(num_layers), int(num_slots)
        self._num_kv_heads, self._head_dim, self._page_size = int(num_kv_heads), int(head_dim), int(page_size)
        self._device = as_device(device)
        self._zero_rejected_kv = env.zero_rejected_kv() if zero_rejected_kv is None else bool(zero_rejected_kv)
        self._kv = KvStore(self._num_layers, self._num_slots, self._num_kv_heads, self._head_dim, self._page_size,
                           self._device, dtype, k_scale, v_scale)
        self._pages = PageAllocator(self._num_slots // self._page_size)
        self._radix = RadixCache(self._page_size)
        self._table = BindingTable()
        self._step: ActiveStep | None = None
        self._lock = threading.RLock()
        self._closed = False
        self._states: list[StatePool] = []  # per-request state beside the KV (attach_state), bound with each request
        self._journal: Callable[[str, tuple[Any, ...], dict[str, Any]], None] | None = None  # record_calls
        self._journal_depth = 0  # journaled verbs running (a nested one is part of its caller's record)
        self._binder = Binder(self._pages, self._radix, self._table, self._kv, fresh_page_fill, self._states)
        self._decode = DecodeGraphBuffers(self._device)
        self._verify = VerifyGraphBuffers(self._page_size, self._device)
        self._graph_csr = GraphCsr(self._page_size, self._num_slots // self._page_size, self._device)
        self._prefetch = PrefetchState()

    # ------------------------------------------------------------------ factories (docs/contract.md, sizing)
    allocate = classmethod(factories.allocate)
    for_testing = classmethod(factories.for_testing)
    for_mtp = classmethod(factories.for_mtp)
    for_mtp_history = classmethod(factories.for_mtp_history)

    # ------------------------------------------------------------------ properties (all raise after close())
    num_layers = _state(lambda self: self._num_layers)
    num_slots = _state(lambda self: self._num_slots)
    num_kv_heads = _state(lambda self: self._num_kv_heads)
    head_dim = _state(lambda self: self._head_dim)
    page_size = _state(lambda self: self._page_size)
    device = _state(lambda self: self._device)
    dtype = _state(lambda self: self._kv.dtype, doc="Storage dtype of K and V.")
    compute_dtype = _state(lambda self: self._kv.compute_dtype, doc="The dtype get() returns.")
    k_scale = _state(lambda self: self._kv.k_scale, doc="FP8 K scale (1.0 for float storage); pass to attention.")
    v_scale = _state(lambda self: self._kv.v_scale, doc="FP8 V scale (1.0 for float storage); pass to attention.")
    kv_is_compute_dtype = _state(lambda self: self._kv.dtype == self._kv.compute_dtype)
    fresh_page_fill = _state(lambda self: self._binder.fresh_page_fill, doc='"none", "zero" or "poison"')
    radix = _state(lambda self: self._radix,
                   doc="The embedded tree, for inspection only: mutate it through the pool (evicting it directly "
                       "would leak pages).")
    key_cache = _state(lambda self: self._kv.key_cache, doc="K buffer [num_layers, num_slots, Hkv, D].")
    value_cache = _state(lambda self: self._kv.value_cache, doc="V buffer [num_layers, num_slots, Hkv, D].")
    free_pages = _counter(lambda self: self._pages.free_pages, doc="Pages on the free list.")
    free_slots = _counter(lambda self: self._pages.free_pages * self._page_size, doc="``free_pages * page_size``.")
    request_capacity = _state(lambda self: self._step.min_capacity if self._step is not None else 0,
                              doc="Smallest capacity among the active rows (0 when no step is active).")
    bound_request_count = _state(lambda self: len(self._table), doc="Bound requests, offloaded ones included.")
    active_request_ids = _state(lambda self: self._step.ids if self._step is not None else (),
                                doc="Ids of the active step's rows, in order (empty without one).")
    prefix_reuse_enabled = _state(lambda self: self._binder.prefix_reuse,
                                  lambda self, on: self.set_prefix_reuse(on),
                                  doc="Match prompts against the tree on bind and insert on finish.")
    zero_rejected_kv = _state(lambda self: self._zero_rejected_kv,
                              lambda self, on: self.set_zero_rejected_kv(on),
                              doc="truncate_to zeroes the rejected tail of a verify window.")
    prefix_prompt_tokens = _state(lambda self: self._binder.prompt_tokens,
                                  doc="Prompt tokens of every bind made with reuse on (cumulative).")
    prefix_match_tokens = _state(lambda self: self._binder.match_tokens,
                                 doc="Matched (capped) prefix tokens of those binds (cumulative).")
    prefix_insert_tokens = _state(lambda self: self._binder.insert_tokens,
                                  doc="Tokens newly inserted into the tree by finishes (cumulative).")
    prefix_evict_tokens = _state(lambda self: self._binder.evict_tokens,
                                 doc="Tokens the pool evicted from the tree (cumulative).")

    @property
    def closed(self) -> bool:
        """True after ``close()`` (every other call then raises RuntimeError)."""
        return self._closed

    # ------------------------------------------------------------------ helpers
    def _capacity_pages(self, total_capacity: Any) -> int:
        return ceil_page(as_int(total_capacity, "total_capacity", minimum=1), self._page_size) // self._page_size

    def _release(self, b: Binding, sequence: np.ndarray | None = None) -> None:
        """Unbind ``b`` (finishing it into the tree when ``sequence`` is given) and drop it from the step."""
        self._binder.release(b, sequence)
        for states in self._states:
            states.release(b.request_id)
        if self._step is not None and b.request_id in self._step.ids:
            self._clear_step()

    def _bind(self, prompt: np.ndarray, pages: int, matched: int, exclusive: bool) -> Binding:
        """Bind KV pages and a slot of every attached state pool (the callers checked ``_states_fit`` first); on a
        prefix hit the slot starts from the matched node's snapshot (the plan only matches nodes that have one)."""
        b = self._binder.bind(prompt, pages, matched, exclusive=exclusive)
        for states in self._states:
            states.bind(b.request_id)
            if matched:
                assert b.locked_node is not None
                states.restore_snapshot(b.request_id, b.locked_node)
        return b

    def _states_fit(self, count: int, releasing: list[Binding], verb: str) -> None:
        """KvCacheExhaustedError unless every attached state pool has ``count`` free slots once ``releasing`` is."""
        ids = [b.request_id for b in releasing]
        for states in self._states:
            if not states.can_bind(count, ids):
                raise KvCacheExhaustedError(
                    f"{verb} needs {count} state slot(s) but only {states.free_slots} of {states.max_requests} are "
                    f"free ({states!r}); keep the request queued until others finish")

    def _exhausted_detail(self) -> str:
        return (f"{self._pages.free_pages} free and {self._radix.evictable_size // self._page_size} evictable pages")

    def _clear_step(self) -> None:
        """Drop the active step with its step CSR; prepared graph indices no longer apply to any batch."""
        self._step = None
        self._decode.forget()
        self._verify.forget()

    def _activate(self, bindings: list[Binding]) -> None:
        if self._step is not None and self._step.ids == tuple(b.request_id for b in bindings):
            return
        self._clear_step()
        self._step = ActiveStep(bindings, self._page_size, self._device)

    def _lookup(self, request_id: Any) -> Binding | None:
        if isinstance(request_id, bool) or not isinstance(request_id, (int, np.integer)):
            return None
        return self._table.get(int(request_id))

    def _csr_step(self) -> ActiveStep:
        """The active step, for a verb that changes its CSR: RuntimeError while a prefetch capture holds it."""
        if self._prefetch.active:
            raise RuntimeError("a decode prefetch capture holds the step CSR; end_prefetch_decode_graph_step first")
        return self._require_step()

    def _require_step(self) -> ActiveStep:
        if self._step is None:
            raise NoActiveStepError("No request bound; call bind_request/activate_step or bind_with_prefix first")
        return self._step

    def _binding(self, request_id: Any) -> Binding:
        b = self._lookup(request_id)
        if b is None:
            raise ValueError(f"Unknown request id: {request_id!r}; bound ids are {[x.request_id for x in self._table]} "
                             f"(bind it first, or it was finished, unbound or released by an exclusive bind)")
        return b

    # ------------------------------------------------------------------ binding verbs (docs/contract.md)
    @_locked
    @_journaled
    def bind_request(self, prompt_tokens: Any, total_capacity: int, *, reuse_prefix: bool = True) -> int:
        """Bind one request for continuous batching; returns its id (positive, never reused).

        Releases bindings made by the exclusive verbs first, matches the prompt (capped below its last token; no
        match with ``reuse_prefix=False``, for a request that must compute its whole prompt),
        locks the match and takes private pages for the page-aligned capacity, evicting unlocked tree pages only as
        far as needed. Raises ValueError if the prompt is longer than ``total_capacity`` and KvCacheExhaustedError
        if the full capacity cannot be had; either way nothing changes. The only binding becomes the active step."""
        prompt = as_int_array(prompt_tokens, "prompt_tokens")
        want = self._capacity_pages(total_capacity)
        if len(prompt) > total_capacity:
            raise ValueError(f"prompt of {len(prompt)} tokens is longer than total_capacity {total_capacity}")
        release = [b for b in self._table if b.exclusive]
        matched, available = self._binder.plan(prompt, release, reuse_prefix)
        need = want - matched // self._page_size
        if need > available:
            raise KvCacheExhaustedError(
                f"bind_request needs {need} pages ({want * self._page_size} slots, {matched} matched) but only "
                f"{available} are free or evictable; keep the request queued until others finish")
        self._states_fit(1, release, "bind_request")
        for old in release:
            self._release(old)
        b = self._bind(prompt, want, matched, exclusive=False)
        if len(self._table) == 1:
            self._activate([b])
        return b.request_id

    @_locked
    @_journaled
    def bind_with_prefix(self, prompt_tokens: Any, total_capacity: int) -> int:
        """Exclusive batch-1 binding (``generate()``): releases every other binding, clamps the capacity to the
        free plus evictable pages (read ``request_capacity``), binds, activates; returns the matched prefix length.
        Raises ValueError, releasing nothing, if even the prompt does not fit."""
        prompt = as_int_array(prompt_tokens, "prompt_tokens")
        want = self._capacity_pages(total_capacity)
        if len(prompt) > total_capacity:
            raise ValueError(f"prompt of {len(prompt)} tokens is longer than total_capacity {total_capacity}")
        release = list(self._table)
        matched, available = self._binder.plan(prompt, release)
        pages = matched // self._page_size + min(want - matched // self._page_size, available)
        if pages * self._page_size < max(1, len(prompt)):
            raise ValueError(
                f"Prompt length {len(prompt)} exceeds free KV capacity {pages * self._page_size} "
                f"(prefix={matched}, pool={self._num_slots} slots); shorten the prompt or use a larger pool")
        self._states_fit(1, release, "bind_with_prefix")
        for old in release:
            self._release(old)
        b = self._bind(prompt, pages, matched, exclusive=True)
        self._activate([b])
        return matched

    @_locked
    @_journaled
    def bind_requests(self, batch_size: int, capacity: int) -> list[int]:
        """Exclusive batch of ``batch_size`` rows without prefix reuse, each clamped to the same page-aligned
        capacity that fits; activates them. Raises KvCacheExhaustedError, releasing nothing, if a row cannot get
        one page."""
        batch = as_int(batch_size, "batch_size", minimum=1)
        want = self._capacity_pages(capacity)
        release = list(self._table)
        _, available = self._binder.plan(EMPTY, release)
        per_row = min(want, available // batch)
        if per_row < 1:
            raise KvCacheExhaustedError(
                f"KV cache exhausted: need at least {self._page_size} slots per request for batch {batch}, "
                f"have {available * self._page_size} free or evictable; use a smaller batch")
        self._states_fit(batch, release, "bind_requests")
        for b in release:
            self._release(b)
        rows = [self._bind(EMPTY, per_row, 0, exclusive=True) for _ in range(batch)]
        self._activate(rows)
        return [b.request_id for b in rows]

    @_locked
    @_journaled
    def finish_request(self, request_id: int, sequence_tokens: Any) -> None:
        """Insert the request's written, page-aligned prefix ``sequence_tokens[:floor_page(min(len, kv_len))]``
        into the tree, free duplicates and unused headroom, unlock, unbind. ``sequence_tokens=None`` (or reuse off,
        or an offloaded request) unbinds without inserting. Unknown ids do nothing. Raises ValueError unless the
        sequence starts with the request's matched prefix tokens."""
        b = self._lookup(request_id)
        if b is None:
            return
        if sequence_tokens is None:
            self._release(b)
            return
        seq = as_int_array(sequence_tokens, "sequence_tokens")
        if len(seq) < b.matched_len or not np.array_equal(seq[: b.matched_len], b.prefix_tokens):
            raise ValueError(
                f"finish_request({b.request_id}): sequence_tokens must start with the {b.matched_len} matched "
                f"prefix tokens of the request; pass the prompt followed by the generated tokens")
        self._release(b, seq)

    @_locked
    @_journaled
    def cache_prefix(self, request_id: int, sequence_tokens: Any) -> int:
        """Insert the request's written, page-aligned prefix ``sequence_tokens[:floor_page(min(len, kv_len))]``
        into the tree now, keeping the request bound (SGLang's ``cache_unfinished_req``): a request bound next can
        match it before this one finishes (a batch sharing a system prompt computes it once). The request's matched
        prefix grows to the inserted length and stays locked; pages the tree already held are swapped in and the
        duplicates freed. Returns the tokens newly inserted (0 with reuse off, for an offloaded request, or when
        nothing new is written). ValueError for an unknown id, or unless ``sequence_tokens`` starts with the matched
        prefix tokens; nothing changes then. The active step is rebuilt at the next ``activate_step``."""
        b = self._binding(request_id)
        seq = as_int_array(sequence_tokens, "sequence_tokens")
        if len(seq) < b.matched_len or not np.array_equal(seq[: b.matched_len], b.prefix_tokens):
            raise ValueError(
                f"cache_prefix({b.request_id}): sequence_tokens must start with the {b.matched_len} matched prefix "
                f"tokens of the request; pass the prompt (and any generated tokens)")
        before = b.matched_len
        added = self._binder.cache_prefix(b, seq)
        if b.matched_len != before and self._step is not None and b.request_id in self._step.ids:
            self._clear_step()  # the step holds a copy of the page table
        return added

    @_locked
    @_journaled
    def finish_exclusive(self, sequence_tokens: Any) -> None:
        """Java ``finishRequest(int[])``: with one binding, ``finish_request`` on it; with none, nothing; with
        several, release all without inserting."""
        bindings = list(self._table)
        if len(bindings) == 1:
            self.finish_request(bindings[0].request_id, sequence_tokens)
        else:
            for b in bindings:
                self._release(b)

    @_locked
    @_journaled
    def unbind_request(self, request_id: int) -> None:
        """Instant eviction: free the request's private pages, unlock its prefix, insert nothing. Unknown ids do
        nothing."""
        b = self._lookup(request_id)
        if b is not None:
            self._release(b)

    @_locked
    @_journaled
    def unbind_requests(self) -> None:
        """Release every binding without inserting."""
        for b in self._table:
            self._release(b)

    @_locked
    def is_bound(self, request_id: int) -> bool:
        """True for a bound request (offloaded ones included); False for anything else."""
        return self._lookup(request_id) is not None

    @_locked
    def matched_prefix_len(self, request_id: int) -> int:
        """Tokens of ``request_id``'s prompt served from the prefix tree at bind time (a multiple of ``page_size``,
        never covering the last prompt token); 0 for an unknown id."""
        b = self._lookup(request_id)
        return b.matched_len if b is not None else 0

    @_locked
    def kv_len(self, request_id: int) -> int:
        """End of the request's contiguous written KV. ValueError for an unknown id."""
        return self._table.kv_len_of(self._binding(request_id))

    @_locked
    @_journaled
    def activate_step(self, *request_ids: int) -> None:
        """Select the batch (in order) that put/get/metadata/seal act on. The same cohort keeps the step's cached
        state. Raises ValueError on no, unknown or duplicate ids and RequestOffloadedError on an offloaded one,
        changing nothing."""
        if len(request_ids) == 1 and isinstance(request_ids[0], (list, tuple, np.ndarray)):
            request_ids = tuple(request_ids[0])
        if not request_ids:
            raise ValueError("activate_step needs at least one request id")
        bindings = [self._binding(i) for i in request_ids]
        if len({b.request_id for b in bindings}) != len(bindings):
            raise ValueError(f"activate_step got duplicate ids: {list(request_ids)}; list each request once")
        for b in bindings:
            if b.offload is not None:
                raise RequestOffloadedError(
                    f"request {b.request_id} is offloaded to host memory; restore_request it before activating")
        self._activate(bindings)

    @_locked
    def ensure_request(self, batch_size: int, end_pos: int) -> None:
        """Raise KvCacheExhaustedError unless the active step has ``batch_size`` rows, each with capacity
        ``>= end_pos``."""
        batch_size = as_int(batch_size, "batch_size", minimum=1)
        end_pos = as_int(end_pos, "end_pos", minimum=0)
        if self._step is None:
            raise KvCacheExhaustedError("No request bound; call bind_request/activate_step or bind_with_prefix first")
        if self._step.batch != batch_size:
            raise KvCacheExhaustedError(
                f"active step has {self._step.batch} rows, not {batch_size}; activate the batch first")
        if end_pos > self._step.min_capacity:
            raise KvCacheExhaustedError(
                f"need end_pos={end_pos}, bound capacity={self._step.min_capacity} (pool does not grow)")

    # ------------------------------------------------------------------ writing and reading KV (docs/contract.md)
    def _check_layer(self, layer: Any) -> int:
        if type(layer) is int and 0 <= layer < self._num_layers:
            return layer
        return as_int(layer, "layer", minimum=0, maximum=self._num_layers - 1)

    @_locked
    def put(self, layer: int, start_pos: Any, k: torch.Tensor, v: torch.Tensor,
            slot_idx: torch.Tensor | None = None) -> None:
        """Write positions ``[start, start + S)`` of every active row from ``k``/``v`` ``[B, S, Hkv, D]``
        (cast to the pool dtype; FP8 stores ``x / scale``); ``start_pos`` is an int or one per row. A put at
        ``start <= kv_len`` raises ``kv_len`` to ``start + S``. Raises KvCacheExhaustedError past a row's capacity and
        ValueError below its matched prefix, for a wrong shape, dtype family or device, or for ``k``/``v`` sharing
        memory with the pool's buffers; nothing is written then. ``slot_idx`` is an optional precomputed
        ``int64[B*S]`` equal to ``window_slot_indices(start_pos, S)`` (ValueError otherwise).

        With ``decode_graph_buffers`` on and S == 1, or with ``verify_graph_buffers`` on, the write goes through the
        prepared fixed index buffer: RuntimeError if none is prepared for this step and shape, ValueError if
        ``start_pos`` differs from the prepared positions. A put is ``kv_step`` + one layer's write + commit."""
        step = self._require_step()
        layer = self._check_layer(layer)
        seqlen = step.check_kv(self._kv, k, v)
        index = slot_idx
        if self._decode.enabled and seqlen == 1:
            index = self._decode.index_for(step, step.start_of(start_pos))
        elif self._verify.enabled:
            index = self._verify.index_for(step, step.start_of(start_pos), seqlen)
        kv = self._open_kv_step(step, start_pos, seqlen, index, "put", "slot_idx")
        kv.write(layer, k, v)
        self._record(kv)

    @_locked
    def kv_step(self, start_pos: Any, seqlen: int, index: torch.Tensor | None = None) -> KvStep:
        """The KV write handle of one forward over the active rows: positions ``[start, start + seqlen)`` of each
        row (``start_pos`` an int or one per row), validated once here. Every layer writes through
        ``KvStep.write`` (no lock, no checks) and the forward calls ``KvStep.commit`` once it has succeeded, which
        records the write in ``kv_len`` as ``put`` does; a forward that raises never commits.

        ``index``: None (the pool computes the window's slot index), the fixed buffer of ``decode_graph_index`` /
        ``verify_graph_index`` prepared for exactly these positions (CUDA-graph runners; a decode prefetch's scratch
        index records nothing at commit), or a caller's ``int64[B*seqlen]`` equal to
        ``window_slot_indices(start_pos, seqlen)``. Raises NoActiveStepError without a step,
        KvCacheExhaustedError past a row's capacity, ValueError below a matched prefix or for a bad ``index``,
        RuntimeError for a graph buffer not prepared for this step; nothing changes then."""
        step = self._require_step()
        seqlen = as_int(seqlen, "seqlen")
        return self._open_kv_step(step, start_pos, seqlen, index, "kv_step", "index")

    def _open_kv_step(self, step: ActiveStep, start_pos: Any, seqlen: int, index: torch.Tensor | None, what: str,
                      name: str) -> KvStep:
        """A validated KvStep of the window; ``index`` as ``kv_step`` takes it (``name`` names it in errors)."""
        window = step.write_window(start_pos, seqlen, what)
        records = True
        if index is None:
            idx = step.index(window, seqlen)
        elif seqlen == 1 and index is self._decode.index:
            idx = self._decode.index_for(step, step.start_of(window))
            records = not self._decode.scratch  # a prefetch capture's writes go to scratch: not the rows' KV
        elif index is self._verify.index:
            idx = self._verify.index_for(step, step.start_of(window), seqlen)
        else:
            idx = step.check_index(index, window, seqlen, name)
        return KvStep(self._kv, step, window, seqlen, idx, records, self._commit_kv_step)

    def _record(self, kv: KvStep) -> None:
        if kv.records:
            kv.active.advance_kv_len(self._table.kv_len, kv.window, kv.seqlen)

    def _commit_kv_step(self, kv: KvStep) -> None:
        with self._lock:
            if self._closed:
                raise PoolClosedError("KvStep.commit: the pool is closed; create a new pool")
            if self._step is not kv.active:
                raise RuntimeError("KvStep.commit: the active step changed since kv_step (a request was activated, "
                                   "unbound or offloaded during the forward); nothing was recorded")
            self._record(kv)

    @_locked
    def get(self, layer: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions ``[0, length)`` of every active row, ``[B, length, Hkv, D]`` in ``compute_dtype``.
        ``length`` is at most the smallest active capacity (ValueError beyond); positions past ``kv_len`` return
        whatever is stored."""
        return self._require_step().read(self._kv, self._check_layer(layer), length)

    @_locked
    def get_padded(self, layer: int, length: int, idx: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Like ``get`` for rows of different capacity: ``length`` up to the largest; positions past a row's
        capacity repeat its last slot (mask them). ``idx`` is an optional precomputed ``int64[B*length]`` on the
        pool's device equal to those slots (``window_slot_indices(0, length)`` while every row's capacity covers
        ``length``); ValueError otherwise, before anything is read."""
        return self._require_step().read(self._kv, self._check_layer(layer), length, padded=True, idx=idx)

    @_locked
    def slot_indices(self, length: int) -> np.ndarray:
        """Host ``int64[B*length]`` physical slots of positions ``[0, length)``, row-major."""
        step = self._require_step()
        return step.slots(0, step.read_length(length, padded=False))

    @_locked
    def window_slot_indices(self, start_pos: Any, seqlen: int) -> np.ndarray:
        """Host ``int64[B*seqlen]`` physical slots of positions ``[start, start + seqlen)`` per row, row-major
        (the ``slot_idx`` a model precomputes once per step for ``put``). KvCacheExhaustedError past a capacity."""
        step = self._require_step()
        seqlen = as_int(seqlen, "seqlen", minimum=0)
        return step.slots(step.window(start_pos, seqlen, "window"), seqlen)

    @_locked
    def key_layer(self, layer: int) -> torch.Tensor:
        """View ``[num_slots, Hkv, D]`` of one layer's K (storage dtype)."""
        return self._kv.key_cache[self._check_layer(layer)]

    @_locked
    def value_layer(self, layer: int) -> torch.Tensor:
        """View ``[num_slots, Hkv, D]`` of one layer's V (storage dtype)."""
        return self._kv.value_cache[self._check_layer(layer)]

    @_locked
    @_journaled
    def set_kv_scales(self, k_scale: float, v_scale: float) -> None:
        """Set the fixed FP8 scales. Only while nothing is stored (no bindings, empty tree, no caller pages):
        RuntimeError otherwise, since stored values would be reinterpreted. ValueError for scales other than 1.0
        on float storage."""
        _check_scales(self._kv.dtype, k_scale, v_scale)
        if len(self._table) or self._radix.total_size() or self._pages.count(PageOwner.CALLER):
            raise RuntimeError("set_kv_scales while KV is stored would rescale it; call it before binding, "
                               "after unbind_requests() and with an empty prefix tree")
        self._kv.k_scale, self._kv.v_scale = float(k_scale), float(v_scale)

    # ------------------------------------------------------------------ FlashInfer CSR metadata (docs/contract.md)
    @_locked
    def build_flashinfer_metadata(self, lengths: Any) -> FlashInferKvMetadata:
        """A caller-owned CSR of the active rows at ``lengths`` (an int for every row, or one per row; 0 gives an
        empty row with ``last_page_len`` 0), each at most the row's capacity (ValueError beyond)."""
        step = self._require_step()
        return build_csr(step.page_table32, step.lengths(lengths, "lengths"), self._page_size, self._device)

    @_locked
    def shared_flashinfer_metadata(self, lengths: Any) -> FlashInferKvMetadata:
        """The step-scoped CSR every layer of one forward shares (do not modify it): reused when the lengths are
        unchanged, bumped in place (same tensors, only ``last_page_len`` rewritten) when every row keeps its page
        count, rebuilt otherwise."""
        step = self._csr_step()
        return step.csr.get(step.page_table32, step.lengths(lengths, "lengths"))[0]

    @_locked
    @_journaled
    def clear_step_metadata(self) -> None:
        """Forget the step CSR (the next shared_flashinfer_metadata rebuilds it)."""
        if self._step is not None:
            self._csr_step().csr.clear()

    @_locked
    def current_step_metadata(self) -> FlashInferKvMetadata | None:
        """The step CSR, or None when there is none."""
        return self._step.csr.meta if self._step is not None else None

    # ------------------------------------------------------------------ seal and truncate (docs/contract.md)
    # (the region table of a row after a verify window is in smile_llm/cache/step.py, above ActiveStep.seal)
    @_locked
    @_journaled
    def seal_length(self, sealed_len: Any) -> bool:
        """Attention sees only ``[0, sealed_len)`` of each active row from now on (an int or one per row); frees
        nothing and lowers ``kv_len`` to at most ``sealed_len`` (never below the matched prefix). True when the step
        CSR was kept or bumped in place (tensor addresses survive), False when it was rebuilt (drop graphs keyed to
        the old tensors); sealing every row at 0 leaves no step CSR."""
        step = self._csr_step()
        return step.seal(self._table.kv_len, step.lengths(sealed_len, "sealed_len"))

    @_locked
    @_journaled
    def truncate_to(self, sealed_len: Any, written_end: Any) -> bool:
        """After a verify window wrote up to ``written_end``, seal to ``sealed_len``; with ``zero_rejected_kv``
        zero ``[sealed_len, written_end)`` first. ValueError if ``written_end < sealed_len``, if it exceeds a row's
        capacity, or if zeroing would reach below a row's matched prefix. Returns what ``seal_length`` returns."""
        return self._csr_step().truncate(self._kv, self._table.kv_len, sealed_len, written_end,
                                             self._zero_rejected_kv)

    @_locked
    @_journaled
    def move_kv(self, src_positions: Any, dst_positions: Any) -> None:
        """Copy K and V of positions ``src_positions[b, j]`` to ``dst_positions[b, j]`` of each active row b, on every
        layer (``int64[B, L]``; all sources are read before any write). A token-tree verify window compacts the KV of
        its accepted path into consecutive positions with this, then seals the rest with ``truncate_to``.
        ValueError unless every source is written and every destination lies in ``[matched, kv_len)`` of its row;
        nothing changes then."""
        self._require_step().move(self._kv, self._table.kv_len, src_positions, dst_positions)

    @_locked
    @_journaled
    def invalidate_range(self, from_pos: Any, end_pos: Any) -> None:
        """Zero K and V of positions ``[from_pos, end_pos)`` (ints or one per row) on every layer of the active
        rows, always through fresh indices (never the graph buffers); lowers ``kv_len`` to at most ``from_pos``.
        ValueError for a negative or reversed range, one past a row's capacity, or one below its matched prefix."""
        self._require_step().invalidate(self._kv, self._table.kv_len, from_pos, end_pos)

    # ------------------------------------------------------------------ CUDA-graph fixed buffers (docs/contract.md)
    @_locked
    def num_pages_for_length(self, length: int) -> int:
        """Pages a row of ``length`` tokens spans: ``ceil(length / page_size)``.

        >>> pool = KvCachePool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=4, page_size=16)
        >>> [pool.num_pages_for_length(n) for n in (1, 16, 17, 481, 495, 496, 497)]
        [1, 1, 2, 31, 31, 31, 32]
        """
        return -(-as_int(length, "length") // self._page_size)

    @_locked
    def steps_until_page_boundary(self, cache_len: int) -> int:
        """Decode steps until ``cache_len`` fills its last page (0 when it just did). Smile's numbers at page 16:

        >>> pool = KvCachePool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=4, page_size=16)
        >>> [pool.steps_until_page_boundary(n) for n in (481, 495, 496, 497)]
        [15, 1, 0, 15]
        """
        rem = as_int(cache_len, "cache_len") % self._page_size
        return 0 if rem == 0 else self._page_size - rem

    @_locked
    def first_cache_len_in_next_page_bucket(self, num_pages: int) -> int:
        """The first length that needs ``num_pages + 1`` pages.

        >>> KvCachePool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=4).first_cache_len_in_next_page_bucket(31)
        497
        """
        return as_int(num_pages, "num_pages") * self._page_size + 1

    decode_graph_buffers = _state(lambda self: self._decode.enabled,
                                  lambda self, on: setattr(self._decode, "enabled", bool(on)),
                                  doc="put with S == 1 writes through the prepared decode index buffer (a put-level "
                                      "switch; a forward passes decode_graph_index to kv_step instead).")
    verify_graph_buffers = _state(lambda self: self._verify.enabled,
                                  lambda self, on: setattr(self._verify, "enabled", bool(on)),
                                  doc="put writes through the prepared verify index buffer (a put-level switch; a "
                                      "forward passes verify_graph_index to kv_step instead).")
    verify_window_kernel = _state(lambda self: self._verify.window_kernel,
                                  lambda self, on: setattr(self._verify, "window_kernel", bool(on)),
                                  doc="Set only during an MTP verify forward: small windows may take the paged "
                                      "verify kernel eagerly.")

    @_locked
    def prepare_decode_graph_step(self, cache_len: Any, positions: Any) -> GraphStepCsr:
        """Prepare a decode step writing position ``positions[b]`` of each row (``cache_len == position + 1``, an int
        or one per row): the graph CSR of ``B`` rows rewritten in place for ``cache_len`` (its tensors stay the same
        across page boundaries; see ``reserve_graph_rows``) and the fixed ``[B]`` write index. Counts as a write of
        those positions (a replayed graph never calls put). The eager step CSR is left alone. Returns the graph
        CSR; nothing here synchronises with the device."""
        return self._decode.prepare(self._csr_step(), self._table.kv_len, self._graph_csr, cache_len, positions)

    @_locked
    def reserve_graph_rows(self, rows: int) -> None:
        """Size the graph CSR every decode and verify graph reads for up to ``rows`` rows of the pool's full page
        count (``4 * rows * (num_pages + 2)`` bytes), so no later graph step of at most ``rows`` rows moves it. Growing
        it moves it: ``consume_verify_graph_meta_realloc`` reports that, and graphs on the old tensors must be
        dropped (their backends' ``is_bound_to`` turns False)."""
        self._graph_csr.reserve(as_int(rows, "rows", minimum=1))

    @_locked
    def decode_graph_metadata(self, batch: int) -> GraphStepCsr:
        """The graph CSR a decode (or verify) graph of ``batch`` rows reads: the same tensors for the buffers' life,
        whatever the rows' lengths. RuntimeError if fewer than ``batch`` rows are reserved."""
        batch = as_int(batch, "batch", minimum=1)
        if batch > self._graph_csr.rows:
            raise RuntimeError(f"no graph CSR for batch {batch} ({self._graph_csr.rows} rows reserved); "
                               f"prepare_decode_graph_step or reserve_graph_rows first")
        return self._graph_csr.view(batch)

    @_locked
    def decode_graph_index(self, batch: int) -> torch.Tensor:
        """The fixed ``int64[batch]`` write index of the prepared decode step (or of a prefetch capture), for
        ``kv_step(positions, 1, index=...)``: one tensor per batch size for the pool's life, rewritten in place by
        every prepare. RuntimeError unless a decode step of ``batch`` rows is prepared for the active step."""
        d, step = self._decode, self._step
        if d.index is None or step is None or d.prepared_for is not step or step.batch != batch:
            raise RuntimeError(f"no decode write index prepared for batch {batch}; call prepare_decode_graph_step "
                               f"(or begin_prefetch_decode_graph_step) first")
        return d.index

    @_locked
    def begin_prefetch_decode_graph_step(self, cache_len: int, cache_pos: int, batch: int) -> FlashInferKvMetadata:
        """Start capturing a decode graph for a later page bucket: the live step CSR is set aside, a CSR for
        ``cache_len`` is built from the live page table and installed, and every row's write index points at
        scratch slots the pool owns until ``close()``, so the capture never writes a live request's KV (and a put
        meanwhile does not count as a write). Slots past a row's ``kv_len`` up to ``cache_len`` hold no live KV and are
        zeroed, so the capture never reads NaN. Verbs that change the step CSR raise RuntimeError until
        ``end_prefetch_decode_graph_step``. KvCacheExhaustedError if the scratch pages cannot be had."""
        return self._prefetch.begin(self._require_step(), self._decode, self._binder, self._table.kv_len, cache_len,
                                    cache_pos, batch)

    @_locked
    def end_prefetch_decode_graph_step(self) -> FlashInferKvMetadata:
        """Restore the live step CSR and return the prefetch one (for ``install_prefetched_step_metadata``).
        The decode write index must be prepared again before the next decode put."""
        return self._prefetch.end(self._step, self._decode)

    @_locked
    def install_prefetched_step_metadata(self, meta: FlashInferKvMetadata, uniform_len: int) -> None:
        """Make ``meta`` (a prefetched CSR) the step CSR for length ``uniform_len``; ValueError if its batch differs
        from the active step's or the length is out of range."""
        step = self._csr_step()
        if not isinstance(meta, FlashInferKvMetadata) or meta.batch_size != step.batch:
            raise ValueError(f"install_prefetched_step_metadata needs a FlashInferKvMetadata of batch {step.batch}, "
                             f"got {getattr(meta, 'batch_size', type(meta).__name__)}")
        lengths = step.lengths(as_int(uniform_len, "uniform_len", minimum=1), "uniform_len")
        step.check_describes(meta, lengths, self._pages.num_pages)
        step.csr.install(meta, lengths)

    @_locked
    def prepare_verify_graph_step(self, cache_lens: Any, start_positions: Any,
                                  window_len: int) -> FlashInferKvMetadata:
        """Prepare a verify window of ``window_len`` tokens per row (``cache_lens[b] == start_positions[b] +
        window_len``; an int means uniform): the graph CSR of ``B`` rows rewritten in place (the one decode graphs
        read; it moves only when more rows are reserved: see ``consume_verify_graph_meta_realloc``) and the fixed
        ``[B*W]`` write index. Counts as a write of the windows. Returns the graph CSR; nothing here synchronises
        with the device."""
        return self._verify.prepare(self._require_step(), self._table.kv_len, self._graph_csr, cache_lens,
                                    start_positions, window_len)

    @_locked
    def prepare_verify_step(self, cache_lens: Any, start_positions: Any, window_len: int) -> FlashInferKvMetadata:
        """Eager ragged verify: the step CSR for ``cache_lens`` (reuse / bump / rebuild) and the ``[B*W]`` write
        index for ``put`` with ``verify_graph_buffers``. Returns the step CSR."""
        return self._verify.prepare(self._csr_step(), self._table.kv_len, None, cache_lens, start_positions,
                                    window_len)

    @_locked
    def verify_graph_index(self, batch: int, window_len: int) -> torch.Tensor:
        """The fixed ``int64[batch * window_len]`` write index of the prepared verify windows, for
        ``kv_step(starts, window_len, index=...)``: one tensor per (batch, window) for the pool's life. RuntimeError
        unless ``prepare_verify_graph_step``/``prepare_verify_step`` prepared that shape for the active step."""
        vb, step = self._verify, self._step
        if vb.index is None or step is None or vb.prepared_for is not step or step.batch != batch \
                or vb.window != window_len:
            raise RuntimeError(f"no verify write index prepared for batch {batch}, window {window_len}; call "
                               f"prepare_verify_graph_step first")
        return vb.index

    @_locked
    def verify_graph_metadata(self) -> GraphStepCsr:
        """The graph CSR of the last ``prepare_verify_graph_step``; RuntimeError if never prepared."""
        if self._verify.meta is None:
            raise RuntimeError("verify graph metadata not prepared; call prepare_verify_graph_step first")
        return self._verify.meta

    @_locked
    def consume_verify_graph_meta_realloc(self) -> bool:
        """True once after the graph CSR (decode and verify graphs alike) moved to new tensors: its first allocation
        and every growth of ``reserve_graph_rows``. Drop graphs captured on the old ones."""
        moved, self._graph_csr.moved = self._graph_csr.moved, False
        return moved

    @_locked
    def verify_qo_indptr(self, batch: int, window_len: int) -> torch.Tensor:
        """int32 ``[0, W, 2W, .., B*W]`` on the pool's device: one fixed tensor per shape for the pool's life."""
        return self._verify.qo_indptr(as_int(batch, "batch", minimum=1), as_int(window_len, "window_len", minimum=1))

    # ------------------------------------------------------------------ caller-owned pages
    @_locked
    @_journaled
    def alloc(self, num_tokens: int) -> np.ndarray:
        """Page-aligned slot ids (``ceil_page(num_tokens)`` of them) owned by the caller, evicting from the tree
        if needed. Raises KvCacheExhaustedError, changing nothing, if still short."""
        n = ceil_page(as_int(num_tokens, "num_tokens", minimum=0), self._page_size) // self._page_size
        if n > self._binder.available_pages():
            raise KvCacheExhaustedError(
                f"KV cache OOM: need {n} pages, have {self._exhausted_detail()}; free pages or finish requests")
        return self._binder.alloc(n)

    @_locked
    @_journaled
    def free(self, slots: Any) -> None:
        """Return caller-owned whole pages, given as their slots in order. Raises ValueError, freeing nothing,
        for a partial page, a slot out of range, a page listed twice, or a page that is free, tree-owned or
        private to a binding."""
        arr = as_int_array(slots, "slots")
        if len(arr) == 0:
            return
        self._binder.free(self._binder.caller_pages_of(arr))

    @_locked
    @_journaled
    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` unlocked cached tokens (LRU, whole nodes) unless the tree runs out;
        their pages return to the free list. Returns the tokens evicted."""
        return self._binder.evict(as_int(num_tokens, "num_tokens", minimum=0))

    # ------------------------------------------------------------------ replicas (tensor parallelism)
    @_locked
    def record_calls(self, journal: Callable[[str, tuple[Any, ...], dict[str, Any]], None] | None) -> None:
        """From now on call ``journal(name, args, kwargs)`` after every state-changing verb that succeeded (binds,
        finishes, unbinds, ``activate_step``, seal/truncate/invalidate, caller pages, evict, offload/restore, grow,
        scales, ``prefix_reuse_enabled``), in the order they took effect, under the lock: a replica pool that replays
        the same calls makes the same decisions (``smile_llm.distributed.lockstep``). K/V writes are not recorded
        (each replica's forward writes its own heads). None stops recording."""
        self._journal = journal

    @_locked
    @_journaled
    def set_prefix_reuse(self, on: bool) -> None:
        """Set ``prefix_reuse_enabled`` (match prompts on bind, insert on finish)."""
        self._binder.prefix_reuse = bool(on)

    @_locked
    @_journaled
    def set_zero_rejected_kv(self, on: bool) -> None:
        """Set ``zero_rejected_kv`` (``truncate_to`` zeroes the rejected tail of a verify window)."""
        self._zero_rejected_kv = bool(on)

    @property
    def lock(self) -> threading.RLock:
        """The pool's lock (re-entrant): hold it to read several things that no other thread's verb may change in
        between (every verb takes it)."""
        return self._lock

    @_locked
    def state_digest(self) -> str:
        """A hex digest of every decision the pool has made: bindings (ids, pages, lengths, matched prefix, offload),
        the free list in order, page owners, the prefix tree's tokens, slots and locks, the active step's ids and the
        state pools' slots. Two replicas that replayed the same calls have the same digest."""
        return audit.digest(self)

    # ------------------------------------------------------------------ per-request state beside the KV
    @_locked
    def attach_state(self, states: StatePool) -> None:
        """Bind, release, offload and restore a slot of ``states`` together with every request's KV from now on (by
        the same verbs, under this pool's lock): a bind that finds no free slot raises KvCacheExhaustedError like
        one that finds no pages, and ``check_invariants`` audits the slots. From now on a prefix match ends only at a
        tree node holding a state snapshot (``StatePool`` prefix snapshots), which the bind restores: with none,
        every bind misses. Attach before binding anything
        (RuntimeError otherwise); ValueError for a state pool on another device or one already attached."""
        if not isinstance(states, StatePool):
            raise ValueError(f"states must be a StatePool, got {type(states).__name__}")
        if states.device != self._device:
            raise ValueError(f"the state pool is on {states.device} but the KV pool on {self._device}")
        if any(s is states for s in self._states):
            raise ValueError("this state pool is already attached")
        if len(self._table):
            raise RuntimeError(f"attach_state with {len(self._table)} requests bound; attach before binding")
        states.lock = self._lock
        self._states.append(states)

    @property
    def state_pools(self) -> tuple[StatePool, ...]:
        """The attached state pools, in attach order."""
        return tuple(self._states)

    # ------------------------------------------------------------------ offload and restore (docs/contract.md)
    @_locked
    @_journaled
    def offload_request(self, request_id: int) -> OffloadedKv:
        """Move a bound request's private KV to host memory and free its pages. It stays bound (prefix locked)
        but cannot be activated until ``restore_request``. Pages past its ``kv_len`` are not saved."""
        b = self._binding(request_id)
        if b.offload is not None:
            raise RuntimeError(f"request {b.request_id} is already offloaded; restore_request it first")
        if self._step is not None and b.request_id in self._step.ids:
            self._clear_step()
        handle = self._binder.offload(b)
        for states in self._states:
            states.offload(b.request_id)
        return handle

    @_locked
    @_journaled
    def restore_request(self, request_id: int, handle: OffloadedKv) -> None:
        """Bring an offloaded request's KV back, byte-identical, into whatever pages are free (evicting unlocked
        tree pages as needed). Raises KvCacheExhaustedError, changing nothing, if the pages do not fit."""
        b = self._binding(request_id)
        if b.offload is None:
            raise RuntimeError(f"request {b.request_id} is not offloaded; only an offloaded request can be restored")
        if b.offload is not handle:
            raise ValueError(f"restore_request({b.request_id}) needs the handle offload_request returned for it, "
                             f"not the one of request {getattr(handle, 'request_id', handle)!r}")
        if handle.num_private_pages > self._binder.available_pages():
            raise KvCacheExhaustedError(
                f"restore of request {b.request_id} needs {handle.num_private_pages} pages, have "
                f"{self._exhausted_detail()}; finish or offload other requests")
        self._states_fit(1, [], f"restore of request {b.request_id}")
        self._binder.restore(b, handle)
        for states in self._states:
            states.restore(b.request_id)

    @_locked
    def peek_prefix_slots(self, tokens: Any) -> np.ndarray:
        """Slot ids (int64) of the longest cached page-aligned prefix of ``tokens`` in the pool's prefix tree that a
        bind could match (with state pools attached: ending at a node with a state snapshot), without splitting
        nodes, locking or touching LRU times (changes nothing). ValueError for bad tokens."""
        tree_path = self._radix.peek_prefix(as_int_array(tokens, "tokens"), PREFIX_NAMESPACE)
        segments = self._binder.restorable(tree_path)
        parts = [seg.node.value[: seg.matched] for seg in segments if seg.node.value is not None]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    @_locked
    @_journaled
    def grow_request(self, request_id: int, total_capacity: int) -> int:
        """Raise a bound, resident request's capacity to ``total_capacity`` (page-aligned up) by appending private
        pages, evicting unlocked tree pages only as far as needed (on-demand growth for continuous batching, so
        admission binds the prompt plus a little headroom). Returns the new capacity; a capacity already that large
        changes nothing. Clears the active step if the request is in it (its page table changed). Raises
        KvCacheExhaustedError, changing nothing, if the pages cannot be had; RuntimeError for an offloaded request."""
        b = self._binding(request_id)
        if b.offload is not None:
            raise RuntimeError(f"request {b.request_id} is offloaded; restore_request it before growing it")
        want = self._capacity_pages(total_capacity)
        more = want - b.capacity // self._page_size
        if more <= 0:
            return b.capacity
        if more > self._binder.available_pages():
            raise KvCacheExhaustedError(
                f"grow_request({b.request_id}) needs {more} more pages, have {self._exhausted_detail()}; finish, "
                f"offload or unbind other requests")
        if self._step is not None and b.request_id in self._step.ids:
            self._clear_step()
        self._binder.grow(b, more)
        return b.capacity

    # ------------------------------------------------------------------ page bytes (docs/contract.md)
    def _check_page(self, page: Any) -> int:
        return as_int(page, "page", minimum=0, maximum=self._pages.num_pages - 1)

    @_locked
    def read_page(self, layer: int, page: int) -> tuple[bytes, bytes]:
        """Raw bytes of one page of one layer, ``[page_size, Hkv, D]`` row-major in the storage dtype."""
        return self._kv.read_page(self._check_layer(layer), self._check_page(page))

    @_locked
    def write_page(self, layer: int, page: int, k_bytes: Any, v_bytes: Any) -> None:
        """Overwrite one page of one layer with raw bytes (as ``read_page`` returns). Only pages private to a
        binding or owned by the caller may be written: tree-owned KV is shared and immutable."""
        layer, page = self._check_layer(layer), self._check_page(page)
        owner = PageOwner(int(self._pages.owner[page]))
        if owner not in (PageOwner.PRIVATE, PageOwner.CALLER):
            raise ValueError(f"write_page to page {page}, which is {owner.name.lower()}; only pages private to a "
                             f"binding or from alloc() may be written")
        self._kv.write_page(layer, page, self._kv.as_page_bytes(k_bytes, "k_bytes"),
                            self._kv.as_page_bytes(v_bytes, "v_bytes"))

    # ------------------------------------------------------------------ audit and lifetime
    @_locked
    def check_invariants(self) -> None:
        """Raise KvCacheCorruptionError naming the first page or node that breaks the ownership, size or lock
        invariants (see :mod:`smile_llm.cache.audit`), or a state pool whose slots disagree with the bindings."""
        audit.check_invariants(self)
        for states in self._states:
            states.check([b.request_id for b in self._table if b.offload is None],
                         [b.request_id for b in self._table if b.offload is not None])

    @_locked
    def stats(self) -> dict[str, Any]:
        """Pages by owner, cached tokens, counters and the prefix hit rate."""
        return audit.stats(self)

    def close(self) -> None:
        """Release every binding and the buffers. Idempotent; every later call raises PoolClosedError."""
        with self._lock:
            if self._closed:
                return
            for b in self._table:
                self._release(b)
            self._radix.reset()
            for states in self._states:
                states.clear_snapshots()
            self._kv.release()
            self._closed = True

    def __enter__(self) -> KvCachePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"free_pages={self._pages.free_pages}, bound={len(self._table)}"
        return (f"KvCachePool(layers={self._num_layers}, slots={self._num_slots}, kv_heads={self._num_kv_heads}, "
                f"head_dim={self._head_dim}, page_size={self._page_size}, dtype={self._kv.dtype}, "
                f"device={self._device}, {state})")
