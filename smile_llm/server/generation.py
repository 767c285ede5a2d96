"""Generation: one HTTP request's samples on the model's one serving loop, awaited from asyncio.

The samples are one request (``LanguageModel.submit_samples``: validated once, queued together, the
path every caller takes), each with its own listener. The listeners run on the serving loop's
thread, inside a step, and only append: a streamed sample's token ids, their times and its text go
to lists that thread alone touches (no lock, no wake-up per token). The first call in a step defers
one ``publish`` to the end of the step (``ServingLoop.defer``), which hands every sample's new
output to the reader through a queue and wakes the event loop once (``call_soon_threadsafe``, at
most one wake-up pending per generation): one hand-off per step for all of a generation's samples,
whatever the tokens a step makes. A sample's first text is handed over at once: the step that
prefilled it goes on to decode the other requests, and its first token would wait for them. A sample
the reader sees done (``RequestHandle.done``) has ended only once nothing of it is left unpublished,
so its last text always comes before its end. The serving loop never waits for a reader: a slow
client's queue holds at most its own output (bounded by ``max_tokens``), coalesced into the next
chunk it reads. A request that is not streamed only stamps its tokens' times (for the latency
metrics) and wakes the reader when it ends.

A background driver advances the requests (``serve_until_idle``). ``cancel`` (a client that went
away) cancels every sample still running and releases its pages before returning; ``cut`` does the
same for a server that stops, whose requests then end with a 503 (``error_of``)."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..errors import GenerationCancelled
from ..serving.completion import Completion
from ..serving.request import RequestHandle, SamplingParams
from .errors import ApiError, from_model_error

if TYPE_CHECKING:
    from ..language_model import LanguageModel


@dataclass
class Delta:
    """What one sample produced since the last read: ``text``, ``token_ids``; ``done`` once it
    ended (its Completion or error is then on its handle)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    done: bool = False


class _TimedSample:
    """The listener of a sample that is not streamed: the time of each token (serving thread)."""

    __slots__ = ("token_times",)

    def __init__(self) -> None:
        self.token_times: list[float] = []

    def on_token(self, token_id: int) -> None:
        self.token_times.append(time.perf_counter())


class _StreamedSample:
    """The listener of a streamed sample: appends its tokens, their times and its text since the
    last publication (serving thread only) and asks for one publication per step; its first text
    is published at once (a step that prefills a request goes on to decode the others)."""

    __slots__ = ("owner", "ids", "text", "token_times", "opened")

    def __init__(self, owner: Generation) -> None:
        self.owner = owner
        self.ids: list[int] = []  # unpublished
        self.text: list[str] = []  # unpublished
        self.token_times: list[float] = []
        self.opened = False  # some text was published

    def on_token(self, token_id: int) -> None:
        self.ids.append(token_id)
        self.token_times.append(time.perf_counter())
        if not self.owner.scheduled:
            self.owner.schedule()

    def on_text(self, chunk: str) -> None:
        self.text.append(chunk)
        if not self.opened:
            self.opened = True
            self.owner.publish()
        elif not self.owner.scheduled:
            self.owner.schedule()


