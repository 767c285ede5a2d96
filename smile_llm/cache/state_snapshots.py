"""StateSnapshots: a bounded store of per-request states taken at page-aligned prefix ends, kept for
the prefix tree.

A linear-attention layer's state after a prefix cannot be rebuilt from that prefix's KV pages: a
prefix hit on a hybrid model must also restore the state after the matched tokens. The store keeps
such states (SGLang's approach for state-space layers) in ``capacity`` static slots of the same
kinds and shapes as the ``StatePool`` it belongs to. A slot is, at any time, exactly one of:

- free;
- **staged** for a request: a forward is writing the request's state after ``length`` tokens into it
  (``stage``);
- **pending** for a request: the forward succeeded (``commit``), the slot holds that state, waiting
  for the prefix tree to cache the request's tokens up to ``length``;
- **cached** for a tree node: the state after the tokens from the root to the end of that node
  (``adopt``).

Each request holds at most one staged or pending slot, the latest (staging again supersedes it). A
request's ``length`` is always page-aligned, so it can equal the end of the node the pool inserts
when the request is cached or finished, which then adopts the slot. Cached snapshots are evicted
least recently used first (by their node's LRU time) when a stage finds no free slot, and dropped
when their node leaves the tree. A node without a snapshot is a tree node like any other; the pool
simply never ends a prefix match there.

Not locked itself: the ``StatePool`` that owns it serialises every call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from .errors import KvCacheCorruptionError

if TYPE_CHECKING:
    from .radix import TreeNode
    from .state_spec import StateSpec


class StateSnapshots:
    """``capacity`` snapshot slots (see the module docstring); ``buffers`` maps each state kind to
    ``[capacity, *shape]``."""

    def __init__(self, specs: Mapping[str, StateSpec], capacity: int, device: torch.device) -> None:
        self.capacity = capacity
        self.buffers = {name: torch.zeros((capacity, *spec.shape), dtype=spec.dtype, device=device)
                        for name, spec in specs.items()}
        self._free = list(range(capacity - 1, -1, -1))
        # request id -> (slot, length): being written (staged); written, not yet cached (pending)
        self._staged: dict[int, tuple[int, int]] = {}
        self._pending: dict[int, tuple[int, int]] = {}
        # tree node -> slot: the state after the node's last token
        self._cached: dict[TreeNode, int] = {}

    # ------------------------------------------------------------------ queries
    @property
    def cached_count(self) -> int:
        """Snapshots held for tree nodes."""
        return len(self._cached)

    @property
    def free_count(self) -> int:
        """Slots nobody holds."""
        return len(self._free)

    def has(self, node: TreeNode) -> bool:
        """Whether ``node`` (a live tree node) has a snapshot."""
        return node in self._cached

    def slot_of(self, node: TreeNode) -> int:
        """The slot of ``node``'s snapshot; KeyError without one."""
        return self._cached[node]

    def pending_length(self, request_id: int) -> int | None:
        """The length of ``request_id``'s committed snapshot, if it holds one."""
        held = self._pending.get(request_id)
        return None if held is None else held[1]

    # ------------------------------------------------------------------ a request's snapshot
    def stage(self, request_id: int, length: int) -> int | None:
        """A slot for the state of ``request_id`` after ``length`` tokens, to be written now and
        ``commit``-ted once written. Reuses the request's own staged or pending slot (superseded),
        else a free one, else the least recently used cached snapshot's; None when every slot is
        held by other requests (the snapshot is skipped, and later matches stop short of it)."""
        held = self._staged.pop(request_id, None) or self._pending.pop(request_id, None)
        if held is not None:
            slot = held[0]
        elif self._free:
            slot = self._free.pop()
        elif self._cached:
            node = min(self._cached, key=lambda n: (n.last_access_time, n.id))
            slot = self._cached.pop(node)
        else:
            return None
        self._staged[request_id] = (slot, length)
        return slot

    def commit(self, request_ids: Iterable[int]) -> None:
        """The forward that wrote these requests' staged slots succeeded: they become pending."""
        for rid in request_ids:
            held = self._staged.pop(rid, None)
            if held is not None:
                self._pending[rid] = held

    def adopt(self, request_id: int, node: TreeNode, length: int) -> bool:
        """The tree now caches ``request_id``'s tokens up to ``length``, ending at ``node``: a
        pending snapshot of exactly that length becomes ``node``'s (or is freed when the node
        already has one: the same state). True when ``node`` has a snapshot afterwards."""
        held = self._pending.get(request_id)
        if held is not None and held[1] == length:
            del self._pending[request_id]
            if node in self._cached:
                self._free.append(held[0])
            else:
                self._cached[node] = held[0]
        return node in self._cached

    def release(self, request_id: int) -> None:
        """Free whatever slot ``request_id`` stages or holds pending (it is finished, failed or
        evicted)."""
        for table in (self._staged, self._pending):
            held = table.pop(request_id, None)
            if held is not None:
                self._free.append(held[0])

    # ------------------------------------------------------------------ the tree's side
    def drop_evicted(self) -> None:
        """Free the snapshots of nodes the tree evicted."""
        for node in [n for n in self._cached if n.evicted]:
            self._free.append(self._cached.pop(node))

    def clear(self) -> None:
        """Free every cached snapshot (the tree was reset)."""
        self._free.extend(self._cached.values())
        self._cached.clear()

    # ------------------------------------------------------------------ audit
    def check(self, bound: Iterable[int]) -> None:
        """KvCacheCorruptionError unless every slot is held once or free once, only ``bound``
        requests hold staged or pending slots, and every cached snapshot's node is still in the
        tree."""
        bound_set = set(bound)
        holders = set(self._staged) | set(self._pending)
        if not holders <= bound_set:
            raise KvCacheCorruptionError(f"state snapshots are held by requests "
                                         f"{sorted(holders - bound_set)} that are not bound")
        if set(self._staged) & set(self._pending):
            raise KvCacheCorruptionError("a request holds both a staged and a pending state "
                                         "snapshot")
        dead = [n for n in self._cached if n.evicted]
        if dead:
            raise KvCacheCorruptionError(f"state snapshot kept for {dead[0]!r}, which left the "
                                         f"prefix tree")
        slots = [s for s, _ in self._staged.values()] + [s for s, _ in self._pending.values()]
        held = np.array(sorted([*slots, *self._cached.values(), *self._free]), dtype=np.int64)
        if not np.array_equal(held, np.arange(self.capacity)):
            raise KvCacheCorruptionError(f"state snapshot slots are lost or held twice: "
                                         f"staged/pending {slots}, cached "
                                         f"{sorted(self._cached.values())}, free "
                                         f"{sorted(self._free)} of {self.capacity}")
