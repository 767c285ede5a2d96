"""Ingress: the HTTP front of a Ray Serve deployment of model replicas (``ModelReplica``).

Each client request is read here (key checked, body size limited), its prompt worked out
(``PromptTokens``: the token ids the router scores replicas by) and handed, whole, to one replica
through Ray Serve's deployment handle, whose request router (``CacheAwareRouter`` by default)
picks the replica. The replica's own app answers, so every endpoint, error and limit is that of
``smile-llm serve``; the ingress passes the answer through and feeds the cache summary that ends
it to the router's board.

Faults: until the first body chunk arrives (for a stream: the first token), nothing has reached
the client, so a replica that dies or stops answering (no message, not even a heartbeat, for
``stall_timeout_s``) has the request retried on another replica, up to ``retries`` times, then
answered 503. A replica lost mid-stream ends the stream with an error event; a request no replica
takes within ``stall_timeout_s`` is 503 too. Every wait is bounded."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import (CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge,
                               generate_latest)
from ray.exceptions import ActorUnavailableError, RayActorError

from ..app import authorize
from ..bodies import read_raw_body
from .cache_summaries import CacheSummary, board
from ..errors import ApiError
from ..model_options import ModelOptions
from .prompt_tokens import PromptTokens
from .proxied import HEARTBEAT, ProxiedRequest, ResponseHead
from ..responses import event
from ..settings import ServerSettings

log = logging.getLogger("smile_llm.server")
RETRIES = 2
STALL_TIMEOUT_S = 30.0
REPLICA_LOST = (RayActorError, ActorUnavailableError)


class _Lost(Exception):
    """The replica died, or sent nothing within the stall timeout."""


class Ingress:
    """The front of ``replicas`` (a deployment handle of ``ModelReplica``) serving ``options``'
    model with ``settings``."""

    def __init__(self, replicas: Any, options: ModelOptions, settings: ServerSettings,
                 retries: int = RETRIES, stall_timeout_s: float = STALL_TIMEOUT_S) -> None:
        self.replicas = replicas.options(stream=True)
        self.settings, self.retries, self.stall_timeout_s = settings, retries, stall_timeout_s
        self.prompts = PromptTokens(options.folder)
        self.registry = CollectorRegistry()
        self.routed = Counter("smile_llm_ingress_requests", "Requests answered, by replica",
                              ["replica"], registry=self.registry)
        self.retried = Counter("smile_llm_ingress_retries",
                               "Requests retried because their replica was lost",
                               registry=self.registry)
        self.lost = Counter("smile_llm_ingress_lost_streams",
                            "Streams ended with an error because their replica was lost",
                            registry=self.registry)
        self.views = Gauge("smile_llm_ingress_cached_prefixes",
                           "Prefix page hashes the router knows each replica holds", ["replica"],
                           registry=self.registry)

    async def __call__(self, request: Request) -> Response:
        try:
            if request.url.path == "/metrics":
                self.views.clear()
                for replica, size in self.cache_views().items():
                    self.views.labels(replica).set(size)
                return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
            if request.method == "POST" or request.url.path.startswith("/v1"):
                authorize(self.settings, request)  # (before any work; the replica checks again)
            body = await read_raw_body(request, self.settings.max_body_bytes,
                                          self.settings.body_timeout_s)
            prompt, ids = await asyncio.to_thread(self.prompts.of, request.url.path, body)
            proxied = ProxiedRequest(
                request.method, request.url.path, request.url.query.encode(),
                [(k.lower(), v) for k, v in request.headers.raw], body,
                prompt or f"{request.method} {request.url.path}", ids)
            return await self.forward(proxied)
        except ApiError as exc:
            return exc.response()

    async def forward(self, proxied: ProxiedRequest) -> Response:
        """Send ``proxied`` to a replica and pass its answer on, retrying while nothing was
        sent."""
        for attempt in range(self.retries + 1):
            answer = self.replicas.remote(proxied)
            try:
                head = await self._next(answer)
                first = await self._next(answer)
            except _Lost as exc:
                answer.cancel()
                if attempt < self.retries:
                    self.retried.inc()
                    log.warning("replica lost before the first token (%s); retrying", exc)
                    continue
                raise ApiError(503, f"no replica answered: {exc}",
                               headers={"Retry-After": "1"}) from None
            except BaseException:
                answer.cancel()  # the client left (the request was cancelled)
                raise
            if not isinstance(head, ResponseHead):
                answer.cancel()
                raise ApiError(500, "the replica answered out of order")
            # (Ray Serve's proxy sets X-Request-Id itself, to the id the replica's app used)
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers
                       if k.lower() not in (b"content-length", b"transfer-encoding",
                                            b"x-request-id")}
            return StreamingResponse(self._rest(answer, first, head), status_code=head.status,
                                     headers=headers)
        raise AssertionError("unreachable")

    async def _next(self, answer: Any) -> Any:
        """The replica's next message that is not a heartbeat (None at its end); a summary is
        taken and skipped. _Lost when the replica dies or is silent for the stall timeout."""
        while True:
            try:
                part = await asyncio.wait_for(answer.__anext__(), self.stall_timeout_s)
            except StopAsyncIteration:
                return None
            except asyncio.TimeoutError:
                raise _Lost(f"nothing for {self.stall_timeout_s:g} s") from None
            except REPLICA_LOST as exc:
                raise _Lost(type(exc).__name__) from None
            if isinstance(part, CacheSummary):
                board().publish(part)
                self.routed.labels(part.replica).inc()
            elif part != HEARTBEAT:
                return part

    async def _rest(self, answer: Any, first: bytes | None, head: ResponseHead
                    ) -> AsyncIterator[bytes]:
        """The body from its first chunk on; a replica lost on the way ends a stream with an error
        event. Leaving early (the client went away) cancels the replica's work."""
        streaming = any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
                        for k, v in head.headers)
        done = False
        try:
            chunk = first
            while chunk is not None:
                yield chunk
                chunk = await self._next(answer)
            done = True
        except _Lost as exc:
            answer.cancel()  # (a silent replica may still be generating)
            self.lost.inc()
            if streaming:
                yield event(ApiError(503, f"the replica was lost mid-stream: {exc}").body())
            done = True
        finally:
            if not done:
                answer.cancel()

    def cache_views(self) -> dict[str, int]:
        """Replica id -> how many prefix hashes the router's board holds for it (this
        process's)."""
        return board().sizes()