class Generation:
    """The ``count`` samples of ``prompt`` (token ids) with ``params`` (one sample's settings;
    sample i draws with ``params.sample(i)``'s seed), submitted to ``model`` at once, read on
    ``loop``; ``streamed``: whether the reader takes their output as it comes (``batches``) or only
    their results (``results``). The model's ``RequestError`` (its one validation, for all the
    samples) from the constructor, before anything is queued. ``renames``: request fields the
    API names otherwise, for ``error_of``."""

    def __init__(self, model: LanguageModel, prompt: list[int], params: SamplingParams, count: int,
                 loop: asyncio.AbstractEventLoop, renames: dict[str, str] | None = None,
                 streamed: bool = True) -> None:
        self.model, self.loop, self.renames = model, loop, renames
        self._serving_loop = model.serving_loop
        self._event = asyncio.Event()
        self._wake_pending = False
        # a publication is deferred to the end of the current step (serving thread only)
        self.scheduled = False
        # (sample index, text, token ids) published by the serving thread, taken by the reader
        self._published: deque[tuple[int, str, list[int]]] = deque()
        self._ended: set[int] = set()  # samples whose end the reader has taken
        self.wakeups = 0  # wake-ups of the event loop asked for (for tests and profiles)
        self.t0 = time.perf_counter()
        self.cut_reason: str | None = None
        self._streamed = [_StreamedSample(self) for _ in range(count)] if streamed else []
        self.samples: list[_StreamedSample | _TimedSample] = (
            list(self._streamed) if streamed else [_TimedSample() for _ in range(count)])
        group = model.submit_samples(prompt, params, self.samples)
        self.handles: list[RequestHandle] = group.handles
        for h in self.handles:
            h.add_done_callback(self._on_end)
        self._serving_loop.serve_until_idle()

    # ------------------------------------------------------------------ the serving thread
    def schedule(self) -> None:
        """Publish the samples' new output at the end of the current step (from a listener), or
        at once outside a step."""
        if self._serving_loop.in_step():
            self.scheduled = True
            self._serving_loop.defer(self._end_of_step)
        else:
            self.publish()

    def _end_of_step(self) -> None:
        self.scheduled = False
        self.publish()

    def publish(self) -> None:
        """Hand every sample's output since the last publication to the reader and wake it (on
        the thread that runs the listeners: queued before the lists are emptied, so a reader
        that finds them empty finds their output queued)."""
        for index, s in enumerate(self._streamed):
            if s.ids or s.text:
                self._published.append((index, "".join(s.text), s.ids))
                s.ids, s.text = [], []
        self.wake()

    def _on_end(self, handle: RequestHandle) -> None:
        # inside a step: with the step's publication (the sample's last output is not yet
        # published); outside one (a cancellation, a shutdown): at once
        if self._serving_loop.in_step():
            if not self.scheduled:
                self.schedule()
        else:
            self.wake()

    def wake(self) -> None:
        """Wake the reader (from any thread; one wake-up pending at a time)."""
        if self._wake_pending:
            return
        self._wake_pending = True
        self.wakeups += 1
        try:
            self.loop.call_soon_threadsafe(self._set)
        except RuntimeError:  # the event loop closed (shutdown): nobody reads any more
            pass

    # ------------------------------------------------------------------ the event loop
    def _set(self) -> None:
        self._wake_pending = False  # before the reader takes: a later publication wakes again
        self._event.set()

    @property
    def done(self) -> bool:
        return all(h.done() for h in self.handles)

    def take(self) -> list[Delta]:
        """Each streamed sample's output since the last call, in sample order (samples with
        nothing new left out); a sample's last Delta has ``done``, and none follows it."""
        # ended: done, and nothing left unpublished (checked before the queue is drained)
        ended = [i for i, (s, h) in enumerate(zip(self._streamed, self.handles))
                 if i not in self._ended and h.done() and not s.ids and not s.text]
        news: dict[int, Delta] = {}
        published = self._published
        while published:
            index, text, ids = published.popleft()
            d = news.get(index)
            if d is None:
                news[index] = Delta(index, text, ids)
            else:  # the reader fell behind the steps
                d.text += text
                d.token_ids += ids
        for index in ended:
            d = news.get(index)
            if d is None:
                news[index] = d = Delta(index)
            d.done = True
            self._ended.add(index)
        return [news[i] for i in sorted(news)] if len(news) > 1 else list(news.values())

    async def batches(self) -> AsyncIterator[list[Delta]]:
        """The new output of the streamed samples, one list per wake-up, until every sample
        ended (a sample's last Delta has ``done``)."""
        while len(self._ended) < len(self.samples):
            await self._event.wait()
            self._event.clear()
            batch = self.take()
            if batch:
                yield batch

    async def results(self) -> list[Completion]:
        """Every sample's Completion, once all ended; raises the first sample's error."""
        while not self.done:
            await self._event.wait()
            self._event.clear()
        return [h.result(0) for h in self.handles]

    # ------------------------------------------------------------------ any thread
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
        """Sample ``index``'s time to first token and its gaps between tokens (seconds; read once
        it ended)."""
        times = self.samples[index].token_times
        ttft = times[0] - self.t0 if times else None
        gaps = [b - a for a, b in zip(times, times[1:])]
        return ttft, gaps
