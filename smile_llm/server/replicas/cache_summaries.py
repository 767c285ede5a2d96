"""What a router knows of each replica's prefix cache, and how it scores a prompt against it.

A replica publishes ``CacheSummary`` objects: the page hashes (``cache.prefix_hash``) of prefixes
its radix tree holds, stamped with the replica's own counter (``version``).

- A **complete** summary lists the whole tree. The replica sends one periodically (Ray Serve's
  routing stats); it replaces what was known, so evicted pages leave the view.
- A **partial** summary lists what one finished response left cached: the path of its prompt and
  the continuation (the replica sends it as the response's last message). It is added to the view
  until a complete summary with a later stamp arrives (which holds it, or has evicted it).

The router also adds a prompt's pages the moment it routes the prompt (``routed``), before the
replica has computed anything, so that concurrent requests sharing a prefix meet on one replica;
those entries count for ``pending_ttl_s`` (a summary taken meanwhile may predate the prefill).

``CacheSummaries`` is thread-safe. One board per process (``board()``) is shared by the router
(Ray Serve builds it inside the process that holds the deployment handle) and the ingress that
reads the responses' summaries."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np


K = TypeVar("K")
CACHE_STAT = "smile_llm_cache"  # the key of a replica's complete summary in its routing stats
PENDING_TTL_S = 30.0
MAX_ADDED = 256  # partial summaries kept per replica between complete ones (the oldest go first)


@dataclass(frozen=True)
class CacheSummary:
    """Page hashes of prefixes ``replica`` holds (``hashes``: uint64) with its ``page_size``;
    ``complete``: the whole tree (else what one response added); ``version``: the replica's
    counter when it was taken (later summaries have larger ones)."""

    replica: str
    version: int
    page_size: int
    hashes: np.ndarray
    complete: bool

    def as_stats(self) -> dict[str, object]:
        """This summary in plain types (for Ray Serve's routing stats)."""
        return {"replica": self.replica, "version": self.version, "page_size": self.page_size,
                "hashes": self.hashes.astype(np.uint64).tobytes(), "complete": self.complete}

    @classmethod
    def from_stats(cls, stats: dict[str, Any]) -> CacheSummary:
        """The summary ``as_stats`` gave."""
        return cls(str(stats["replica"]), int(stats["version"]), int(stats["page_size"]),
                   np.frombuffer(stats["hashes"], dtype=np.uint64), bool(stats["complete"]))

    @classmethod
    def of(cls, replica: str, version: int, page_size: int, hashes: Collection[int],
           complete: bool) -> CacheSummary:
        return cls(replica, version, page_size, np.fromiter(hashes, np.uint64, len(hashes)),
                   complete)


@dataclass
class _View:
    version: int = -1  # the stamp of the newest complete summary
    held: frozenset[int] = frozenset()
    added: list[tuple[int, frozenset[int]]] = field(default_factory=list)  # (stamp, hashes)
    pending: list[tuple[float, frozenset[int]]] = field(default_factory=list)  # (expiry, hashes)


class CacheSummaries:
    """The cache views of a deployment's replicas, keyed by replica id."""

    def __init__(self, pending_ttl_s: float = PENDING_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pending_ttl_s, self.clock = pending_ttl_s, clock
        self.page_size: int | None = None
        self._views: dict[str, _View] = {}
        self._lock = threading.Lock()

    def publish(self, summary: CacheSummary) -> None:
        """Take a replica's summary (a stale one changes nothing)."""
        held = frozenset(int(h) for h in summary.hashes.tolist())
        with self._lock:
            self.page_size = summary.page_size
            view = self._views.setdefault(summary.replica, _View())
            if summary.complete:
                if summary.version > view.version:
                    view.version, view.held = summary.version, held
                    view.added = [(v, h) for v, h in view.added if v > summary.version]
            elif summary.version > view.version:
                view.added = view.added[-(MAX_ADDED - 1):] + [(summary.version, held)]

    def routed(self, replica: str, hashes: Iterable[int]) -> None:
        """``replica`` was just sent a prompt with these page hashes."""
        entry = (self.clock() + self.pending_ttl_s, frozenset(hashes))
        if entry[1]:
            with self._lock:
                self._views.setdefault(replica, _View()).pending.append(entry)

    def version(self, replica: str) -> int:
        """The stamp of the newest complete summary of ``replica`` (-1: none)."""
        with self._lock:
            view = self._views.get(replica)
            return -1 if view is None else view.version

    def matched_pages(self, replica: str, prompt_hashes: list[int]) -> int:
        """How many leading pages of a prompt (its page hashes) ``replica`` is known to hold."""
        now = self.clock()
        with self._lock:
            view = self._views.get(replica)
            if view is None or not prompt_hashes:
                return 0
            view.pending = [(t, h) for t, h in view.pending if t > now]
            sets = [view.held, *(h for _, h in view.added), *(h for _, h in view.pending)]
            n = 0
            while n < len(prompt_hashes) and any(prompt_hashes[n] in s for s in sets):
                n += 1
            return n

    def drop(self, replica: str) -> None:
        """Forget a replica (it died or left the deployment)."""
        with self._lock:
            self._views.pop(replica, None)

    def keep_only(self, replicas: Collection[str]) -> None:
        """Forget every replica not in ``replicas``."""
        with self._lock:
            for gone in set(self._views) - set(replicas):
                del self._views[gone]

    def size(self, replica: str) -> int:
        """About how many prefix hashes ``replica``'s view holds (those added since its last
        complete summary counted once per summary)."""
        now = self.clock()
        with self._lock:
            view = self._views.get(replica)
            return 0 if view is None else len(view.held) + sum(
                len(h) for _, h in view.added) + sum(len(h) for t, h in view.pending if t > now)

    def sizes(self) -> dict[str, int]:
        """Replica id -> how many prefix hashes its view holds (for inspection)."""
        with self._lock:
            return {r: len(v.held.union(*(h for _, h in v.added + v.pending)))
                    for r, v in self._views.items()}


def rank_replicas(replicas: Sequence[K], loads: Mapping[K, int], matched: Mapping[K, int],
                  prompt_pages: int, min_match_ratio: float, imbalance_threshold: int,
                  cached: Mapping[K, int], tie_break: Callable[[], float]) -> list[list[K]]:
    """The routing choice, in Ray Serve's form (groups to try in order, one replica each).

    The fallback is the least-loaded replica: equal loads go to the one with the least ``cached``
    (so that new prefixes spread), then by ``tie_break()``. The replica with the most ``matched``
    pages of the prompt's ``prompt_pages`` comes first instead when it is useful: it holds at least
    ``min_match_ratio`` of the pages, and one page, more than the fallback holds, and its load is
    at most ``imbalance_threshold`` above the fallback's. The others follow by load."""
    by_load = sorted(replicas, key=lambda r: (loads[r], cached.get(r, 0), tie_break()))
    fallback = by_load[0]
    best = max(by_load, key=lambda r: matched.get(r, 0)) if matched else fallback
    gain = matched.get(best, 0) - matched.get(fallback, 0)
    if gain < max(1.0, min_match_ratio * prompt_pages) or \
            loads[best] - loads[fallback] > imbalance_threshold:
        best = fallback
    return [[best]] + [[r] for r in by_load if r != best]


_BOARD = CacheSummaries()


def board() -> CacheSummaries:
    """This process's board: the router's and the ingress's shared view."""
    return _BOARD
