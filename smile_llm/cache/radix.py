"""RadixCache: a page-granular compressed prefix tree from token prefixes to KV slot ids.

The tree is a pure index. It maps tokens to slot ids, counts locks and keeps LRU order; it never
touches K/V and never frees anything: ``evict`` returns the evicted slot ids and the owner of the
pages (the pool) frees them.

Structure:
- every non-root edge holds a multiple of ``page_size`` tokens (``key``) and as many slot ids
  (``value``);
- children are keyed by ``(extra_key, bytes of the edge's first page)``, so a child is found in O(1)
  per page and namespaces (``extra_key``) never share nodes;
- ``lock_ref`` counts are held along whole paths (root excluded; the root is permanently locked), so
  a node is locked whenever any descendant is, and every unlocked node can be reached by cascading
  leaf eviction;
- ``evictable_size`` counts tokens in unlocked nodes, ``protected_size`` tokens in locked nodes.

LRU order uses a logical clock (one tick per match or insert), so equal-time ties cannot make
eviction order depend on timer resolution.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from .prefix_hash import seed_hash, chain
from .tokens import EMPTY, as_int_array

_node_ids = itertools.count()


class TreeNode:
    """One edge of the tree. ``value is None`` means evicted (a detached node)."""

    __slots__ = (
        "id",
        "children",
        "parent",
        "key",
        "value",
        "extra_key",
        "lock_ref",
        "last_access_time",
        "creation_time",
        "hit_count",
        "priority",
        "hash_memo",
    )

    def __init__(self, parent: TreeNode | None, key: np.ndarray, value: np.ndarray | None,
                 extra_key: Hashable, tick: int, priority: int = 0) -> None:
        self.id = next(_node_ids)
        self.children: dict[tuple[Hashable, bytes], TreeNode] = {}
        self.parent = parent
        self.key = key  # int64[n] tokens of this edge
        self.value = value  # int64[n] slot ids, or None once evicted
        self.extra_key = extra_key
        self.lock_ref = 0
        self.last_access_time = tick
        self.creation_time = tick
        self.hit_count = 0
        self.priority = priority
        # page_prefix_hashes' memo: (hash before the edge, its length, its pages' hashes, the last)
        self.hash_memo: tuple[bytes, int, list[int], bytes] | None = None

    @property
    def evicted(self) -> bool:
        """True once the node was evicted (detached from the tree; ``value`` is None)."""
        return self.value is None

    def __len__(self) -> int:
        return len(self.key)

    def __repr__(self) -> str:
        head = self.key[:8].tolist()
        more = "..." if len(self.key) > 8 else ""
        return (f"TreeNode(id={self.id}, len={len(self.key)}, key={head}{more}, "
                f"lock_ref={self.lock_ref})")


@dataclass(frozen=True)
class MatchResult:
    """``indices``: int64 slot ids of the longest cached page-aligned prefix (empty on a miss);
    ``last_node``: the deepest node reached (the root on a miss), what callers lock."""

    indices: np.ndarray
    last_node: TreeNode

    @property
    def length(self) -> int:
        """Matched tokens (``len(indices)``), a multiple of the tree's page size."""
        return len(self.indices)


@dataclass(frozen=True)
class InsertResult:
    """``prefix_len``: leading tokens already cached before the insert (the caller frees its
    duplicate slots for them); ``last_node``: the node that ends the inserted sequence."""

    prefix_len: int
    last_node: TreeNode


@dataclass(frozen=True)
class PathSegment:
    """Part of a would-be match: ``matched`` leading tokens of ``node`` (all of it unless the match
    ends inside)."""

    node: TreeNode
    matched: int


