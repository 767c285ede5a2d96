"""KvCachePool: the one owner of pages and K/V buffers, composed of parts.

State: a :class:`PageAllocator` (who owns each page, FIFO free list), a :class:`RadixCache` (a pure
prefix index), a :class:`BindingTable` (one record per bound request), a :class:`KvStore` (the
buffers), a :class:`Binder` (every change of page ownership) and a :class:`StepSlot` (the active
step). Verbs, each in its part:

- :class:`RequestVerbs` (``request_verbs.py``): bind, finish, unbind, activate, grow, offload and
  restore requests; caller pages and eviction;
- :class:`StepVerbs` (``step_verbs.py``): K/V writes and reads of the active step, its CSR, seal
  and truncate;
- :class:`GraphSteps` (``graph_steps.py``): the CUDA-graph buffers and the verbs that prepare them;
- :mod:`~smile_llm.cache.audit`: invariants, stats and the replicas' digest.

The pool validates construction, holds the one lock and the journal (:mod:`~smile_llm.cache.guard`),
and delegates each verb to its part under the lock. Every public call is transactional: it validates
and plans first and raises before it changes anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec

import torch

from .. import env
from . import audit, factories
from .binder import Binder
from .bindings import BindingTable
from .checks import as_device, as_int, as_layer
from .errors import LayerNotHeldError, PoolClosedError
from .graph_steps import GraphSteps
from .guard import Journal, delegate, journaled, locked
from . import kv_fingerprint as fingerprints
from .kv_step import KvStep
from .kv_dtype import LayerFormats, dense_formats
from .kv_store import FILL_MODES, KvStore, check_scales
from .kv_tails import default_tails
from .layout import floor_page
from .pages import PageAllocator, PageOwner
from .radix import RadixCache
from .request_verbs import RequestVerbs
from .splice import SpliceVerbs
from .state_pool import StatePool
from .step import ActiveStep, StepSlot
from .step_verbs import StepVerbs

P = ParamSpec("P")


def _state(getter: Callable[[KvCachePool], object],
           setter: Callable[[KvCachePool, bool], None] | None = None,
           doc: str | None = None) -> property:
    """A pool property read (and optionally written) under the lock; PoolClosedError after
    close()."""

    def get(self: KvCachePool) -> object:
        with self._lock:
            if self._closed:
                raise PoolClosedError("the pool is closed; create a new pool")
            return getter(self)

    def put(self: KvCachePool, value: bool) -> None:
        with self._lock:
            if self._closed:
                raise PoolClosedError("the pool is closed; create a new pool")
            assert setter is not None
            setter(self, value)

    return property(get, put if setter is not None else None, doc=doc)


def _counter(getter: Callable[[KvCachePool], int], doc: str | None = None) -> property:
    """A pool counter read without the lock: ``getter`` reads one int attribute, which the GIL reads
    atomically, so the value is the counter before or after any concurrent call (as if read under
    the lock just before or after it). PoolClosedError after close(). For counters callers poll
    often (``free_pages`` from a JVM thread costs a lock round trip less)."""

    def get(self: KvCachePool) -> int:
        if self._closed:
            raise PoolClosedError("the pool is closed; create a new pool")
        return getter(self)

    return property(get, None, doc=doc)


def _factory(make: Callable[Concatenate[type[KvCachePool], P], KvCachePool]
             ) -> classmethod[KvCachePool, P, KvCachePool]:
    """A sized constructor of :mod:`~smile_llm.cache.factories` as a classmethod of the pool."""
    return classmethod(make)


def _requests(pool: KvCachePool) -> RequestVerbs:
    return pool._requests


def _steps(pool: KvCachePool) -> StepVerbs:
    return pool._steps


def _graphs(pool: KvCachePool) -> GraphSteps:
    return pool._graphs


def _splices(pool: KvCachePool) -> SpliceVerbs:
    return SpliceVerbs(pool._binder, pool._kv, pool._num_layers)


class KvCachePool:
    """Static paged K/V pool with an embedded radix prefix cache. See docs/contract.md for the
    contract."""

    DEFAULT_PAGE_SIZE = 16

    def __init__(self, num_layers: int, num_slots: int, num_kv_heads: int, head_dim: int,
                 page_size: int = 16, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32, *, k_scale: float = 1.0, v_scale: float = 1.0,
                 zero_rejected_kv: bool | None = None, fresh_page_fill: str = "none",
                 first_layer: int = 0, kv_formats: tuple[LayerFormats, ...] | None = None,
                 num_tails: int | None = None, compute_dtype: torch.dtype | None = None) -> None:
        for name, value in (("num_layers", num_layers), ("num_slots", num_slots),
                            ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("page_size", page_size)):
            # zero layers: the pages and bindings alone (a pipeline stage without attention layers)
            as_int(value, name, minimum=0 if name == "num_layers" else 1)
        if num_slots % page_size:
            raise ValueError(f"num_slots {num_slots} must be a multiple of page_size {page_size}; "
                             f"use {floor_page(num_slots, page_size) or page_size}")
        if fresh_page_fill not in FILL_MODES:
            raise ValueError(f"fresh_page_fill must be one of {FILL_MODES}, got "
                             f"{fresh_page_fill!r}")
        formats = dense_formats(dtype, int(num_layers)) if kv_formats is None else \
            tuple(kv_formats)
        if len(formats) != num_layers:
            raise ValueError(f"kv_formats lists {len(formats)} layers; the pool has {num_layers}")
        check_scales(formats, k_scale, v_scale)
        self._first_layer = as_int(first_layer, "first_layer", minimum=0)
        self._num_layers, self._num_slots = int(num_layers), int(num_slots)
        self._num_kv_heads, self._head_dim = int(num_kv_heads), int(head_dim)
        self._page_size = int(page_size)
        num_pages = self._num_slots // self._page_size
        self._device = device = as_device(device)
        zero = env.zero_rejected_kv() if zero_rejected_kv is None else bool(zero_rejected_kv)
        tails = default_tails(num_pages) if num_tails is None else \
            as_int(num_tails, "num_tails", minimum=0)
        self._kv = KvStore(self._num_layers, self._num_slots, self._num_kv_heads, self._head_dim,
                           self._page_size, device, None, k_scale, v_scale, formats, tails,
                           compute_dtype)
        self._pages = PageAllocator(num_pages)
        self._pages.on_free, self._pages.on_transfer = self._kv.free_pages, self._kv.forget_pages
        self._radix = RadixCache(self._page_size)
        self._table = BindingTable()
        self._lock = threading.RLock()
        self._closed = False
        self._states: list[StatePool] = []  # per-request state beside the KV (attach_state)
        self._journal: Journal | None = None  # record_calls
        self._journal_depth = 0  # journaled verbs running (see guard.journaled)
        self._binder = Binder(self._pages, self._radix, self._table, self._kv, fresh_page_fill,
                              self._states)
        self._slot = StepSlot()
        self._graphs = GraphSteps(self._slot, self._table, self._binder, self._page_size, num_pages,
                                  device)
        self._requests = RequestVerbs(self._binder, self._slot, self._graphs, device,
                                      self._num_slots)
        self._steps = StepVerbs(self._slot, self._graphs, self._kv, self._table, self._num_layers,
                                zero, self._commit_kv_step)

    # ------------------------------------------------------------------ sized constructors
    allocate = _factory(factories.allocate)
    for_testing = _factory(factories.for_testing)
    for_mtp = _factory(factories.for_mtp)
    for_mtp_history = _factory(factories.for_mtp_history)

    # ------------------------------------------------------------------ properties
    num_layers = _state(lambda self: self._num_layers)
    layer_range = _state(lambda self: range(self._first_layer,
                                            self._first_layer + self._num_layers),
                         doc="The model's KV layers this pool holds, in the model's numbering "
                             "(``range(0, num_layers)`` but on a pipeline-parallel rank).")
    num_slots = _state(lambda self: self._num_slots)
    num_kv_heads = _state(lambda self: self._num_kv_heads)
    head_dim = _state(lambda self: self._head_dim)
    page_size = _state(lambda self: self._page_size)
    device = _state(lambda self: self._device)
    dtype = _state(lambda self: self._kv.dtype,
                   doc="Storage dtype of K and V; the compute dtype when layers or sides are "
                       "stored in different formats or packed (see ``kv_formats``).")
    kv_formats = _state(lambda self: self._kv.formats,
                        doc="Each KV layer's K and V storage format (``cache.kv_dtype``).")
    direct = _state(lambda self: self._kv.direct,
                    doc="Every layer and side stored alike in a dense dtype: attention reads the "
                        "storage itself (``KvStep.key_pages``); else a per-forward view.")
    packed = _state(lambda self: self._kv.packed,
                    doc="Some layer stores a side in a low-bit packed format (``cache.codecs``).")
    num_tails = _state(lambda self: self._kv.tails.num_tails,
                       doc="Raw page buffers of a packed pool (0 without packed layers).")
    compute_dtype = _state(lambda self: self._kv.compute_dtype, doc="The dtype get() returns.")
    k_scale = _state(lambda self: self._kv.k_scale,
                     doc="FP8 K scale (1.0 for float storage); pass to attention.")
    v_scale = _state(lambda self: self._kv.v_scale,
                     doc="FP8 V scale (1.0 for float storage); pass to attention.")
    kv_is_compute_dtype = _state(lambda self: self._kv.direct and
                                 self._kv.dtype == self._kv.compute_dtype)
    fresh_page_fill = _state(lambda self: self._binder.fresh_page_fill,
                             doc='"none", "zero" or "poison"')
    radix = _state(lambda self: self._radix,
                   doc="The embedded tree, for inspection only: mutate it through the pool "
                       "(evicting it directly would leak pages).")
    key_cache = _state(lambda self: self._uniform_buffer("key_cache"),
                       doc="K buffer [num_layers, num_slots, Hkv, D].")
    value_cache = _state(lambda self: self._uniform_buffer("value_cache"),
                         doc="V buffer [num_layers, num_slots, Hkv, D].")
    free_pages = _counter(lambda self: self._pages.free_pages, doc="Pages on the free list.")
    free_slots = _counter(lambda self: self._pages.free_pages * self._page_size,
                          doc="``free_pages * page_size``.")
    request_capacity = _state(
        lambda self: self._slot.step.min_capacity if self._slot.step is not None else 0,
        doc="Smallest capacity among the active rows (0 when no step is active).")
    bound_request_count = _state(lambda self: len(self._table),
                                 doc="Bound requests, offloaded ones included.")
    active_request_ids = _state(
        lambda self: self._slot.step.ids if self._slot.step is not None else (),
        doc="Ids of the active step's rows, in order (empty without one).")
    prefix_prompt_tokens = _state(
        lambda self: self._binder.prompt_tokens,
        doc="Prompt tokens of every bind made with reuse on (cumulative).")
    prefix_match_tokens = _state(lambda self: self._binder.match_tokens,
                                 doc="Matched (capped) prefix tokens of those binds (cumulative).")
    prefix_insert_tokens = _state(
        lambda self: self._binder.insert_tokens,
        doc="Tokens newly inserted into the tree by finishes (cumulative).")
    prefix_evict_tokens = _state(lambda self: self._binder.evict_tokens,
                                 doc="Tokens the pool evicted from the tree (cumulative).")
    decode_graph_buffers = _state(
        lambda self: self._graphs.decode.enabled,
        lambda self, on: setattr(self._graphs.decode, "enabled", bool(on)),
        doc="put with S == 1 writes through the prepared decode index buffer (a put-level switch; "
            "a forward passes decode_graph_index to kv_step instead).")
    verify_graph_buffers = _state(
        lambda self: self._graphs.verify.enabled,
        lambda self, on: setattr(self._graphs.verify, "enabled", bool(on)),
        doc="put writes through the prepared verify index buffer (a put-level switch; a forward "
            "passes verify_graph_index to kv_step instead).")
    verify_window_kernel = _state(
        lambda self: self._graphs.verify.window_kernel,
        lambda self, on: setattr(self._graphs.verify, "window_kernel", bool(on)),
        doc="Set only during an MTP verify forward: small windows may take the paged verify kernel "
            "eagerly.")

    @property
    def closed(self) -> bool:
        """True after ``close()`` (every other call then raises RuntimeError)."""
        return self._closed

    @property
    def _step(self) -> ActiveStep | None:
        """The active step (read by tests and audits; the request verbs set it)."""
        return self._slot.step

    # ------------------------------------------------------------------ requests (request_verbs.py)
    bind_request = delegate(_requests, RequestVerbs.bind_request, journal=True)
    bind_with_prefix = delegate(_requests, RequestVerbs.bind_with_prefix, journal=True)
    bind_requests = delegate(_requests, RequestVerbs.bind_requests, journal=True)
    finish_request = delegate(_requests, RequestVerbs.finish_request, journal=True)
    cache_prefix = delegate(_requests, RequestVerbs.cache_prefix, journal=True)
    finish_exclusive = delegate(_requests, RequestVerbs.finish_exclusive, journal=True)
    unbind_request = delegate(_requests, RequestVerbs.unbind_request, journal=True)
    unbind_requests = delegate(_requests, RequestVerbs.unbind_requests, journal=True)
    is_bound = delegate(_requests, RequestVerbs.is_bound)
    matched_prefix_len = delegate(_requests, RequestVerbs.matched_prefix_len)
    kv_len = delegate(_requests, RequestVerbs.kv_len)
    activate_step = delegate(_requests, RequestVerbs.activate_step, journal=True)
    set_prefix_reuse = delegate(_requests, RequestVerbs.set_prefix_reuse, journal=True)
    prefix_reuse_enabled = _state(
        lambda self: self._binder.prefix_reuse, lambda self, on: self.set_prefix_reuse(on),
        doc="Match prompts against the tree on bind and insert on finish.")
    peek_prefix_slots = delegate(_requests, RequestVerbs.peek_prefix_slots)
    grow_request = delegate(_requests, RequestVerbs.grow_request, journal=True)
    offload_request = delegate(_requests, RequestVerbs.offload_request, journal=True)
    restore_request = delegate(_requests, RequestVerbs.restore_request, journal=True)
    alloc = delegate(_requests, RequestVerbs.alloc, journal=True)
    free = delegate(_requests, RequestVerbs.free, journal=True)
    evict = delegate(_requests, RequestVerbs.evict, journal=True)
    # a registered segment's KV into a request, shifted by whole pages (splice.py)
    splice_kv = delegate(_splices, SpliceVerbs.splice_kv, journal=True)

    # ------------------------------------------------------------------ active step (step_verbs.py)
    ensure_request = delegate(_steps, StepVerbs.ensure_request)
    put = delegate(_steps, StepVerbs.put)
    kv_step = delegate(_steps, StepVerbs.kv_step)
    get = delegate(_steps, StepVerbs.get)
    get_padded = delegate(_steps, StepVerbs.get_padded)
    slot_indices = delegate(_steps, StepVerbs.slot_indices)
    window_slot_indices = delegate(_steps, StepVerbs.window_slot_indices)
    key_layer = delegate(_steps, StepVerbs.key_layer)
    value_layer = delegate(_steps, StepVerbs.value_layer)
    build_flashinfer_metadata = delegate(_steps, StepVerbs.build_flashinfer_metadata)
    shared_flashinfer_metadata = delegate(_steps, StepVerbs.shared_flashinfer_metadata)
    clear_step_metadata = delegate(_steps, StepVerbs.clear_step_metadata, journal=True)
    current_step_metadata = delegate(_steps, StepVerbs.current_step_metadata)
    seal_length = delegate(_steps, StepVerbs.seal_length, journal=True)
    truncate_to = delegate(_steps, StepVerbs.truncate_to, journal=True)
    move_kv = delegate(_steps, StepVerbs.move_kv, journal=True)
    invalidate_range = delegate(_steps, StepVerbs.invalidate_range, journal=True)
    set_zero_rejected_kv = delegate(_steps, StepVerbs.set_zero_rejected_kv, journal=True)
    zero_rejected_kv = _state(lambda self: self._steps.zero_rejected_kv,
                              lambda self, on: self.set_zero_rejected_kv(on),
                              doc="truncate_to zeroes the rejected tail of a verify window.")

    def _commit_kv_step(self, kv: KvStep) -> None:
        """``KvStep.commit``, from the forward's thread: under the lock, PoolClosedError after
        close()."""
        with self._lock:
            if self._closed:
                raise PoolClosedError("KvStep.commit: the pool is closed; create a new pool")
            self._steps.record_commit(kv)

    # ------------------------------------------------------------------ graphs (graph_steps.py)
    prepare_decode_graph_step = delegate(_graphs, GraphSteps.prepare_decode_graph_step)
    reserve_graph_rows = delegate(_graphs, GraphSteps.reserve_graph_rows)
    decode_graph_metadata = delegate(_graphs, GraphSteps.decode_graph_metadata)
    decode_graph_index = delegate(_graphs, GraphSteps.decode_graph_index)
    begin_prefetch_decode_graph_step = delegate(_graphs,
                                                GraphSteps.begin_prefetch_decode_graph_step)
    end_prefetch_decode_graph_step = delegate(_graphs, GraphSteps.end_prefetch_decode_graph_step)
    install_prefetched_step_metadata = delegate(_graphs,
                                                GraphSteps.install_prefetched_step_metadata)
    prepare_verify_graph_step = delegate(_graphs, GraphSteps.prepare_verify_graph_step)
    prepare_verify_step = delegate(_graphs, GraphSteps.prepare_verify_step)
    verify_graph_index = delegate(_graphs, GraphSteps.verify_graph_index)
    verify_graph_metadata = delegate(_graphs, GraphSteps.verify_graph_metadata)
    consume_verify_graph_meta_realloc = delegate(_graphs,
                                                 GraphSteps.consume_verify_graph_meta_realloc)
    verify_qo_indptr = delegate(_graphs, GraphSteps.verify_qo_indptr)

    def _uniform_buffer(self, name: str) -> torch.Tensor:
        if not self._kv.direct:
            raise ValueError(f"{name} is one buffer only when every layer is stored alike in a "
                             f"dense dtype; this pool's layers are {self._formats_text()}: read a "
                             f"layer with get() or read_page()")
        return getattr(self._kv, name)  # type: ignore[no-any-return]

    def _formats_text(self) -> str:
        return ", ".join(str(f) for f in self._kv.formats)

    @locked
    def dtype_for_layer(self, layer: int) -> str:
        """The storage format of the model's KV layer ``layer`` (the model's numbering: see
        ``local_layer``): its name (``"bfloat16"``, ``"nvfp4"``, ...) when K and V are stored alike,
        else ``"k=..., v=..."``. Smile: ``dtypeForLayer``."""
        return str(self._kv.formats[self.local_layer(layer)])

    @locked
    def k_block_stride_bytes_for_layer(self, layer: int) -> int:
        """Bytes of one page of the model's KV layer ``layer``'s K as stored (a packed page's
        codes and scales). Smile: ``kBlockStrideBytesForLayer``."""
        return self._kv.side_bytes(self.local_layer(layer))[0]

    @locked
    def v_block_stride_bytes_for_layer(self, layer: int) -> int:
        """Bytes of one page of the model's KV layer ``layer``'s V as stored. Smile:
        ``vBlockStrideBytesForLayer``."""
        return self._kv.side_bytes(self.local_layer(layer))[1]

    @locked
    def local_layer(self, layer: int) -> int:
        """The pool's own index (what ``put``, ``kv_step`` writes and ``read_page`` take) of the
        model's KV layer ``layer``. LayerNotHeldError (an IndexError) naming the range this pool
        holds for a layer outside it; ValueError for a non-int."""
        index = as_int(layer, "layer", minimum=0)
        if index not in range(self._first_layer, self._first_layer + self._num_layers):
            end = self._first_layer + self._num_layers
            raise LayerNotHeldError(f"layer {index} is not held by this pool, which holds layers "
                                    f"[{self._first_layer}, {end}) (a pipeline-parallel rank "
                                    "holds its own range only)")
        return index - self._first_layer

    @locked
    def num_pages_for_length(self, length: int) -> int:
        """Pages a row of ``length`` tokens spans: ``ceil(length / page_size)``.

        >>> pool = KvCachePool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=4, page_size=16)
        >>> [pool.num_pages_for_length(n) for n in (1, 16, 17, 481, 495, 496, 497)]
        [1, 1, 2, 31, 31, 31, 32]
        """
        return -(-as_int(length, "length") // self._page_size)

    @locked
    def steps_until_page_boundary(self, cache_len: int) -> int:
        """Decode steps until ``cache_len`` fills its last page (0 when it just did). Smile's
        numbers at page 16:

        >>> pool = KvCachePool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=4, page_size=16)
        >>> [pool.steps_until_page_boundary(n) for n in (481, 495, 496, 497)]
        [15, 1, 0, 15]
        """
        rem = as_int(cache_len, "cache_len") % self._page_size
        return 0 if rem == 0 else self._page_size - rem

    @locked
    def first_cache_len_in_next_page_bucket(self, num_pages: int) -> int:
        """The first length that needs ``num_pages + 1`` pages.

        >>> pool = KvCachePool(num_layers=1, num_slots=16, num_kv_heads=1, head_dim=4)
        >>> pool.first_cache_len_in_next_page_bucket(31)
        497
        """
        return as_int(num_pages, "num_pages") * self._page_size + 1

    # ------------------------------------------------------------------ storage
    @locked
    @journaled
    def set_kv_scales(self, k_scale: float, v_scale: float) -> None:
        """Set the fixed FP8 scales. Only while nothing is stored (no bindings, empty tree, no
        caller pages): RuntimeError otherwise, since stored values would be reinterpreted.
        ValueError for scales other than 1.0 on float storage."""
        check_scales(self._kv.formats, k_scale, v_scale)
        if len(self._table) or self._radix.total_size() or self._pages.count(PageOwner.CALLER):
            raise RuntimeError("set_kv_scales while KV is stored would rescale it; call it before "
                               "binding, after unbind_requests() and with an empty prefix tree")
        self._kv.set_scales(k_scale, v_scale)

    def _check_page(self, page: int) -> int:
        return as_int(page, "page", minimum=0, maximum=self._pages.num_pages - 1)

    @locked
    def read_page(self, layer: int, page: int) -> tuple[bytes, bytes]:
        """Stored bytes of one page of one layer (the pool's own layer index): a dense side's
        ``[page_size, Hkv, D]`` row-major in its storage dtype, a packed side's parts in the codec's
        order (``k_block_stride_bytes_for_layer`` bytes). ValueError for a packed page still being
        written."""
        return self._kv.read_page(as_layer(layer, self._num_layers), self._check_page(page))

    @locked
    def write_page(self, layer: int, page: int, k_bytes: Any, v_bytes: Any) -> None:
        """Overwrite one page of one layer with raw bytes (as ``read_page`` returns; bytes-like or a
        tensor). Only pages private to a binding or owned by the caller may be written: tree-owned
        KV is shared and immutable."""
        layer, page = as_layer(layer, self._num_layers), self._check_page(page)
        owner = PageOwner(int(self._pages.owner[page]))
        if owner not in (PageOwner.PRIVATE, PageOwner.CALLER):
            raise ValueError(f"write_page to page {page}, which is {owner.name.lower()}; only "
                             f"pages private to a binding or from alloc() may be written")
        k_size, v_size = self._kv.side_bytes(layer)
        self._kv.write_page(layer, page, self._kv.as_page_bytes(k_bytes, "k_bytes", k_size),
                            self._kv.as_page_bytes(v_bytes, "v_bytes", v_size))

    # ------------------------------------------------------------------ replicas (lockstep)
    @locked
    def record_calls(self, journal: Journal | None) -> None:
        """From now on call ``journal(name, args, kwargs)`` after every state-changing verb that
        succeeded (binds, finishes, unbinds, ``activate_step``, seal/truncate/invalidate, caller
        pages, evict, offload/restore, grow, scales, ``prefix_reuse_enabled``), in the order they
        took effect, under the lock: a replica pool that replays the same calls makes the same
        decisions (``smile_llm.distributed.lockstep``). K/V writes are not recorded (each replica's
        forward writes its own heads). None stops recording."""
        self._journal = journal

    @property
    def lock(self) -> threading.RLock:
        """The pool's lock (re-entrant): hold it to read several things that no other thread's verb
        may change in between (every verb takes it)."""
        return self._lock

    @locked
    def state_digest(self) -> str:
        """A hex digest of every decision the pool has made: bindings (ids, pages, lengths, matched
        prefix, offload), the free list in order, page owners, the prefix tree's tokens, slots and
        locks, the active step's ids and the state pools' slots. Two replicas that replayed the same
        calls have the same digest."""
        return audit.digest(self._binder, self._slot.step)

    @locked
    def kv_fingerprint(self, request_id: int,
                       boundary: int | None = None) -> fingerprints.KvFingerprint:
        """Per KV layer, float64 (sum, sum of squares, sum of absolute values) of K and of V over
        the request's written positions ``[0, kv_len)``, split at the token position ``boundary``
        (default: the request's tree-owned matched prefix, ``matched_prefix_len``) into the prefix
        region (reused from the tree) and the suffix region (computed by the request). Read-only
        (``kv_fingerprint.py``). ValueError for an unknown id or a boundary outside ``[0, kv_len]``,
        RequestOffloadedError for an offloaded request."""
        return fingerprints.fingerprint(self._table, self._kv, self._num_layers, self._page_size,
                                        self._kv.dtype, request_id, boundary)

    @locked
    def kv_block_fingerprints(self, request_id: int, layer: int, boundary: int | None = None
                              ) -> tuple[fingerprints.PageFingerprint, ...]:
        """One row per logical page holding written KV of the request, in page-table order: logical
        index, physical page, region (split at ``boundary`` as ``kv_fingerprint``) and the float64
        sums of squares of K and V of ``layer``. Read-only. ValueError for an unknown id, a bad
        layer or boundary; RequestOffloadedError for an offloaded request."""
        return fingerprints.page_fingerprints(self._table, self._kv, self._num_layers,
                                              self._page_size, request_id, layer, boundary)

    # ------------------------------------------------------------------ state beside the KV
    @locked
    def attach_state(self, states: StatePool) -> None:
        """Bind, release, offload and restore a slot of ``states`` together with every request's KV
        from now on (by the same verbs, under this pool's lock): a bind that finds no free slot
        raises KvCacheExhaustedError like one that finds no pages, and ``check_invariants`` audits
        the slots. From now on a prefix match ends only at a tree node holding a state snapshot
        (``StatePool`` prefix snapshots), which the bind restores: with none, every bind misses.
        Attach before binding anything (RuntimeError otherwise); ValueError for a state pool on
        another device or one already attached."""
        if not isinstance(states, StatePool):
            raise ValueError(f"states must be a StatePool, got {type(states).__name__}")
        if states.device != self._device:
            raise ValueError(f"the state pool is on {states.device} but the KV pool on "
                             f"{self._device}")
        if any(s is states for s in self._states):
            raise ValueError("this state pool is already attached")
        if len(self._table):
            raise RuntimeError(f"attach_state with {len(self._table)} requests bound; attach "
                               f"before binding")
        states.lock = self._lock
        self._states.append(states)

    @property
    def state_pools(self) -> tuple[StatePool, ...]:
        """The attached state pools, in attach order."""
        return tuple(self._states)

    # ------------------------------------------------------------------ audit and lifetime
    @locked
    def check_invariants(self) -> None:
        """Raise KvCacheCorruptionError naming the first page or node that breaks the ownership,
        size or lock invariants (see :mod:`smile_llm.cache.audit`), or a state pool whose slots
        disagree with the bindings."""
        audit.check_invariants(self._binder, self._slot.step, self._graphs.prefetch.scratch_pages)

    @locked
    def stats(self) -> dict[str, int | float]:
        """Pages by owner, cached tokens, counters and the prefix hit rate (``audit.stats``)."""
        return audit.stats(self._binder, self._slot.step)

    def close(self) -> None:
        """Release every binding and the buffers. Idempotent; every later call raises
        PoolClosedError."""
        with self._lock:
            if self._closed:
                return
            self._requests.unbind_requests()
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
        state = ("closed" if self._closed
                 else f"free_pages={self._pages.free_pages}, bound={len(self._table)}")
        return (f"KvCachePool(layers={self._num_layers}, slots={self._num_slots}, "
                f"kv_heads={self._num_kv_heads}, head_dim={self._head_dim}, "
                f"page_size={self._page_size}, dtype={self._kv.dtype}, device={self._device}, "
                f"{state})")
