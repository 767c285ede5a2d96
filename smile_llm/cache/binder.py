"""Binder: every change of page ownership, planned before it is made.

The binder moves pages between the free list, the prefix tree, bindings (requests) and callers: it
plans binds without touching anything (``plan``), commits them (``bind``), finishes requests into
the tree (``release`` with an insert), evicts, hands caller pages out and back, and offloads or
restores a request's private pages. The pool validates arguments, holds the lock and owns the active
step; it calls the binder only for work that was checked to succeed, so every raising pool call
leaves the pages as they were.

Page regions of one bound request (ps = page_size, positions in tokens)::

    [0, matched_len)         tree-owned pages, locked through locked_node; never written
    [matched_len, capacity)  private pages; [matched_len, kv_len) holds written KV
    on finish                [matched_len, floor_page(min(len(sequence), kv_len))) goes to the
                             tree, minus what the tree already had (duplicates); every other
                             private page is freed

With state pools attached (``states``, the pool's list), a match may only end at a node whose state
snapshot every state pool holds (the state after the prefix must be restored with it), and each
insert hands the request's pending snapshot of the inserted length to the node ending there.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from .bindings import Binding, BindingTable
from .kv_store import KvStore
from .layout import floor_page
from .offload import OffloadedKv
from .pages import NO_HOLDER, PageAllocator, PageOwner, page_slots
from .radix import PathSegment, RadixCache
from .tokens import EMPTY

if TYPE_CHECKING:
    from .radix import TreeNode
    from .state_pool import StatePool

PREFIX_NAMESPACE: Hashable = None  # the pool's radix namespace


class Binder:
    """Page movements of one pool. Not locked: the pool serialises calls."""

    def __init__(self, pages: PageAllocator, radix: RadixCache, table: BindingTable, kv: KvStore,
                 fresh_page_fill: str, states: list[StatePool]) -> None:
        self.pages, self.radix, self.table, self.kv = pages, radix, table, kv
        self.states = states  # the pool's attached state pools (the same list)
        self.page_size = radix.page_size
        self.fresh_page_fill = fresh_page_fill
        self.prefix_reuse = True
        self.prompt_tokens = 0  # cumulative counters, see KvCachePool.prefix_*_tokens
        self.match_tokens = 0
        self.insert_tokens = 0
        self.evict_tokens = 0

    # ------------------------------------------------------------------ planning (changes nothing)
    def available_pages(self) -> int:
        """Pages obtainable now: free plus evictable."""
        return self.pages.free_pages + self.radix.evictable_size // self.page_size

    def plan(self, prompt: np.ndarray, release: Sequence[Binding],
             reuse: bool = True) -> tuple[int, int]:
        """``(matched_len, available_pages)`` for binding ``prompt`` after releasing ``release``:
        the would-be match (Fix: capped at ``floor_page(len(prompt) - 1)``, never the last prompt
        token; none unless ``reuse``) and the free plus evictable pages once ``release`` is gone and
        that match is locked."""
        segments: list[PathSegment] = []
        if self.prefix_reuse and reuse and len(prompt) > 1:
            cap = floor_page(len(prompt) - 1, self.page_size)
            segments = self.restorable(self.radix.peek_prefix(prompt[:cap], PREFIX_NAMESPACE))
        freed = sum(len(b.private_pages(self.page_size)) for b in release if b.offload is None)
        evictable = self.radix.evictable_size_if([b.locked_node for b in release], segments)
        available = self.pages.free_pages + freed + evictable // self.page_size
        return sum(s.matched for s in segments), available

    def restorable(self, segments: list[PathSegment]) -> list[PathSegment]:
        """``segments`` (a would-be match) cut back to end at the deepest wholly matched node whose
        state snapshot every attached state pool holds; unchanged without state pools."""
        if not self.states:
            return segments
        end = 0
        for i, seg in enumerate(segments):
            if seg.matched < len(seg.node):
                break
            if all(states.has_snapshot(seg.node) for states in self.states):
                end = i + 1
        return segments[:end]

    def _adopt(self, b: Binding, node: TreeNode, length: int) -> None:
        """The tree now caches ``b``'s first ``length`` tokens, ending at ``node``: hand over its
        snapshots."""
        for states in self.states:
            states.adopt_snapshot(b.request_id, node, length)

    # ------------------------------------------------------------------ committing (as planned)
    def evict(self, num_tokens: int) -> int:
        """Evict at least ``num_tokens`` unlocked tree tokens (LRU) and free their pages (and the
        evicted nodes' state snapshots); returns tokens evicted."""
        slots = self.radix.evict(num_tokens)
        for states in self.states:
            states.drop_evicted_snapshots()
        self.pages.release(slots[:: self.page_size] // self.page_size)
        self.evict_tokens += len(slots)
        return len(slots)

    def take(self, n: int, owner: PageOwner, holder: int = NO_HOLDER,
             fill: bool = True) -> np.ndarray:
        """``n`` pages for ``owner``, evicting unlocked tree pages only as far as needed."""
        short = n - self.pages.free_pages
        if short > 0:
            self.evict(short * self.page_size)
        pages = self.pages.take(n, owner, holder)
        if fill:
            self.kv.fill_pages(pages, self.fresh_page_fill)
        return pages

    def bind(self, prompt: np.ndarray, capacity_pages: int, matched: int,
             exclusive: bool) -> Binding:
        """Match and lock ``prompt[:matched]`` (as planned), take the private pages, record the
        binding."""
        node = None
        prefix_pages = EMPTY
        if matched:
            match = self.radix.match_prefix(prompt[:matched], PREFIX_NAMESPACE)
            assert match.length == matched, "the planned match changed before it was committed"
            node = match.last_node
            self.radix.inc_lock_ref(node)
            prefix_pages = match.indices[:: self.page_size] // self.page_size
        if self.prefix_reuse:
            self.prompt_tokens += len(prompt)
            self.match_tokens += matched
        private = self.take(capacity_pages - len(prefix_pages), PageOwner.PRIVATE,
                            self.table.next_id)
        return self.table.add(np.concatenate([prefix_pages, private]),
                              capacity_pages * self.page_size, matched, prompt[:matched].copy(),
                              node, exclusive)

    def release(self, b: Binding, sequence: np.ndarray | None = None) -> None:
        """Unbind ``b``. With ``sequence`` (and reuse on, and ``b`` resident), first insert its
        written page-aligned prefix ``sequence[:floor_page(min(len, kv_len))]`` into the tree, which
        keeps the newly cached pages. Every other private page is freed; the prefix is unlocked."""
        ps = self.page_size
        if b.offload is None:
            private = b.private_pages(ps)
            keep_lo = keep_hi = 0  # range of ``private`` handed to the tree
            insert_len = 0
            if sequence is not None and self.prefix_reuse:
                insert_len = floor_page(min(len(sequence), self.table.kv_len_of(b)), ps)
            if insert_len > b.matched_len:
                assert sequence is not None
                slots = page_slots(b.page_ids[: insert_len // ps], ps)
                result = self.radix.insert(sequence[:insert_len], slots, PREFIX_NAMESPACE)
                assert result.prefix_len >= b.matched_len, "the locked prefix left the tree"
                keep_lo = (result.prefix_len - b.matched_len) // ps
                keep_hi = (insert_len - b.matched_len) // ps
                self.pages.transfer(private[keep_lo:keep_hi], PageOwner.TREE)
                self.insert_tokens += insert_len - result.prefix_len
                self._adopt(b, result.last_node, insert_len)
            self.pages.release(np.concatenate([private[:keep_lo], private[keep_hi:]]))
        self.radix.dec_lock_ref(b.locked_node)
        self.table.remove(b)
        b.offload = None

    def cache_prefix(self, b: Binding, sequence: np.ndarray) -> int:
        """Insert ``b``'s written, page-aligned prefix ``sequence[:floor_page(min(len, kv_len))]``
        into the tree while ``b`` stays bound (SGLang's ``cache_unfinished_req``), so later binds
        can match it. Newly inserted private pages become tree pages; private pages whose tokens the
        tree already held are swapped for the tree's pages in ``b``'s table (before they are freed)
        and freed; ``b`` locks the deeper node and its matched prefix grows. Returns the tokens
        newly inserted. Callers must drop any step that caches ``b``'s page table."""
        ps = self.page_size
        insert_len = floor_page(min(len(sequence), self.table.kv_len_of(b)), ps)
        if not self.prefix_reuse or b.offload is not None or insert_len <= b.matched_len:
            return 0
        n = insert_len // ps
        result = self.radix.insert(sequence[:insert_len], page_slots(b.page_ids[:n], ps),
                                   PREFIX_NAMESPACE)
        match = self.radix.match_prefix(sequence[:insert_len], PREFIX_NAMESPACE)
        assert match.length == insert_len, "the inserted prefix is not in the tree"
        canonical = match.indices[::ps] // ps
        old = b.page_ids[:n].copy()
        # [matched, dup_hi): the tree held these already
        dup_hi = max(result.prefix_len, b.matched_len) // ps
        duplicates = old[b.matched_len // ps : dup_hi]
        b.page_ids[:n] = canonical  # remap first, then free: the table never points at a freed page
        self.pages.transfer(old[dup_hi:n], PageOwner.TREE)
        self.pages.release(duplicates[duplicates != canonical[b.matched_len // ps : dup_hi]])
        self.radix.inc_lock_ref(match.last_node)
        self.radix.dec_lock_ref(b.locked_node)
        b.locked_node = match.last_node
        b.matched_len = insert_len
        self._adopt(b, match.last_node, insert_len)
        b.prefix_tokens = sequence[:insert_len].copy()
        added = insert_len - result.prefix_len
        self.insert_tokens += added
        return added

    def alloc(self, num_pages: int) -> np.ndarray:
        """Slot ids of ``num_pages`` whole pages handed to a caller (owner ``CALLER``), evicting
        unlocked tree pages as needed; the pool has checked that they fit."""
        return page_slots(self.take(num_pages, PageOwner.CALLER), self.page_size)

    def caller_pages_of(self, slots: np.ndarray) -> np.ndarray:
        """The page ids of ``slots`` if they are whole caller-owned pages, each as its slots in
        order, none twice; ValueError naming the first offender otherwise. Changes nothing."""
        ps = self.page_size
        if len(slots) % ps:
            raise ValueError(f"free() requires page-aligned slot count: got {len(slots)} slots, "
                             f"page_size {ps}")
        num_slots = self.pages.num_pages * ps
        if len(slots) and slots.max() >= num_slots:
            raise ValueError(f"free() got slot {int(slots.max())}, past the pool's {num_slots} "
                             f"slots")
        groups = slots.reshape(-1, ps)
        pages = groups[:, 0] // ps
        if not np.array_equal(groups.reshape(-1), page_slots(pages, ps)):
            raise ValueError("free() requires whole pages, each as its page_size slots in order "
                             "(as alloc returned)")
        if len(np.unique(pages)) != len(pages):
            raise ValueError(f"free() lists a page twice: pages {pages.tolist()}")
        bad = self.pages.misowned(pages, PageOwner.CALLER)
        if len(bad):
            owner = PageOwner(int(self.pages.owner[bad[0]])).name.lower()
            raise ValueError(f"free() of page {int(bad[0])}, which is {owner}, not owned by the "
                             f"caller (double free, or a page alloc() did not return)")
        return pages

    def free(self, pages: np.ndarray) -> None:
        """Return ``pages`` (already checked by the pool to be caller-owned, no duplicates) to the
        tail of the free list."""
        self.pages.release(pages)

    def grow(self, b: Binding, num_pages: int) -> None:
        """Append ``num_pages`` private pages to ``b``'s page table (evicting unlocked tree pages as
        needed, like any bind); its capacity grows by as many pages. The pool has checked that they
        fit."""
        pages = self.take(num_pages, PageOwner.PRIVATE, b.request_id)
        b.page_ids = np.concatenate([b.page_ids, pages])
        b.capacity += num_pages * self.page_size

    def offload(self, b: Binding) -> OffloadedKv:
        """Copy every private page of ``b`` (all layers, K and V, raw bytes) to host memory, free
        them, and mark ``b`` offloaded: its page table keeps only the tree-owned prefix pages."""
        private = b.private_pages(self.page_size)
        k_raw, v_raw = self.kv.copy_pages_out(private)
        handle = OffloadedKv(b.request_id, len(private), k_raw, v_raw)
        self.pages.release(private)
        b.page_ids = b.page_ids[: b.num_prefix_pages(self.page_size)].copy()
        b.offload = handle
        return handle

    def restore(self, b: Binding, handle: OffloadedKv) -> None:
        """Take ``handle.num_private_pages`` pages for ``b`` (evicting unlocked tree pages if
        needed, like any bind) and write the saved bytes back into them: byte-identical wherever
        they land."""
        pages = self.take(handle.num_private_pages, PageOwner.PRIVATE, b.request_id, fill=False)
        self.kv.copy_pages_in(pages, handle.k_raw, handle.v_raw)
        b.page_ids = np.concatenate([b.page_ids, pages])
        b.offload = None
