"""Generation: one HTTP request's samples on the model's one serving loop, awaited from asyncio.

Each sample is an ordinary request (``LanguageModel.request`` then ``ServingLoop.submit``, the path
every caller takes) with a listener that appends its new text and tokens to a buffer and wakes the
event loop (``call_soon_threadsafe``, at most one wake-up pending per generation). The serving loop
therefore never waits for a reader: a slow client's buffer holds at most its own output (bounded by
``max_tokens``), coalesced into the next chunk it reads. A background driver advances the requests
(``serve_until_idle``). ``cancel`` (a client that went away) cancels every sample still running and
releases its pages before returning; ``cut`` does the same for a server that stops, whose requests
then end with a 503 (``error_of``)."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import GenerationCancelled
from ..serving.completion import Completion
from ..serving.request import RequestHandle, SamplingParams
from .errors import ApiError, from_model_error


@dataclass
class Delta:
    """What one sample produced since the last read: ``text``, ``token_ids``; ``done`` once it
    ended (its Completion or error is then on its handle)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    done: bool = False


class _Sample:
    """The listener of one sample: buffers its output for the reader."""

    def __init__(self, index: int, owner: Generation) -> None:
        self.index, self.owner = index, owner
        self.text: list[str] = []
        self.ids: list[int] = []
        self.first_token_at: float | None = None
        self.token_times: list[float] = []

    def on_token(self, token_id: int) -> None:
        now = time.perf_counter()
        with self.owner.lock:
            self.ids.append(token_id)
            if self.first_token_at is None:
                self.first_token_at = now
            self.token_times.append(now)
        self.owner.wake()

    def on_text(self, chunk: str) -> None:
        with self.owner.lock:
            self.text.append(chunk)
        self.owner.wake()


class Generation:
    """The ``count`` samples of ``prompt`` (token ids) with ``params`` (one sample's settings;
    sample i draws with ``params.sample(i)``'s seed), submitted to ``model`` at once. ValueError
    (and the model's other request errors) from the constructor, before anything is queued.
    ``renames``: request fields the API names otherwise, for ``error_of``."""

    def __init__(self, model: Any, prompt: list[int], params: SamplingParams, count: int,
                 loop: asyncio.AbstractEventLoop, renames: dict[str, str] | None = None) -> None:
        self.model, self.loop, self.renames = model, loop, renames
        self.lock = threading.Lock()
        self._event = asyncio.Event()
        self._wake_pending = False
        self.t0 = time.perf_counter()
        self.cut_reason: str | None = None
        self.samples = [_Sample(i, self) for i in range(count)]
        base = replace(params, n=count)
        requests = [model.request(prompt, base.sample(i), listener=self.samples[i])
                    for i in range(count)]
        self.handles: list[RequestHandle] = [model.server.submit(r) for r in requests]
        for h in self.handles:
            h.add_done_callback(lambda _: self.wake())
        model.server.serve_until_idle()

    def wake(self) -> None:
        """Wake the reader (from any thread; one wake-up pending at a time)."""
        with self.lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        try:
            self.loop.call_soon_threadsafe(self._set)
        except RuntimeError:  # the event loop closed (shutdown): nobody reads any more
            pass

    def _set(self) -> None:
        with self.lock:
            self._wake_pending = False
        self._event.set()

    @property
    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def take(self) -> list[Delta]:
        """Each sample's output since the last call (samples with nothing new left out)."""
        out = []
        with self.lock:
            for s, h in zip(self.samples, self.handles):
                finished = h.done()
                if s.text or s.ids or finished:
                    out.append(Delta(s.index, "".join(s.text), s.ids, finished))
                    s.text, s.ids = [], []
        return out

    async def deltas(self) -> Any:
        """Async iterator of new output until every sample ended (a sample's last Delta has
        ``done``)."""
        ended: set[int] = set()
        while len(ended) < len(self.samples):
            await self._event.wait()
            self._event.clear()
            for delta in self.take():
                if delta.index in ended:
                    continue
                if delta.done:
                    ended.add(delta.index)
                yield delta

    async def results(self) -> list[Completion]:
        """Every sample's Completion, once all ended; raises the first sample's error."""
        while not self.done:
            await self._event.wait()
            self._event.clear()
        return [h.result(0) for h in self.handles]

    def cancel(self) -> None:
        """Cancel every sample still running (its pages released when this returns)."""
        for h in self.handles:
            if not h.done():
                h.cancel()

    def cut(self, reason: str) -> None:
        """End every sample still running with a 503 saying ``reason`` (the server stops): each
        is cancelled (pages released when this returns) and ``error_of`` answers its cancellation
        with the 503."""
        self.cut_reason = reason
        self.cancel()

    def error_of(self, exc: BaseException) -> ApiError:
        """The API error of a failure of this generation: the 503 of a ``cut``, else the
        model's error mapped by ``from_model_error``."""
        if isinstance(exc, ApiError):
            return exc
        if self.cut_reason is not None and isinstance(exc, GenerationCancelled):
            return ApiError(503, self.cut_reason)
        return from_model_error(exc, self.renames)

    def latencies(self, index: int) -> tuple[float | None, list[float]]:
        """Sample ``index``'s time to first token and its gaps between tokens (seconds)."""
        s = self.samples[index]
        ttft = None if s.first_token_at is None else s.first_token_at - self.t0
        gaps = [b - a for a, b in zip(s.token_times, s.token_times[1:])]
        return ttft, gaps

