"""ModelReplica: one Ray Serve replica of the OpenAI-compatible server.

It holds one ``LanguageModel`` (rank 0 of its tensor-parallel ranks, if any) and its own copy of
the app (``create_app``), so its endpoints, errors and metrics are those of ``smile-llm serve``.
The ingress hands it each client request (``ProxiedRequest``). It streams back the app's answer
(``proxied.call_app``; the head names the replica in ``X-Smile-LLM-Replica``) and, last, a
partial ``CacheSummary`` of what the answer left cached (the prompt's path in its radix tree and
what extends it), so that the router has seen a conversation's turn by the time its answer is
complete. Every routing-stats period Ray Serve collects a complete summary
(``record_routing_stats``)."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import AsyncIterator
from typing import Any

from ray import serve

from ..app import create_app
from .cache_summaries import CACHE_STAT, CacheSummary
from ..model_options import ModelOptions
from .proxied import ProxiedRequest, ResponseHead, call_app
from .ray_metrics import RayMetrics
from ..settings import ServerSettings

REPLICA_HEADER = b"x-smile-llm-replica"  # names the replica that answered (its Ray Serve id)
MAX_PARTIAL_HASHES = 4096  # the most page hashes a response's summary carries


class ModelReplica:
    """The replica of ``options``' model served with ``settings``; ``cpus_per_rank``: what each
    tensor-parallel rank > 0 asks Ray for (the deployment's bundles hold them)."""

    def __init__(self, options: ModelOptions, settings: ServerSettings,
                 cpus_per_rank: float = 1.0, gpus_per_rank: float = 0.0) -> None:
        self.ranks: Any = None
        if options.tensor_parallel > 1:
            from .tp_ranks import ReplicaRanks

            self.ranks = ReplicaRanks(options, "nccl" if gpus_per_rank else "gloo",
                                      cpus_per_rank, gpus_per_rank)
            self.ranks.join()
        self.model = options.load()
        self.app = create_app(self.model, settings)
        self.metrics = RayMetrics(self.app.state.smile.metrics)
        replica_id = serve.get_replica_context().replica_id
        self.replica, self.tag = replica_id.to_full_id_str(), replica_id.unique_id.encode()
        self.page_size = int(self.model.pool.page_size)
        self._versions = itertools.count(1)
        self._summarizing = threading.Lock()  # a summary's stamp and its hashes, taken together

    async def __call__(self, request: ProxiedRequest) -> AsyncIterator[ResponseHead | bytes |
                                                                        CacheSummary]:
        """The app's answer to ``request`` (head, body chunks, heartbeats), then, for a request
        with a prompt, the partial summary of what it left cached."""
        async for part in call_app(self.app, request):
            if isinstance(part, ResponseHead):
                part = ResponseHead(part.status, [*part.headers, (REPLICA_HEADER, self.tag)])
            yield part
        if request.prompt_token_ids:  # (off the event loop: it may wait for the tree's lock)
            yield await asyncio.to_thread(self.summary, request.prompt_token_ids)

    def summary(self, under: list[int] | None = None) -> CacheSummary:
        """The complete summary of the radix tree (``under`` None), or the partial one of the
        prefixes on ``under``'s path and below it."""
        with self._summarizing:
            radix = self.model.pool.radix
            if under is None:
                return CacheSummary.of(self.replica, next(self._versions), self.page_size,
                                       radix.page_prefix_hashes(), complete=True)
            return CacheSummary.of(self.replica, next(self._versions), self.page_size,
                                   radix.page_prefix_hashes(under, limit=MAX_PARTIAL_HASHES)
                                   if under else (), complete=False)

    def record_routing_stats(self) -> dict[str, Any]:
        """Ray Serve's periodic call: the complete summary, in plain types (Serve's controller
        passes it on without importing this package); the gauges are sampled too."""
        self.metrics.sample()
        return {CACHE_STAT: self.summary().as_stats()}

    def check_health(self) -> None:
        """Ray Serve's health check: raises (and the replica is restarted) when the serving loop
        has shut down (its model was closed) or a tensor-parallel rank has ended."""
        if self.model.serving_loop.closed:
            raise RuntimeError("the serving loop has shut down")
        if self.ranks is not None:
            import ray

            done, _ = ray.wait(self.ranks.runs, timeout=0)
            if done:
                raise RuntimeError("a tensor-parallel rank of this replica has ended")

    def __del__(self) -> None:
        """Ray Serve's shutdown of the replica (after its in-flight requests drained)."""
        model = getattr(self, "model", None)
        if model is not None:
            model.close()
        if getattr(self, "ranks", None) is not None:
            self.ranks.close()
