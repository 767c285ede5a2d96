"""RequestVerbs: the verbs of a KvCachePool that bind, finish, grow, offload and restore requests,
and hand pages to callers.

Each verb validates its arguments and plans (``Binder.plan``, free and evictable pages, state slots)
before it changes anything, so one that raises leaves the pool as it was; then the binder moves the
pages, every attached state pool (``StatePool``) binds, releases, offloads or restores the request's
slot with them, and the active step (``StepSlot``) is set or dropped: a request whose page table
changes leaves the step, and dropping the step forgets the graph indices prepared for it
(``GraphSteps.forget``). The methods carry the names of the pool verbs they implement
(``KvCachePool`` delegates to them under its lock and journals the state-changing ones); not locked
itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .binder import PREFIX_NAMESPACE, Binder
from .bindings import Binding
from .checks import as_int
from .errors import KvCacheExhaustedError, RequestOffloadedError
from .graph_steps import GraphSteps
from .layout import ceil_page
from .offload import OffloadedKv
from .step import ActiveStep, StepSlot
from .tokens import EMPTY, as_int_array


class RequestVerbs:
    """The request verbs of one pool: page movements through ``binder`` (whose table, tree, pages
    and attached state pools are the pool's), the active step in ``slot``. ``num_slots`` only names
    the pool's size in errors."""

    def __init__(self, binder: Binder, slot: StepSlot, graphs: GraphSteps, device: torch.device,
                 num_slots: int) -> None:
        self._binder, self._slot, self._graphs = binder, slot, graphs
        self._table, self._states = binder.table, binder.states
        self._page_size, self._device, self._num_slots = binder.page_size, device, num_slots

    # ------------------------------------------------------------------ helpers
    def _capacity_pages(self, total_capacity: int) -> int:
        capacity = as_int(total_capacity, "total_capacity", minimum=1)
        return ceil_page(capacity, self._page_size) // self._page_size

    def _release(self, b: Binding, sequence: np.ndarray | None = None) -> None:
        """Unbind ``b`` (finishing it into the tree when ``sequence`` is given) and drop it from the
        step."""
        self._binder.release(b, sequence)
        for states in self._states:
            states.release(b.request_id)
        if self._slot.holds(b.request_id):
            self._clear_step()

    def _bind(self, prompt: np.ndarray, pages: int, matched: int, exclusive: bool) -> Binding:
        """Bind KV pages and a slot of every attached state pool (the callers checked
        ``_states_fit`` first); on a prefix hit the slot starts from the matched node's snapshot
        (the plan only matches nodes that have one)."""
        b = self._binder.bind(prompt, pages, matched, exclusive=exclusive)
        for states in self._states:
            states.bind(b.request_id)
            if matched:
                assert b.locked_node is not None
                states.restore_snapshot(b.request_id, b.locked_node)
        return b

    def _states_fit(self, count: int, releasing: list[Binding], verb: str) -> None:
        """KvCacheExhaustedError unless every attached state pool has ``count`` free slots once
        ``releasing`` is."""
        ids = [b.request_id for b in releasing]
        for states in self._states:
            if not states.can_bind(count, ids):
                raise KvCacheExhaustedError(
                    f"{verb} needs {count} state slot(s) but only {states.free_slots} of "
                    f"{states.max_requests} are free ({states!r}); keep the request queued until "
                    f"others finish")

    def _exhausted_detail(self) -> str:
        """The free and evictable pages, for a KvCacheExhaustedError."""
        evictable = self._binder.radix.evictable_size // self._page_size
        return f"{self._binder.pages.free_pages} free and {evictable} evictable pages"

    def _clear_step(self) -> None:
        """Drop the active step with its step CSR; prepared graph indices no longer apply to any
        batch."""
        self._slot.step = None
        self._graphs.forget()

    def _activate(self, bindings: list[Binding]) -> None:
        step = self._slot.step
        if step is not None and step.ids == tuple(b.request_id for b in bindings):
            return
        self._clear_step()
        self._slot.step = ActiveStep(bindings, self._page_size, self._device)

    def _lookup(self, request_id: Any) -> Binding | None:
        if isinstance(request_id, bool) or not isinstance(request_id, (int, np.integer)):
            return None
        return self._table.get(int(request_id))

    def _binding(self, request_id: Any) -> Binding:
        b = self._lookup(request_id)
        if b is None:
            bound = [x.request_id for x in self._table]
            raise ValueError(f"Unknown request id: {request_id!r}; bound ids are {bound} (bind "
                             f"it first, or it was finished, unbound or released by an exclusive "
                             f"bind)")
        return b

    def _check_prefix(self, b: Binding, seq: np.ndarray, verb: str, hint: str) -> None:
        """ValueError unless ``seq`` starts with ``b``'s matched prefix tokens."""
        if len(seq) < b.matched_len or not np.array_equal(seq[: b.matched_len], b.prefix_tokens):
            raise ValueError(
                f"{verb}({b.request_id}): sequence_tokens must start with the {b.matched_len} "
                f"matched prefix tokens of the request; {hint}")

    # ------------------------------------------------------------------ binding verbs
    def bind_request(self, prompt_tokens: Any, total_capacity: int, *,
                     reuse_prefix: bool = True) -> int:
        """Bind one request for continuous batching; returns its id (positive, never reused).

        Releases bindings made by the exclusive verbs first, matches the prompt (capped below its
        last token; no match with ``reuse_prefix=False``, for a request that must compute its whole
        prompt), locks the match and takes private pages for the page-aligned capacity, evicting
        unlocked tree pages only as far as needed. Raises ValueError if the prompt is longer than
        ``total_capacity`` and KvCacheExhaustedError if the full capacity cannot be had; either way
        nothing changes. The only binding becomes the active step."""
        prompt = as_int_array(prompt_tokens, "prompt_tokens")
        want = self._capacity_pages(total_capacity)
        if len(prompt) > total_capacity:
            raise ValueError(f"prompt of {len(prompt)} tokens is longer than total_capacity "
                             f"{total_capacity}")
        release = [b for b in self._table if b.exclusive]
        matched, available = self._binder.plan(prompt, release, reuse_prefix)
        need = want - matched // self._page_size
        if need > available:
            raise KvCacheExhaustedError(
                f"bind_request needs {need} pages ({want * self._page_size} slots, {matched} "
                f"matched) but only {available} are free or evictable; keep the request queued "
                f"until others finish")
        self._states_fit(1, release, "bind_request")
        for old in release:
            self._release(old)
        b = self._bind(prompt, want, matched, exclusive=False)
        if len(self._table) == 1:
            self._activate([b])
        return b.request_id

    def bind_with_prefix(self, prompt_tokens: Any, total_capacity: int) -> int:
        """Exclusive batch-1 binding (``generate()``): releases every other binding, clamps the
        capacity to the free plus evictable pages (read ``request_capacity``), binds, activates;
        returns the matched prefix length. Raises ValueError, releasing nothing, if even the prompt
        does not fit."""
        prompt = as_int_array(prompt_tokens, "prompt_tokens")
        want = self._capacity_pages(total_capacity)
        if len(prompt) > total_capacity:
            raise ValueError(f"prompt of {len(prompt)} tokens is longer than total_capacity "
                             f"{total_capacity}")
        release = list(self._table)
        matched, available = self._binder.plan(prompt, release)
        ps = self._page_size
        pages = matched // ps + min(want - matched // ps, available)
        if pages * ps < max(1, len(prompt)):
            raise ValueError(
                f"Prompt length {len(prompt)} exceeds free KV capacity {pages * ps} "
                f"(prefix={matched}, pool={self._num_slots} slots); shorten the prompt or use a "
                f"larger pool")
        self._states_fit(1, release, "bind_with_prefix")
        for old in release:
            self._release(old)
        b = self._bind(prompt, pages, matched, exclusive=True)
        self._activate([b])
        return matched

    def bind_requests(self, batch_size: int, capacity: int) -> list[int]:
        """Exclusive batch of ``batch_size`` rows without prefix reuse, each clamped to the same
        page-aligned capacity that fits; activates them. Raises KvCacheExhaustedError, releasing
        nothing, if a row cannot get one page."""
        batch = as_int(batch_size, "batch_size", minimum=1)
        want = self._capacity_pages(capacity)
        release = list(self._table)
        _, available = self._binder.plan(EMPTY, release)
        per_row = min(want, available // batch)
        if per_row < 1:
            raise KvCacheExhaustedError(
                f"KV cache exhausted: need at least {self._page_size} slots per request for "
                f"batch {batch}, have {available * self._page_size} free or evictable; use a "
                f"smaller batch")
        self._states_fit(batch, release, "bind_requests")
        for b in release:
            self._release(b)
        rows = [self._bind(EMPTY, per_row, 0, exclusive=True) for _ in range(batch)]
        self._activate(rows)
        return [b.request_id for b in rows]

    def finish_request(self, request_id: int, sequence_tokens: Any) -> None:
        """Insert the request's written, page-aligned prefix
        ``sequence_tokens[:floor_page(min(len, kv_len))]`` into the tree, free duplicates and unused
        headroom, unlock, unbind. ``sequence_tokens=None`` (or reuse off, or an offloaded request)
        unbinds without inserting. Unknown ids do nothing. Raises ValueError unless the sequence
        starts with the request's matched prefix tokens."""
        b = self._lookup(request_id)
        if b is None:
            return
        if sequence_tokens is None:
            self._release(b)
            return
        seq = as_int_array(sequence_tokens, "sequence_tokens")
        self._check_prefix(b, seq, "finish_request",
                           "pass the prompt followed by the generated tokens")
        self._release(b, seq)

    def cache_prefix(self, request_id: int, sequence_tokens: Any) -> int:
        """Insert the request's written, page-aligned prefix
        ``sequence_tokens[:floor_page(min(len, kv_len))]`` into the tree now, keeping the request
        bound (SGLang's ``cache_unfinished_req``): a request bound next can match it before this one
        finishes (a batch sharing a system prompt computes it once). The request's matched prefix
        grows to the inserted length and stays locked; pages the tree already held are swapped in
        and the duplicates freed. Returns the tokens newly inserted (0 with reuse off, for an
        offloaded request, or when nothing new is written). ValueError for an unknown id, or unless
        ``sequence_tokens`` starts with the matched prefix tokens; nothing changes then. The active
        step is rebuilt at the next ``activate_step``."""
        b = self._binding(request_id)
        seq = as_int_array(sequence_tokens, "sequence_tokens")
        self._check_prefix(b, seq, "cache_prefix", "pass the prompt (and any generated tokens)")
        before = b.matched_len
        added = self._binder.cache_prefix(b, seq)
        if b.matched_len != before and self._slot.holds(b.request_id):
            self._clear_step()  # the step holds a copy of the page table
        return added

    def finish_exclusive(self, sequence_tokens: Any) -> None:
        """Java ``finishRequest(int[])``: with one binding, ``finish_request`` on it; with none,
        nothing; with several, release all without inserting."""
        bindings = list(self._table)
        if len(bindings) == 1:
            self.finish_request(bindings[0].request_id, sequence_tokens)
        else:
            for b in bindings:
                self._release(b)

    def unbind_request(self, request_id: int) -> None:
        """Instant eviction: free the request's private pages, unlock its prefix, insert nothing.
        Unknown ids do nothing."""
        b = self._lookup(request_id)
        if b is not None:
            self._release(b)

    def unbind_requests(self) -> None:
        """Release every binding without inserting."""
        for b in self._table:
            self._release(b)

    def is_bound(self, request_id: int) -> bool:
        """True for a bound request (offloaded ones included); False for anything else."""
        return self._lookup(request_id) is not None

    def matched_prefix_len(self, request_id: int) -> int:
        """Tokens of ``request_id``'s prompt served from the prefix tree at bind time (a multiple of
        ``page_size``, never covering the last prompt token); 0 for an unknown id."""
        b = self._lookup(request_id)
        return b.matched_len if b is not None else 0

    def kv_len(self, request_id: int) -> int:
        """End of the request's contiguous written KV. ValueError for an unknown id."""
        return self._table.kv_len_of(self._binding(request_id))

    def activate_step(self, *request_ids: int) -> None:
        """Select the batch (in order) that put/get/metadata/seal act on. The same cohort keeps the
        step's cached state. Raises ValueError on no, unknown or duplicate ids and
        RequestOffloadedError on an offloaded one, changing nothing."""
        if len(request_ids) == 1 and isinstance(request_ids[0], (list, tuple, np.ndarray)):
            request_ids = tuple(request_ids[0])
        if not request_ids:
            raise ValueError("activate_step needs at least one request id")
        bindings = [self._binding(i) for i in request_ids]
        if len({b.request_id for b in bindings}) != len(bindings):
            raise ValueError(f"activate_step got duplicate ids: {list(request_ids)}; list each "
                             f"request once")
        for b in bindings:
            if b.offload is not None:
                raise RequestOffloadedError(f"request {b.request_id} is offloaded to host memory; "
                                            f"restore_request it before activating")
        self._activate(bindings)

    def set_prefix_reuse(self, on: bool) -> None:
        """Set ``prefix_reuse_enabled`` (match prompts on bind, insert on finish)."""
        self._binder.prefix_reuse = bool(on)

    def peek_prefix_slots(self, tokens: Any) -> np.ndarray:
        """Slot ids (int64) of the longest cached page-aligned prefix of ``tokens`` in the pool's
        prefix tree that a bind could match (with state pools attached: ending at a node with a
        state snapshot), without splitting nodes, locking or touching LRU times (changes nothing).
        ValueError for bad tokens."""
        tree_path = self._binder.radix.peek_prefix(as_int_array(tokens, "tokens"), PREFIX_NAMESPACE)
        segments = self._binder.restorable(tree_path)
        parts = [seg.node.value[: seg.matched] for seg in segments if seg.node.value is not None]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------ grow, offload, restore
    def grow_request(self, request_id: int, total_capacity: int) -> int:
        """Raise a bound, resident request's capacity to ``total_capacity`` (page-aligned up) by
        appending private pages, evicting unlocked tree pages only as far as needed (on-demand
        growth for continuous batching, so admission binds the prompt plus a little headroom).
        Returns the new capacity; a capacity already that large changes nothing. Clears the active
        step if the request is in it (its page table changed). Raises KvCacheExhaustedError,
        changing nothing, if the pages cannot be had; RuntimeError for an offloaded request."""
        b = self._binding(request_id)
        if b.offload is not None:
            raise RuntimeError(f"request {b.request_id} is offloaded; restore_request it before "
                               f"growing it")
        want = self._capacity_pages(total_capacity)
        more = want - b.capacity // self._page_size
        if more <= 0:
            return b.capacity
        if more > self._binder.available_pages():
            raise KvCacheExhaustedError(
                f"grow_request({b.request_id}) needs {more} more pages, have "
                f"{self._exhausted_detail()}; finish, offload or unbind other requests")
        if self._slot.holds(b.request_id):
            self._clear_step()
        self._binder.grow(b, more)
        return b.capacity

    def offload_request(self, request_id: int) -> OffloadedKv:
        """Move a bound request's private KV to host memory and free its pages. It stays bound
        (prefix locked) but cannot be activated until ``restore_request``. Pages past its ``kv_len``
        are not saved."""
        b = self._binding(request_id)
        if b.offload is not None:
            raise RuntimeError(f"request {b.request_id} is already offloaded; restore_request it "
                               f"first")
        if self._slot.holds(b.request_id):
            self._clear_step()
        handle = self._binder.offload(b)
        for states in self._states:
            states.offload(b.request_id)
        return handle

    def restore_request(self, request_id: int, handle: OffloadedKv) -> None:
        """Bring an offloaded request's KV back, byte-identical, into whatever pages are free
        (evicting unlocked tree pages as needed). Raises KvCacheExhaustedError, changing nothing, if
        the pages do not fit."""
        b = self._binding(request_id)
        if b.offload is None:
            raise RuntimeError(f"request {b.request_id} is not offloaded; only an offloaded "
                               f"request can be restored")
        if b.offload is not handle:
            raise ValueError(f"restore_request({b.request_id}) needs the handle offload_request "
                             f"returned for it, not the one of request "
                             f"{getattr(handle, 'request_id', handle)!r}")
        if handle.num_private_pages > self._binder.available_pages():
            raise KvCacheExhaustedError(
                f"restore of request {b.request_id} needs {handle.num_private_pages} pages, have "
                f"{self._exhausted_detail()}; finish or offload other requests")
        self._states_fit(1, [], f"restore of request {b.request_id}")
        tails = self._binder.kv.tails_to_restore(handle.k_raw, handle.v_raw)
        if tails > self._binder.kv.tails.free_tails:
            raise KvCacheExhaustedError(
                f"restore of request {b.request_id} needs {tails} tails (raw pages of a packed "
                f"pool), {self._binder.kv.tails.free_tails} are free; finish or offload other "
                f"requests")
        self._binder.restore(b, handle)
        for states in self._states:
            states.restore(b.request_id)

    # ------------------------------------------------------------------ caller pages, eviction
    def alloc(self, num_tokens: int) -> np.ndarray:
        """Page-aligned slot ids (``ceil_page(num_tokens)`` of them) owned by the caller, evicting
        from the tree if needed. Raises KvCacheExhaustedError, changing nothing, if still short."""
        num_tokens = as_int(num_tokens, "num_tokens", minimum=0)
        n = ceil_page(num_tokens, self._page_size) // self._page_size
        if n > self._binder.available_pages():
            raise KvCacheExhaustedError(f"KV cache OOM: need {n} pages, have "
                                        f"{self._exhausted_detail()}; free pages or finish "
                                        f"requests")
        return self._binder.alloc(n)

    def free(self, slots: Any) -> None:
        """Return caller-owned whole pages, given as their slots in order. Raises ValueError,
        freeing nothing, for a partial page, a slot out of range, a page listed twice, or a page
        that is free, tree-owned or private to a binding."""
        arr = as_int_array(slots, "slots")
        if len(arr) == 0:
            return
        self._binder.free(self._binder.caller_pages_of(arr))

    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` unlocked cached tokens (LRU, whole nodes) unless the tree
        runs out; their pages return to the free list. Returns the tokens evicted."""
        return self._binder.evict(as_int(num_tokens, "num_tokens", minimum=0))
