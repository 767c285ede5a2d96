"""``smile.llm.cache.RadixCache.Backend`` over a Python ``RadixCache``: one adapter, reaching its
tree through one of two accesses: ``Standalone`` (``new RadixCache(pageSize)`` in Java: every verb)
and ``PoolTree`` (``pool.radix()``: queries and matches under the pool's lock; mutations refused,
since the pool owns the tree's pages).

Node handles: Java sees a node as ``RadixTreeNode(id, tree)``. The adapter remembers the nodes it
handed out by id and resolves a handle through that map, so a handle of another tree is unknown
here, and a handle of an evicted node or of one from before ``reset`` is refused by the Python
tree's liveness check; both are ValueError (IllegalArgumentException). ``TreeNode`` has
``__slots__`` without ``__weakref__``, so the map holds nodes strongly and drops dead ones (evicted,
or detached by ``reset``) whenever it has doubled since the last sweep.
"""

from __future__ import annotations

import threading
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import numpy as np
from jpype import JArray, JClass, JImplements, JInt, JLong

from smile_llm.cache import KvCachePool, RadixCache, TreeNode

from ..errors import bridged
from .convert import checked_int, int_array

_MIN_SWEEP = 1024


class TreeAccess(Protocol):
    """How an adapter reaches its tree: the tree, the lock held around a verb, and whether it may be
    mutated."""

    def tree(self) -> RadixCache: ...

    def guard(self) -> AbstractContextManager[Any]: ...

    def check_mutable(self, verb: str) -> None: ...


