"""StatePool: fixed-size per-request state beside the KV pages (the Gated DeltaNet layers' conv and
recurrent state).

A linear-attention layer keeps no KV that grows with the sequence: each request carries a
constant-size state per layer instead. The pool holds that state for ``max_requests`` requests in
static buffers, one named buffer per kind of state, each ``[max_requests, *shape]`` so that one
request's whole state is one slot of every buffer (Smile allocates it before the KV pool, so the KV
budget excludes it: create it first). Requests are known by the KV pool's request ids: attached to a
``KvCachePool`` (``KvCachePool.attach_state``) the pool binds, releases, offloads and restores a
request's slot inside its own binding verbs, under its lock, so no state outlives its request and no
caller can bind one without the other.

A slot is zeroed when it is bound (a request starts from the empty state), or filled from a prefix
snapshot when the KV pool's bind matched a cached prefix. Offloading copies the slot to host memory
and frees it; restoring takes any free slot and copies the state back, byte-identical.

Prefix snapshots (``snapshots`` > 0, see ``StateSnapshots``): the state of a request after a
page-aligned number of tokens, kept for the prefix tree node that ends there. The forward stages and
commits them (``stage_snapshot``, ``commit_snapshots``, or ``snapshot`` to copy a request's current
state); the KV pool hands a committed one to the node it inserts for the request, caps every prefix
match at the deepest node holding one, and restores it into the new request's slot. Without
snapshots every bind starts from the empty state (a prefix match stays empty).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from .checks import as_device, as_int
from .errors import KvCacheCorruptionError, KvCacheExhaustedError
from .state_snapshots import StateSnapshots
from .state_spec import StateSpec

if TYPE_CHECKING:
    from .radix import TreeNode

_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


class StatePool:
    """Static per-request state for ``max_requests`` requests and ``snapshots`` prefix snapshots
    (see the module docstring). Attached to a ``KvCachePool``, every change runs under that pool's
    lock (the pool's verbs call the binding methods; the snapshot verbs take the lock themselves);
    reading and writing a bound slot's tensors during a forward belongs to the thread driving that
    forward."""

    def __init__(self, specs: Mapping[str, StateSpec], max_requests: int,
                 device: str | torch.device = "cpu", snapshots: int = 0) -> None:
        if not specs:
            raise ValueError("a StatePool needs at least one state kind")
        self.max_requests = as_int(max_requests, "max_requests", minimum=1)
        self.device = as_device(device)
        self.specs = dict(specs)
        for name, spec in self.specs.items():
            if not spec.shape or any(isinstance(d, bool) or not isinstance(d, int) or d < 1
                                     for d in spec.shape):
                raise ValueError(f"state {name!r}: shape must be positive ints, got {spec.shape!r}")
            if spec.dtype not in _DTYPES:
                raise ValueError(f"state {name!r}: dtype must be one of {_DTYPES}, got "
                                 f"{spec.dtype}")
        self.buffers = {name: torch.zeros((self.max_requests, *spec.shape), dtype=spec.dtype,
                                          device=self.device)
                        for name, spec in self.specs.items()}
        self._slot_of: dict[int, int] = {}
        self._free = list(range(self.max_requests - 1, -1, -1))  # pop() hands out slot 0 first
        self._offloaded: dict[int, dict[str, torch.Tensor]] = {}
        self.snapshots = StateSnapshots(self.specs, as_int(snapshots, "snapshots", minimum=0),
                                        self.device)
        self.lock: threading.RLock = threading.RLock()  # the attached KV pool's lock once attached

    # ------------------------------------------------------------------ sizes
    @property
    def bytes_per_request(self) -> int:
        """Bytes of one request's state (every kind)."""
        return sum(math.prod(s.shape) * s.dtype.itemsize for s in self.specs.values())

    @property
    def snapshot_capacity(self) -> int:
        """Prefix snapshot slots (0: no prefix reuse for the requests of this pool)."""
        return self.snapshots.capacity

    @property
    def free_slots(self) -> int:
        """Slots no request holds."""
        return len(self._free)

    @property
    def bound_ids(self) -> frozenset[int]:
        """Request ids holding a slot (offloaded ones hold none)."""
        return frozenset(self._slot_of)

    # ------------------------------------------------------------------ reading slots (forward)
    def slot(self, request_id: int) -> int:
        """The slot of a bound, resident request; ValueError otherwise."""
        slot = self._slot_of.get(request_id)
        if slot is None:
            raise ValueError(f"request {request_id} holds no state slot (not bound, released or "
                             f"offloaded)")
        return slot

    def slots(self, request_ids: Iterable[int]) -> torch.Tensor:
        """int64 slot indices of ``request_ids`` in order, on the pool's device (index the buffers'
        first dim)."""
        slots = [self.slot(int(r)) for r in request_ids]
        return torch.tensor(slots, dtype=torch.int64).to(self.device)

    # ------------------------------------------------------------------ prefix snapshots (forward)
    def stage_snapshot(self, request_id: int, length: int) -> int | None:
        """A snapshot slot (index of ``snapshots.buffers``) to write the state of a bound request
        after ``length`` tokens into, during its forward; ``commit_snapshots`` once the forward
        succeeded. None when no slot can be had (the snapshot is skipped). ValueError for an unbound
        request or a length < 1."""
        length = as_int(length, "length", minimum=1)
        with self.lock:
            self.slot(request_id)
            return self.snapshots.stage(request_id, length)

    def commit_snapshots(self, request_ids: Iterable[int]) -> None:
        """The forward that filled these requests' staged snapshot slots succeeded (see
        ``stage_snapshot``)."""
        with self.lock:
            self.snapshots.commit(request_ids)

    def snapshot(self, request_id: int, length: int) -> bool:
        """Keep a copy of a bound request's current state as its state after ``length`` tokens
        (stage, copy, commit); False when no snapshot slot could be had. The caller vouches that the
        state has consumed exactly ``length`` tokens."""
        with self.lock:
            at = self.stage_snapshot(request_id, length)
            if at is None:
                return False
            slot = self.slot(request_id)
            for name, buf in self.snapshots.buffers.items():
                buf[at].copy_(self.buffers[name][slot])
            self.snapshots.commit([request_id])
            return True

    # ------------------------------------------------------------------ prefix snapshots (the pool)
    def has_snapshot(self, node: TreeNode) -> bool:
        """Whether the prefix tree node ``node`` has a snapshot."""
        return self.snapshots.has(node)

    def restore_snapshot(self, request_id: int, node: TreeNode) -> None:
        """Fill bound ``request_id``'s slot with ``node``'s snapshot (the state after the matched
        prefix)."""
        at, slot = self.snapshots.slot_of(node), self.slot(request_id)
        for name, buf in self.buffers.items():
            buf[slot].copy_(self.snapshots.buffers[name][at])

    def adopt_snapshot(self, request_id: int, node: TreeNode, length: int) -> None:
        """The tree cached ``request_id``'s first ``length`` tokens, ending at ``node``: its
        committed snapshot of that length becomes the node's (``StateSnapshots.adopt``)."""
        self.snapshots.adopt(request_id, node, length)

    def drop_evicted_snapshots(self) -> None:
        """Free the snapshots of nodes the tree evicted."""
        self.snapshots.drop_evicted()

    def clear_snapshots(self) -> None:
        """Free every node's snapshot (the tree was reset)."""
        self.snapshots.clear()

    # ------------------------------------------------------------------ binding (by the pool)
    def can_bind(self, count: int, releasing: Iterable[int] = ()) -> bool:
        """Whether ``count`` more requests fit once the requests ``releasing`` let go of their
        slots."""
        return count <= len(self._free) + sum(1 for r in releasing if r in self._slot_of)

    def bind(self, request_id: int) -> None:
        """Give ``request_id`` a zeroed slot. KvCacheExhaustedError when none is free (the KV pool
        checks ``can_bind`` first, so this means a caller skipped that check)."""
        if request_id in self._slot_of or request_id in self._offloaded:
            raise KvCacheCorruptionError(f"request {request_id} is bound to the state pool twice")
        if not self._free:
            raise KvCacheExhaustedError(f"no free state slot for request {request_id}: all "
                                        f"{self.max_requests} hold requests; keep it queued until "
                                        f"one finishes")
        slot = self._free.pop()
        for buf in self.buffers.values():
            buf[slot].zero_()
        self._slot_of[request_id] = slot

    def release(self, request_id: int) -> None:
        """Free ``request_id``'s slot (or its offloaded copy) and any snapshot it stages or holds.
        Unknown ids do nothing."""
        self.snapshots.release(request_id)
        self._offloaded.pop(request_id, None)
        slot = self._slot_of.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)

    def offload(self, request_id: int) -> None:
        """Copy ``request_id``'s state to host memory and free its slot (the KV pool's
        ``offload_request``)."""
        slot = self.slot(request_id)
        self._offloaded[request_id] = {name: buf[slot].to("cpu", copy=True)
                                       for name, buf in self.buffers.items()}
        del self._slot_of[request_id]
        self._free.append(slot)

    def restore(self, request_id: int) -> None:
        """Bring an offloaded request's state back into a free slot, byte-identical.
        KvCacheExhaustedError, changing nothing, when no slot is free."""
        saved = self._offloaded.get(request_id)
        if saved is None:
            raise KvCacheCorruptionError(f"request {request_id} has no offloaded state to restore")
        if not self._free:
            raise KvCacheExhaustedError(f"restore of request {request_id} needs a state slot; all "
                                        f"{self.max_requests} are held")
        slot = self._free.pop()
        for name, buf in self.buffers.items():
            buf[slot].copy_(saved[name])
        del self._offloaded[request_id]
        self._slot_of[request_id] = slot

    # ------------------------------------------------------------------ audit
    def check(self, resident: Iterable[int], offloaded: Iterable[int]) -> None:
        """KvCacheCorruptionError unless exactly the ``resident`` requests hold slots, exactly the
        ``offloaded`` ones hold host copies, every slot is held once or free once, and the snapshots
        are consistent (``StateSnapshots.check``)."""
        resident_set, offloaded_set = set(resident), set(offloaded)
        self.snapshots.check(resident_set | offloaded_set)
        if set(self._slot_of) != resident_set:
            raise KvCacheCorruptionError(f"state slots are held by requests "
                                         f"{sorted(self._slot_of)} but the KV pool's resident "
                                         f"requests are {sorted(resident_set)}")
        if set(self._offloaded) != offloaded_set:
            raise KvCacheCorruptionError(f"offloaded state is held for requests "
                                         f"{sorted(self._offloaded)} but the KV pool's offloaded "
                                         f"requests are {sorted(offloaded_set)}")
        held = np.array(sorted([*self._slot_of.values(), *self._free]), dtype=np.int64)
        if not np.array_equal(held, np.arange(self.max_requests)):
            raise KvCacheCorruptionError(f"state slots are lost or claimed twice: held "
                                         f"{sorted(self._slot_of.values())}, free "
                                         f"{sorted(self._free)} of {self.max_requests}")

    def __repr__(self) -> str:
        kinds = ", ".join(f"{n}{list(s.shape)}:{str(s.dtype).removeprefix('torch.')}"
                          for n, s in self.specs.items())
        return (f"StatePool({kinds}; {self.max_requests} requests, {len(self._free)} free, "
                f"{self.bytes_per_request} bytes per request, "
                f"{self.snapshots.cached_count}/{self.snapshot_capacity} prefix snapshots, "
                f"{self.device})")
