"""CacheAwareRouter: a Ray Serve request router that sends each request to the replica whose own
radix tree holds the longest prefix of its prompt.

The prompt's token ids come with the request (``ProxiedRequest.prompt_token_ids``); the router
hashes them page by page (``cache.prefix_hash``) and counts, per replica, the leading pages the
replica is known to hold (``CacheSummaries``: the replicas' complete summaries from their routing
stats, the partial ones that end their responses, and what was routed in the last moments).

- The replica with the most matched pages wins when it holds a useful prefix (at least
  ``min_match_ratio`` of the prompt's pages, and one page, more than the least-loaded replica
  holds: a prefix every replica has, such as a chat template's opening, decides nothing) and its
  queue is at most ``imbalance_threshold`` requests longer than the shortest; ties go to the
  shorter queue.
- Otherwise the least-loaded replica (the shortest queue) gets it; among equal queues the one with
  the least cached, so that new prefixes (a new tenant's system prompt) spread over the replicas.
- The other replicas follow in order of load, for when the first is full.

``initialize_state`` takes ``min_match_ratio``, ``imbalance_threshold`` and ``pending_ttl_s`` (how
long a routed prompt counts as cached before a summary confirms it).

A replica's summary is dropped when Ray Serve reports it dead or gone (``update_replicas``)."""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from ...cache.prefix_hash import page_hashes
from .cache_summaries import (CACHE_STAT, PENDING_TTL_S, CacheSummaries, CacheSummary, board,
                              rank_replicas)
from .proxied import ProxiedRequest

MIN_MATCH_RATIO = 0.25
IMBALANCE_THRESHOLD = 8


class CacheAwareRouter(RequestRouter):
    """Ray Serve's ``RequestRouter`` by cached prefix; ``initialize_state`` takes the
    thresholds (``RequestRouterConfig.request_router_kwargs``)."""

    def initialize_state(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - {"min_match_ratio", "imbalance_threshold", "pending_ttl_s"}
        if unknown:
            raise ValueError(f"CacheAwareRouter takes min_match_ratio, imbalance_threshold and "
                             f"pending_ttl_s, not {sorted(unknown)}")
        self.min_match_ratio = float(kwargs.get("min_match_ratio", MIN_MATCH_RATIO))
        self.imbalance_threshold = int(kwargs.get("imbalance_threshold", IMBALANCE_THRESHOLD))
        self.board: CacheSummaries = board()
        self.board.pending_ttl_s = float(kwargs.get("pending_ttl_s", PENDING_TTL_S))

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        if pending_request is not None:  # (Ray Serve waits before trying again when all are full)
            pending_request.routing_context.should_backoff = True
        for replica in candidate_replicas:  # the newest complete summaries, from routing stats
            stats = (replica.routing_stats or {}).get(CACHE_STAT)
            if stats is not None and stats["version"] > self.board.version(stats["replica"]):
                self.board.publish(CacheSummary.from_stats(stats))
        loads = self._loads(candidate_replicas)
        hashes = self._hashes(pending_request)
        matched = {r.replica_id: self.board.matched_pages(r.replica_id.to_full_id_str(), hashes)
                   for r in candidate_replicas} if hashes else {}
        cached = {r.replica_id: self.board.size(r.replica_id.to_full_id_str())
                  for r in candidate_replicas}
        ranked = rank_replicas([r.replica_id for r in candidate_replicas], loads, matched,
                               len(hashes), self.min_match_ratio, self.imbalance_threshold,
                               cached, random.random)
        by_id = {r.replica_id: r for r in candidate_replicas}
        return [[by_id[r] for r in group] for group in ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID,
                          result: Any) -> None:
        hashes = self._hashes(pending_request)
        if hashes:
            self.board.routed(replica_id.to_full_id_str(), hashes)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.board.keep_only({r.replica_id.to_full_id_str() for r in replicas})

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.board.drop(replica_id.to_full_id_str())

    def _hashes(self, pending_request: PendingRequest | None) -> list[int]:
        """The page hashes of the request's prompt (memoized on it); [] without one."""
        if pending_request is None or not pending_request.args:
            return []
        request = pending_request.args[0]
        if not isinstance(request, ProxiedRequest) or not request.prompt_token_ids:
            return []
        page_size = self.board.page_size
        if page_size is None:
            return []
        if request.routing.get("page_size") != page_size:
            request.routing.update(page_size=page_size,
                                   hashes=page_hashes(request.prompt_token_ids, page_size))
        hashes: list[int] = request.routing["hashes"]
        return hashes

    def _loads(self, replicas: list[RunningReplica]) -> dict[ReplicaID, int]:
        """Each replica's queue length as last seen (unknown: 0). Ray Serve probes the replica it
        is about to send to, and moves to the next group when that one is full or silent."""
        cache = self.replica_queue_len_cache
        return {r.replica_id: cache.get(r.replica_id) or 0 for r in replicas}