class Standalone:
    """A tree of its own (``new RadixCache(pageSize)``): the tree's own lock suffices; every verb is
    allowed."""

    def __init__(self, tree: RadixCache) -> None:
        self._tree = tree

    def tree(self) -> RadixCache:
        return self._tree

    def guard(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def check_mutable(self, verb: str) -> None:
        return None


_POOL_VERBS = {
    "insert": "finishRequest inserts a request's written KV",
    "evict": "pool.evict(numTokens) evicts and frees the pages",
    "incLockRef": "bindRequest/bindWithPrefix lock a request's match",
    "decLockRef": "unbindRequest/finishRequest unlock it",
    "reset": "pool.evict(pool.radix().totalSize()) evicts every unlocked node",
}


class PoolTree:
    """A pool's own tree: reached through ``pool.radix`` (IllegalStateException once the pool is
    closed), verbs run under the pool's lock so a match never splits a node between a bind's plan
    and its commit, and mutations raise RuntimeError (the tree holds the pool's pages: inserting,
    evicting, locking or resetting it here would leak or corrupt them)."""

    def __init__(self, pool: KvCachePool) -> None:
        self._pool = pool

    def tree(self) -> RadixCache:
        return self._pool.radix

    def guard(self) -> AbstractContextManager[Any]:
        # The pool offers no public verb that matches and returns the node, so the adapter holds its
        # lock (an RLock: the pool's own properties re-enter it).
        return self._pool._lock  # noqa: SLF001

    def check_mutable(self, verb: str) -> None:
        raise RuntimeError(f"RadixCache.{verb} on a KvCachePool's own tree would leak or corrupt "
                           f"the pool's pages; use the pool's methods ({_POOL_VERBS[verb]}), or a "
                           "standalone new RadixCache(pageSize)")


def _namespace(extra_key: Any) -> str | None:
    """A Java ``String extraKey`` (null: the default namespace) as a Python str, so namespaces
    compare by value."""
    return None if extra_key is None else str(extra_key)


def is_live(node: TreeNode, tree: RadixCache) -> bool:
    """True while ``node`` is in ``tree``: not evicted, and its parent chain ends at the tree's
    current root."""
    if node.evicted:
        return False
    n = node
    while n.parent is not None:
        n = n.parent
    return n is tree.root


@JImplements("smile.llm.cache.RadixCache$Backend", deferred=True)
@bridged
class RadixCacheAdapter:
    """``smile.llm.cache.RadixCache.Backend`` over the tree ``access`` reaches (``Standalone`` or
    ``PoolTree``)."""

    def __init__(self, access: TreeAccess) -> None:
        self._access = access
        self._nodes: dict[int, TreeNode] = {}  # handed-out handles by node id
        self._nodes_lock = threading.Lock()
        self._sweep_at = _MIN_SWEEP

    # ------------------------------------------------------------------ node handles
    def _handle(self, node: TreeNode, tree: RadixCache) -> Any:
        with self._nodes_lock:
            self._nodes[node.id] = node
            if len(self._nodes) >= self._sweep_at:
                self._nodes = {i: n for i, n in self._nodes.items() if is_live(n, tree)}
                self._sweep_at = max(_MIN_SWEEP, 2 * len(self._nodes))
        return JClass("smile.llm.cache.RadixTreeNode")(JLong(node.id), self)

    def _lookup(self, handle: Any) -> TreeNode | None:
        with self._nodes_lock:
            return self._nodes.get(int(handle.id))

    def _resolve(self, handle: Any, verb: str) -> TreeNode | None:
        if handle is None:
            return None
        node = self._lookup(handle)
        if node is None:
            raise ValueError(f"{verb}({handle}): not a node of this RadixCache (a handle of "
                             "another tree, or of a node evicted or reset since); match the prefix "
                             "again")
        return node

    # ------------------------------------------------------------------ Backend
    def matchPrefix(self, tokens: Any, extra_key: Any) -> Any:  # noqa: N802 - Java names
        """Java ``MatchResult matchPrefix(int[] tokenIds, String extraKey)``:
        ``RadixCache.match_prefix`` (splits a node where the match ends inside it, refreshes LRU
        times). IllegalArgumentException for null or negative tokens."""
        if tokens is None:
            raise ValueError("tokenIds must not be null")
        with self._access.guard():
            tree = self._access.tree()
            m = tree.match_prefix(int_array(tokens), _namespace(extra_key))
            slots = JClass("smile.deep.tensor.Tensor").of(JArray(JLong)(m.indices.astype(np.int64)))
            return JClass("smile.llm.cache.MatchResult")(slots, self._handle(m.last_node, tree))

    def insert(self, tokens: Any, kv_indices: Any, extra_key: Any, priority: int) -> Any:
        """Java ``InsertResult insert(int[] tokenIds, long[] kvIndices, String extraKey, int
        priority)``: ``RadixCache.insert``. IllegalArgumentException for null arrays or too few
        ``kvIndices``; IllegalStateException on a pool's tree."""
        self._access.check_mutable("insert")
        if tokens is None or kv_indices is None:
            raise ValueError("tokenIds and kvIndices must not be null")
        with self._access.guard():
            tree = self._access.tree()
            r = tree.insert(int_array(tokens), int_array(kv_indices), _namespace(extra_key),
                            int(priority))
            return JClass("smile.llm.cache.InsertResult")(JInt(r.prefix_len),
                                                          self._handle(r.last_node, tree))

    def evict(self, num_tokens: int) -> np.ndarray:
        """Java ``long[] evict(int numTokens)``: the evicted slot ids (LRU leaves, cascading); the
        caller frees them. IllegalArgumentException for a negative count; IllegalStateException on a
        pool's tree."""
        self._access.check_mutable("evict")
        with self._access.guard():
            return np.asarray(self._access.tree().evict(int(num_tokens)), dtype=np.int64)

    def incLockRef(self, handle: Any) -> int:  # noqa: N802
        """Java ``int incLockRef(RadixTreeNode node)``: the change of ``evictableSize`` (<= 0); null
        or the root: 0. IllegalArgumentException for a stale or foreign handle;
        IllegalStateException on a pool's tree."""
        self._access.check_mutable("incLockRef")
        with self._access.guard():
            tree = self._access.tree()
            return checked_int(tree.inc_lock_ref(self._resolve(handle, "incLockRef")), "incLockRef")

    def decLockRef(self, handle: Any) -> int:  # noqa: N802
        """Java ``int decLockRef(RadixTreeNode node)``: the change of ``evictableSize`` (>= 0).
        IllegalStateException if the path is not locked or on a pool's tree;
        IllegalArgumentException for a stale or foreign handle."""
        self._access.check_mutable("decLockRef")
        with self._access.guard():
            tree = self._access.tree()
            return checked_int(tree.dec_lock_ref(self._resolve(handle, "decLockRef")), "decLockRef")

    def isEvicted(self, handle: Any) -> bool:  # noqa: N802
        """Java ``RadixTreeNode.isEvicted()``: true once the node left the tree (evicted, or dropped
        by ``reset``)."""
        with self._access.guard():
            node = None if handle is None else self._lookup(handle)
            return node is None or not is_live(node, self._access.tree())

    def reset(self) -> None:
        """Java ``reset()``: drop every node (handles go stale). IllegalStateException on a pool's
        tree."""
        self._access.check_mutable("reset")
        with self._access.guard():
            self._access.tree().reset()
            with self._nodes_lock:
                self._nodes.clear()
                self._sweep_at = _MIN_SWEEP

    def totalSize(self) -> int:  # noqa: N802
        """Java ``totalSize()``: cached tokens."""
        return checked_int(self._access.tree().total_size(), "totalSize")

    def evictableSize(self) -> int:  # noqa: N802
        """Java ``evictableSize()``: cached tokens in unlocked nodes."""
        return checked_int(self._access.tree().evictable_size, "evictableSize")

    def protectedSize(self) -> int:  # noqa: N802
        """Java ``protectedSize()``: cached tokens in locked nodes."""
        return checked_int(self._access.tree().protected_size, "protectedSize")

    def pageSize(self) -> int:  # noqa: N802
        """Java ``pageSize()``."""
        return checked_int(self._access.tree().page_size, "pageSize")

    def pretty(self) -> str:
        """Java ``pretty()`` (behind ``prettyPrint()``): ``RadixCache.pretty``."""
        return self._access.tree().pretty()

    def root(self) -> Any:
        """Java ``RadixTreeNode root()``: the handle of the tree's current root."""
        with self._access.guard():
            tree = self._access.tree()
            return self._handle(tree.root, tree)