class RadixCache:
    """Prefix tree over tokens, page-granular. Thread-safe: every public method runs under one
    internal lock.

    A pure index from token prefixes to slot ids: it never frees anything (``KvCachePool`` owns the
    pages).

    >>> tree = RadixCache(page_size=2)
    >>> tree.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14]).prefix_len   # only whole pages: 4 tokens
    0
    >>> len(tree), tree.evictable_size
    (4, 4)
    >>> # the match ends inside page [3, 4]: truncated to [1, 2]
    >>> m = tree.match_prefix([1, 2, 3, 9])
    >>> m.indices.tolist(), m.length
    ([10, 11], 2)
    >>> tree.match_prefix([1, 2, 3, 4, 6]).indices.tolist()
    [10, 11, 12, 13]
    >>> # [1, 2] was cached: slots 20, 21 are duplicates
    >>> tree.insert([1, 2, 7, 8], [20, 21, 22, 23]).prefix_len
    2
    >>> tree.evict(2).tolist(), len(tree)        # LRU over unlocked leaves
    ([12, 13], 4)
    """

    def __init__(self, page_size: int = 1) -> None:
        if not isinstance(page_size, (int, np.integer)) or isinstance(page_size, bool) \
                or page_size < 1:
            raise ValueError(f"page_size must be an int >= 1, got {page_size!r}")
        self.page_size = int(page_size)
        self._lock = threading.RLock()
        self._clock = 0
        self.reset()

    # ------------------------------------------------------------------ state
    def reset(self) -> None:
        """Drop every node. The caller owns whatever pages the old tree indexed."""
        with self._lock:
            self.root = TreeNode(None, EMPTY, EMPTY, None, self._clock, priority=-(2**31))
            self.root.lock_ref = 1
            self._evictable_size = 0
            self._protected_size = 0
            self._evictable_leaves: set[TreeNode] = set()

    @property
    def evictable_size(self) -> int:
        """Tokens held by unlocked nodes (what ``evict`` can reclaim)."""
        return self._evictable_size

    @property
    def protected_size(self) -> int:
        """Tokens held by locked nodes."""
        return self._protected_size

    def total_size(self) -> int:
        """Cached tokens (live nodes)."""
        return self._evictable_size + self._protected_size

    def __len__(self) -> int:
        return self.total_size()

    # ------------------------------------------------------------------ helpers
    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    def _aligned(self, n: int) -> int:
        return (n // self.page_size) * self.page_size

    @staticmethod
    def _check_namespace(extra_key: Hashable) -> None:
        try:
            hash(extra_key)
        except TypeError:
            raise ValueError(f"extra_key must be hashable (e.g. a str or a tuple like ('lora', "
                             f"name)), got {type(extra_key).__name__}") from None

    def _child_key(self, extra_key: Hashable, tokens: np.ndarray,
                   offset: int) -> tuple[Hashable, bytes]:
        return (extra_key, tokens[offset : offset + self.page_size].tobytes())

    def _match_len(self, key: np.ndarray, tokens: np.ndarray, offset: int) -> int:
        """Page-aligned count of equal leading tokens of ``key`` and ``tokens[offset:]`` (vectorised
        compare)."""
        n = min(len(key), len(tokens) - offset)
        diff = np.flatnonzero(key[:n] != tokens[offset : offset + n])
        equal = int(diff[0]) if len(diff) else n
        return self._aligned(equal)

    def _update_leaf_status(self, node: TreeNode) -> None:
        if node is not self.root and not node.evicted and node.lock_ref == 0 and not node.children:
            self._evictable_leaves.add(node)
        else:
            self._evictable_leaves.discard(node)

    def _split(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut ``child``'s edge after ``split_len`` tokens; the new prefix node takes its place
        under the parent. Sizes, locks and the token-to-slot mapping are unchanged."""
        assert child.value is not None and 0 < split_len < len(child.key)
        parent = child.parent
        assert parent is not None
        prefix = TreeNode(parent, child.key[:split_len], child.value[:split_len], child.extra_key,
                          child.last_access_time, child.priority)
        prefix.lock_ref = child.lock_ref
        prefix.hit_count = child.hit_count
        prefix.creation_time = child.creation_time
        parent.children[self._child_key(child.extra_key, child.key, 0)] = prefix
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        child.parent = prefix
        prefix.children[self._child_key(child.extra_key, child.key, 0)] = child
        self._update_leaf_status(prefix)
        return prefix

    def _walk(self, tokens: np.ndarray, extra_key: Hashable) -> list[PathSegment]:
        """The would-be match of ``tokens`` (already page-aligned), without splitting or touching
        anything."""
        segments: list[PathSegment] = []
        node, offset = self.root, 0
        while offset < len(tokens):
            child = node.children.get(self._child_key(extra_key, tokens, offset))
            if child is None:
                break
            matched = self._match_len(child.key, tokens, offset)
            if matched == 0:
                break
            segments.append(PathSegment(child, matched))
            if matched < len(child.key):
                break
            node, offset = child, offset + matched
        return segments

    # ------------------------------------------------------------------ public verbs
    def match_prefix(self, tokens: Iterable[int], extra_key: Hashable = None) -> MatchResult:
        """Longest cached prefix of ``tokens`` under ``extra_key``, truncated to whole pages.

        Splits a node when the match ends inside its edge and refreshes LRU times along the path. A
        miss returns empty indices and the root. Raises ValueError for tokens that are not
        non-negative ints."""
        toks = as_int_array(tokens, "tokens")
        self._check_namespace(extra_key)
        with self._lock:
            toks = toks[: self._aligned(len(toks))]
            if len(toks) == 0:
                return MatchResult(EMPTY, self.root)
            now = self._tick()
            self.root.last_access_time = now
            chunks: list[np.ndarray] = []
            node = self.root
            for seg in self._walk(toks, extra_key):
                child = seg.node
                child.last_access_time = now
                if seg.matched < len(child.key):
                    child = self._split(child, seg.matched)
                assert child.value is not None
                chunks.append(child.value)
                node = child
            indices = np.concatenate(chunks) if chunks else EMPTY
            return MatchResult(indices, node)

    def peek_prefix(self, tokens: Iterable[int], extra_key: Hashable = None) -> list[PathSegment]:
        """The path ``match_prefix`` would take, as segments, changing nothing (no split, no LRU
        touch)."""
        toks = as_int_array(tokens, "tokens")
        self._check_namespace(extra_key)
        with self._lock:
            return self._walk(toks[: self._aligned(len(toks))], extra_key)

    def insert(
        self,
        tokens: Iterable[int],
        kv_indices: Iterable[int],
        extra_key: Hashable = None,
        priority: int = 0,
    ) -> InsertResult:
        """Insert the page-aligned part of ``tokens`` with its slot ids ``kv_indices[:aligned]``.

        ``prefix_len`` of the result counts leading tokens that were already cached: their entries
        of ``kv_indices`` are duplicates the caller frees; the tree takes ownership of the rest.
        ``priority`` is recorded (max along the path) but does not change eviction order. Raises
        ValueError when ``kv_indices`` is shorter than the aligned token count or either array is
        not non-negative ints."""
        toks = as_int_array(tokens, "tokens")
        kv = as_int_array(kv_indices, "kv_indices")
        self._check_namespace(extra_key)
        if isinstance(priority, bool) or not isinstance(priority, (int, np.integer)):
            raise ValueError(f"priority must be an int, got {type(priority).__name__} {priority!r}")
        priority = int(priority)
        with self._lock:
            aligned = self._aligned(len(toks))
            if len(kv) < aligned:
                raise ValueError(
                    f"insert got {len(kv)} kv_indices for {aligned} page-aligned tokens; pass one "
                    f"slot per token"
                )
            if aligned == 0:
                return InsertResult(0, self.root)
            toks = toks[:aligned]
            now = self._tick()
            self.root.last_access_time = now
            self.root.priority = max(self.root.priority, priority)
            node, offset = self.root, 0
            while offset < aligned:
                child = node.children.get(self._child_key(extra_key, toks, offset))
                if child is None:
                    break
                child.last_access_time = now
                matched = self._match_len(child.key, toks, offset)
                diverged = matched < len(child.key)
                if diverged:
                    child = self._split(child, matched)
                child.priority = max(child.priority, priority)
                child.hit_count += 1
                node, offset = child, offset + matched
                # the next page differs (or the tokens ran out): the rest becomes a new leaf
                if diverged:
                    break
            prefix_len = offset
            if offset < aligned:
                leaf = TreeNode(node, toks[offset:].copy(), kv[offset:aligned].copy(), extra_key,
                                now, priority)
                leaf.hit_count = 1
                node.children[self._child_key(extra_key, leaf.key, 0)] = leaf
                self._evictable_size += len(leaf.key)
                self._update_leaf_status(node)
                self._update_leaf_status(leaf)
                node = leaf
            return InsertResult(prefix_len, node)

    def evict(self, num_tokens: int) -> np.ndarray:
        """Evict least-recently-used unlocked leaves until ``num_tokens`` tokens are gone or none
        are left, cascading to parents that become unlocked leaves. Returns the evicted slot ids
        (int64); the caller frees them. Whole nodes are evicted, so more than ``num_tokens`` may
        come back."""
        if not isinstance(num_tokens, (int, np.integer)) or isinstance(num_tokens, bool) \
                or num_tokens < 0:
            raise ValueError(f"evict needs a token count >= 0, got {num_tokens!r}")
        with self._lock:
            heap = [(n.last_access_time, n.id, n) for n in self._evictable_leaves]
            heapq.heapify(heap)
            freed: list[np.ndarray] = []
            num_evicted = 0
            while num_evicted < num_tokens and heap:
                _, _, leaf = heapq.heappop(heap)
                if leaf.evicted:
                    continue
                parent = leaf.parent
                assert parent is not None and leaf.value is not None
                del parent.children[self._child_key(leaf.extra_key, leaf.key, 0)]
                self._evictable_size -= len(leaf.key)
                self._evictable_leaves.discard(leaf)
                freed.append(leaf.value)
                num_evicted += len(leaf.key)
                leaf.value = None
                self._update_leaf_status(parent)
                if parent is not self.root and not parent.children and parent.lock_ref == 0:
                    heapq.heappush(heap, (parent.last_access_time, parent.id, parent))
            return np.concatenate(freed) if freed else EMPTY

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        """Lock the path from ``node`` to the root (root excluded). Returns the change of
        ``evictable_size`` (<= 0). ``None`` or the root is a no-op. Raises ValueError for an evicted
        node."""
        if node is None:
            return 0
        with self._lock:
            self._check_live(node, "inc_lock_ref")
            delta = 0
            while node is not self.root:
                assert node is not None
                if node.lock_ref == 0:
                    self._evictable_size -= len(node.key)
                    self._protected_size += len(node.key)
                    delta -= len(node.key)
                node.lock_ref += 1
                self._update_leaf_status(node)
                node = node.parent
            return delta

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        """Undo one ``inc_lock_ref(node)``. Returns the change of ``evictable_size`` (>= 0). Raises
        RuntimeError, changing nothing, if any node on the path is not locked (a count never goes
        below zero)."""
        if node is None:
            return 0
        with self._lock:
            self._check_live(node, "dec_lock_ref")
            path = list(self._path_to_root(node))
            unlocked = [n for n in path if n.lock_ref < 1]
            if unlocked:
                raise RuntimeError(
                    f"dec_lock_ref on {unlocked[0]!r}, which is not locked; every dec_lock_ref "
                    f"must pair an inc_lock_ref on the same node"
                )
            delta = 0
            for n in path:
                if n.lock_ref == 1:
                    self._evictable_size += len(n.key)
                    self._protected_size -= len(n.key)
                    delta += len(n.key)
                n.lock_ref -= 1
                self._update_leaf_status(n)
            return delta

    def _check_live(self, node: TreeNode, verb: str) -> None:
        """ValueError unless ``node`` is a live node of this tree (not evicted, not from before a
        ``reset`` or from another cache): its parent chain must end at this root."""
        if node.evicted:
            raise ValueError(f"{verb}({node!r}): the node was evicted; match the prefix again")
        n: TreeNode | None = node
        while n is not None and n is not self.root:
            n = n.parent
        if n is None:
            raise ValueError(f"{verb}({node!r}): the node is not in this tree (another cache, or "
                             f"before reset())")

    def _path_to_root(self, node: TreeNode) -> Iterator[TreeNode]:
        while node is not self.root:
            yield node
            assert node.parent is not None
            node = node.parent

    def evictable_size_if(self, unlock: Iterable[TreeNode | None], lock: list[PathSegment]) -> int:
        """What ``evictable_size`` would be after one ``dec_lock_ref`` per node in ``unlock`` and
        locking the would-be match ``lock`` (from ``peek_prefix``), changing nothing. The pool plans
        binds with it so a bind that cannot be satisfied never touches the tree."""
        with self._lock:
            released: dict[TreeNode, int] = {}
            for node in unlock:
                if node is None:
                    continue
                for n in self._path_to_root(node):
                    released[n] = released.get(n, 0) + 1
            ours = {seg.node: seg.matched for seg in lock}
            result = self._evictable_size
            for n in set(released) | set(ours):
                before = len(n.key) if n.lock_ref > 0 else 0
                others = n.lock_ref - released.get(n, 0)
                after = len(n.key) if others > 0 else ours.get(n, 0)
                result += before - after
            return result

    def nodes(self) -> Iterator[TreeNode]:
        """Every live node except the root, parents before children."""
        with self._lock:
            stack = list(self.root.children.values())
            out = []
            while stack:
                n = stack.pop()
                out.append(n)
                stack.extend(n.children.values())
        return iter(out)

    def page_prefix_hashes(self, under: Iterable[int] | None = None, extra_key: Hashable = None,
                           limit: int | None = None) -> frozenset[int]:
        """The ``prefix_hash.page_hashes`` of every page-aligned prefix the tree holds now (live
        nodes only): a replica's summary of what it has cached, as fresh as the tree. With
        ``under`` (tokens in namespace ``extra_key``): only the prefixes on the path the tree
        matches of ``under`` and those that extend it (the node the match ends in and its
        subtree), e.g. what one conversation's turn left cached. ``limit``: at most that many
        hashes (parents before children)."""
        out: dict[int, None] = {}  # (ordered: parents before children)
        ps = self.page_size
        with self._lock:
            if under is None:
                stack = [(child, seed_hash(child.extra_key), EMPTY)
                         for child in self.root.children.values()]
            else:
                self._check_namespace(extra_key)
                toks = np.asarray(list(under), dtype=np.int64)
                path = self._walk(toks[: self._aligned(len(toks))], extra_key)
                h = seed_hash(extra_key)
                for seg in path[:-1]:
                    h = self._node_hashes(seg.node, h, out)
                stack = [(path[-1].node, h, EMPTY)] if path else []
            while stack and (limit is None or len(out) < limit):
                node, h, carry = stack.pop(0) if limit is not None else stack.pop()
                if node.evicted:
                    continue
                if len(carry):
                    tokens = np.concatenate([carry, node.key])
                    h = self._hash_pages(tokens, h, out)
                else:  # (always, in practice: the tree holds whole pages)
                    tokens = node.key
                    h = self._node_hashes(node, h, out)
                rest = tokens[len(tokens) // ps * ps :]
                stack.extend((child, h, rest) for child in node.children.values())
        return frozenset(list(out)[:limit] if limit is not None else out)

    def _node_hashes(self, node: TreeNode, h: bytes, out: dict[int, None]) -> bytes:
        """``_hash_pages`` of the node's edge after ``h``, remembered on the node (a split changes
        the edge, and with it the memo's key)."""
        memo = node.hash_memo
        if memo is None or memo[0] != h or memo[1] != len(node.key):
            mine: dict[int, None] = {}
            end = self._hash_pages(node.key, h, mine)
            memo = node.hash_memo = (h, len(node.key), list(mine), end)
        out.update(dict.fromkeys(memo[2]))
        return memo[3]

    def _hash_pages(self, tokens: np.ndarray, h: bytes, out: dict[int, None]) -> bytes:
        """Chain ``h`` over the whole pages of ``tokens``, adding each prefix's hash to ``out``;
        the last hash."""
        ps = self.page_size
        for k in range(len(tokens) // ps):
            h = chain(h, tokens[k * ps : (k + 1) * ps])
            out[int.from_bytes(h, "little")] = None
        return h

    def pretty(self) -> str:
        """A readable dump: one line per node, indented by depth."""
        with self._lock:
            lines = [f"RadixCache(page_size={self.page_size}, total={self.total_size()}, "
                     f"evictable={self._evictable_size}, protected={self._protected_size})"]
            stack: list[tuple[TreeNode, int]] = [(c, 1) for c in self.root.children.values()]
            while stack:
                n, depth = stack.pop()
                assert n.value is not None
                toks = n.key[:8].tolist()
                slots = n.value[:8].tolist()
                more = "..." if len(n.key) > 8 else ""
                ns = f" ns={n.extra_key!r}" if n.extra_key is not None else ""
                lines.append(f"{'  ' * depth}{toks}{more} -> {slots}{more} len={len(n.key)} "
                             f"lock={n.lock_ref} t={n.last_access_time}{ns}")
                stack.extend((c, depth + 1) for c in n.children.values())
            return "\n".join(lines)
