"""Whole-pool audits: ``check_invariants``, ``stats`` and ``digest``. They read the pool's parts
(the ``Binder`` with the pages, tree, bindings and state pools it moves, the active step, the
prefetch scratch pages) and change nothing.

Invariants checked (the first broken one raises KvCacheCorruptionError naming the page or node):
1. every page is claimed exactly once: by the free list, a live tree node, one binding's private
   pages, a caller (``alloc``) or pool scratch; the owner table agrees with the claims, so the
   counts add up to ``num_pages``;
2. tree values are whole pages in slot order, edges are page multiples, children are keyed by their
   first page;
3. every binding's prefix pages are exactly what the tree maps its ``prefix_tokens`` to, its private
   pages are its own, ``matched_len <= kv_len <= capacity``, and an offloaded binding holds no
   private page;
4. each node's ``lock_ref`` equals the number of bindings whose locked path runs through it, the
   evictable and protected sizes equal the unlocked and locked token counts, and the evictable-leaf
   set is exact;
5. the active step lists bound, resident requests whose page tables match their bindings;
6. scratch pages are exactly the prefetch state's.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from .errors import KvCacheCorruptionError
from .pages import NO_HOLDER, PageOwner, page_slots

if TYPE_CHECKING:
    from .binder import Binder
    from .radix import TreeNode
    from .step import ActiveStep

UNCLAIMED = -1


class _Claims:
    def __init__(self, num_pages: int) -> None:
        self.owner = np.full(num_pages, UNCLAIMED, dtype=np.int64)
        self.holder = np.full(num_pages, NO_HOLDER, dtype=np.int64)
        self.claim_id = np.full(num_pages, UNCLAIMED, dtype=np.int64)  # index into names
        self.names: list[str] = []

    def what(self, page: int) -> str:
        return self.names[int(self.claim_id[page])]

    def claim(self, pages: np.ndarray, owner: PageOwner, what: str,
              holder: int = NO_HOLDER) -> None:
        n = len(self.owner)
        out = pages[(pages < 0) | (pages >= n)]
        if len(out):
            raise KvCacheCorruptionError(f"page {int(out[0])} of {what} is outside the pool's {n} "
                                         f"pages")
        uniq, counts = np.unique(pages, return_counts=True)
        if (counts > 1).any():
            raise KvCacheCorruptionError(f"page {int(uniq[counts > 1][0])} appears twice in {what}")
        taken = pages[self.owner[pages] != UNCLAIMED]
        if len(taken):
            p = int(taken[0])
            raise KvCacheCorruptionError(f"page {p} is claimed by both {self.what(p)} and {what}")
        self.owner[pages] = owner
        self.holder[pages] = holder
        self.claim_id[pages] = len(self.names)
        self.names.append(what)


def _fail(msg: str) -> NoReturn:
    raise KvCacheCorruptionError(msg)


def _slots(node: TreeNode) -> np.ndarray:
    if node.value is None:
        _fail(f"{node!r} is evicted but still reachable from the root")
    return node.value


def check_invariants(binder: Binder, step: ActiveStep | None, scratch_pages: np.ndarray) -> None:
    """Audit a pool (``KvCachePool.check_invariants``) from its ``binder``, active ``step`` and
    prefetch ``scratch_pages``: every page is claimed exactly once (free list, tree, one binding's
    private pages, a caller, prefetch scratch), the tree's sizes and lock counts add up, every
    binding's page table and ``kv_len`` agree with it, and every attached state pool's slots agree
    with the bindings (``StatePool.check``). Raises ``KvCacheCorruptionError`` naming the first
    broken page, count or slot; changes nothing."""
    ps = binder.page_size
    pages, radix, table = binder.pages, binder.radix, binder.table
    claims = _Claims(pages.num_pages)
    claims.claim(pages.free_list(), PageOwner.FREE, "the free list")

    # 2. tree structure and tree-owned pages
    nodes = list(radix.nodes())
    for node in nodes:
        n_keys = len(node.key)
        if node.value is None or len(node.value) != n_keys or n_keys == 0 or n_keys % ps:
            _fail(f"{node!r} has a bad edge: {len(node.key)} tokens, value "
                  f"{None if node.value is None else len(node.value)} (page_size {ps})")
        groups = node.value.reshape(-1, ps)
        node_pages = groups[:, 0] // ps
        if not np.array_equal(node.value, page_slots(node_pages, ps)):
            _fail(f"{node!r} holds slots that are not whole pages in order: "
                  f"{node.value[:2 * ps].tolist()}")
        parent = node.parent
        child_key = radix._child_key(node.extra_key, node.key, 0)
        if parent is None or parent.children.get(child_key) is not node:
            _fail(f"{node!r} is not registered under its parent by its first page")
        claims.claim(node_pages, PageOwner.TREE, f"tree node {node.id}")

    # 3. bindings
    locks: Counter[int] = Counter()
    for b in table:
        # an offloaded binding keeps only its prefix
        held = b.matched_len if b.offload is not None else b.capacity
        if held != len(b.page_ids) * ps or b.matched_len % ps or b.matched_len > b.capacity:
            _fail(f"request {b.request_id}: capacity {b.capacity}, matched {b.matched_len}, "
                  f"{len(b.page_ids)} pages do not agree (page_size {ps})")
        kv_len = table.kv_len_of(b)
        if not b.matched_len <= kv_len <= b.capacity:
            _fail(f"request {b.request_id}: kv_len {kv_len} outside [matched {b.matched_len}, "
                  f"capacity {b.capacity}]")
        prefix = b.page_ids[: b.matched_len // ps]
        segments = radix.peek_prefix(b.prefix_tokens)
        tree_slots = np.concatenate([_slots(s.node)[: s.matched] for s in segments]
                                    or [np.zeros(0, np.int64)])
        if sum(s.matched for s in segments) != b.matched_len \
                or not np.array_equal(tree_slots[::ps] // ps, prefix):
            _fail(f"request {b.request_id}: its {len(prefix)} prefix pages are not what the tree "
                  f"maps its prefix to")
        claims.claim(b.private_pages(ps), PageOwner.PRIVATE, f"request {b.request_id}",
                     b.request_id)
        locked = b.locked_node
        if (locked is None) != (b.matched_len == 0):
            _fail(f"request {b.request_id}: matched {b.matched_len} tokens but locked node is "
                  f"{locked!r}")
        while locked is not None and locked is not radix.root:
            locks[locked.id] += 1
            locked = locked.parent

    # 1. scratch pages belong to the prefetch state; caller pages are recorded only in the owner
    # table
    claims.claim(scratch_pages, PageOwner.SCRATCH, "prefetch scratch")
    loose = np.flatnonzero((pages.owner == PageOwner.CALLER) & (claims.owner == UNCLAIMED))
    claims.claim(loose, PageOwner.CALLER, "a caller (alloc)")
    unclaimed = np.flatnonzero(claims.owner == UNCLAIMED)
    if len(unclaimed):
        p = int(unclaimed[0])
        _fail(f"page {p} is marked {PageOwner(int(pages.owner[p])).name.lower()} but nobody holds "
              f"it (leaked)")
    wrong = np.flatnonzero((claims.owner != pages.owner) | (claims.holder != pages.holder))
    if len(wrong):
        p = int(wrong[0])
        _fail(f"page {p} is held by {claims.what(p)} but the owner table says "
              f"{PageOwner(int(pages.owner[p])).name.lower()} (holder {int(pages.holder[p])})")

    # 4. locks and sizes
    evictable = protected = 0
    leaves = set()
    for node in nodes:
        if node.lock_ref != locks[node.id]:
            _fail(f"{node!r} has lock_ref {node.lock_ref} but {locks[node.id]} bindings lock it")
        if node.lock_ref:
            protected += len(node.key)
        else:
            evictable += len(node.key)
            if not node.children:
                leaves.add(node)
    if (evictable, protected) != (radix.evictable_size, radix.protected_size):
        _fail(f"tree sizes say evictable {radix.evictable_size}, protected "
              f"{radix.protected_size}; nodes hold {evictable} unlocked and {protected} locked "
              f"tokens")
    if leaves != radix._evictable_leaves:
        odd = next(iter(leaves ^ radix._evictable_leaves))
        where = "missing from" if odd in leaves else "in"
        _fail(f"{odd!r} is wrongly {where} the evictable-leaf set")

    # 5. active step
    if step is not None:
        for row, sb in enumerate(step.bindings):
            if table.get(sb.request_id) is not sb or sb.offload is not None:
                _fail(f"active step row {sb.request_id} is unbound or offloaded")
            if not np.array_equal(step.page_table[row, : len(sb.page_ids)], sb.page_ids):
                _fail(f"active step row {sb.request_id} has a stale page table")

    # 6. a packed pool's tails: only private pages hold one, every tree page is quantized, and
    # each resident row's partial last page keeps its raw values
    kv = binder.kv
    if kv.packed:
        problem = kv.tails.check()
        if problem is not None:
            _fail(f"the tail table is inconsistent: {problem}")
        tailed = np.flatnonzero(kv.tails.tail_of >= 0)
        odd = tailed[pages.owner[tailed] != PageOwner.PRIVATE]
        if len(odd):
            _fail(f"page {int(odd[0])} holds a tail but is "
                  f"{PageOwner(int(pages.owner[odd[0]])).name.lower()}")
        tree = np.flatnonzero(pages.owner == PageOwner.TREE)
        stale = tree[~kv.packed_valid[tree]]
        if len(stale):
            _fail(f"tree page {int(stale[0])} is not quantized")
        for b in table:
            kv_len = table.kv_len_of(b)
            if b.offload is None and kv_len % ps and kv_len > b.matched_len:
                page = int(b.page_ids[kv_len // ps])
                if kv.tails.tail_of[page] < 0:
                    _fail(f"request {b.request_id}: its last page {page} (kv_len {kv_len}) is "
                          f"partly written but keeps no raw values")

    # the state pools beside the KV
    for states in binder.states:
        states.check([b.request_id for b in table if b.offload is None],
                     [b.request_id for b in table if b.offload is not None])


def stats(binder: Binder, step: ActiveStep | None) -> dict[str, int | float]:
    """A snapshot of a pool (``KvCachePool.stats``) from its ``binder`` and active ``step``: pages
    by owner (``free_pages``, ``tree_pages``, ``private_pages``, ``caller_pages``,
    ``scratch_pages``), bound/offloaded requests, the active batch, the tree's
    cached/evictable/protected tokens, the cumulative prefix counters and ``prefix_hit_rate`` (match
    / prompt tokens, 0.0 before any bind), and with state pools attached ``state_snapshots``
    (snapshots held for tree nodes) and ``state_snapshot_capacity``. Changes nothing."""
    pages, radix, table, states = binder.pages, binder.radix, binder.table, binder.states
    prompt, match = binder.prompt_tokens, binder.match_tokens
    snapshots = {"state_snapshots": sum(s.snapshots.cached_count for s in states),
                 "state_snapshot_capacity": sum(s.snapshot_capacity for s in states)}
    return {
        "num_pages": pages.num_pages,
        "page_size": binder.page_size,
        "free_pages": pages.free_pages,
        "tree_pages": pages.count(PageOwner.TREE),
        "private_pages": pages.count(PageOwner.PRIVATE),
        "caller_pages": pages.count(PageOwner.CALLER),
        "scratch_pages": pages.count(PageOwner.SCRATCH),
        "bound_requests": len(table),
        "offloaded_requests": sum(1 for b in table if b.offload is not None),
        "active_batch": step.batch if step is not None else 0,
        "cached_tokens": radix.total_size(),
        "evictable_tokens": radix.evictable_size,
        "protected_tokens": radix.protected_size,
        "prefix_prompt_tokens": prompt,
        "prefix_match_tokens": match,
        "prefix_insert_tokens": binder.insert_tokens,
        "prefix_evict_tokens": binder.evict_tokens,
        "prefix_hit_rate": match / prompt if prompt else 0.0,
        **(snapshots if states else {}),
    }


def digest(binder: Binder, step: ActiveStep | None) -> str:
    """``KvCachePool.state_digest``: sha256 over the decisions of a pool (see there), from its
    ``binder`` and active ``step``. Changes nothing."""
    import hashlib

    h = hashlib.sha256()

    def put(*parts: np.ndarray | list[int] | bytes) -> None:
        for part in parts:
            raw = part if isinstance(part, bytes) else np.asarray(part, dtype=np.int64).tobytes()
            h.update(raw)
            h.update(b"|")

    pages, table, radix = binder.pages, binder.table, binder.radix
    put(pages.free_list(), pages.owner.astype(np.int64), pages.holder)
    for b in table:
        put([b.request_id, b.capacity, b.matched_len, table.kv_len_of(b),
             int(b.offload is not None), int(b.exclusive)], b.page_ids, b.prefix_tokens)
    nodes = sorted(radix.nodes(), key=lambda n: (n.key.tobytes(), len(n.key)))
    for n in nodes:
        assert n.value is not None
        depth = 0
        p = n.parent
        while p is not None and p is not radix.root:
            depth += len(p.key)
            p = p.parent
        put([depth, n.lock_ref], n.key, n.value)
    put(list(step.ids) if step is not None else [])
    for states in binder.states:
        put(sorted(states.bound_ids), [states.slot(r) for r in sorted(states.bound_ids)])
    return h.hexdigest()
