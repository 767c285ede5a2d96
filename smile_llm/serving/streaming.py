"""Streaming iterators: ``for chunk in lm.stream(prompt)`` and
``async for chunk in lm.astream(prompt)``.

Each chunk holds the text decoded since the previous chunk and the ids of the tokens generated since
then (text may trail its tokens: a UTF-8 character split across tokens, or text held back while it
may still become a stop string, arrives with a later chunk; the last chunk carries whatever is
left). The request runs on the model's one request path, queued by the first ``next()``; a
background driver advances it (``ServingLoop.serve_until_idle``) while the caller consumes, so a
slow consumer never blocks the serving loop. The request's error, if it fails, is raised by the
iteration after the chunks that came before it.

Every stream ends in bounded time: a consumer waiting for its next chunk makes sure a driver runs
(once every ``DRIVER_CHECK_S`` seconds without a chunk), so a driver that stopped (an
``InferenceEngine`` shut down while the stream ran) is replaced, and the request either finishes or
ends with its error (EngineShutdownError once the model is closed or the interpreter exits).

Releasing the request early: ``close()`` cancels it and releases its KV before returning (from a
listener: at the end of the current step); so does leaving a ``with lm.stream(...) as chunks:``
block, and leaving a loop over an iterator nothing else holds (``for chunk in lm.stream(...)``: a
``break`` or an exception drops it). A ``break`` out of a loop over an iterator still held in a
variable does not end it (the loop may be resumed): the request runs on until it finishes, or until
the iterator is closed, dropped (its KV released at once) or garbage-collected (the collector may
run on any thread, so the request is only flagged and cancelled at the model's next step). At
interpreter exit the model's serving loop ends every pending request
(``ServingLoop.release_at_exit``).
Cancelling the task of an ``astream`` loop, or leaving it, cancels the request.
"""

from __future__ import annotations

import asyncio
import queue
import weakref
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Callable

from ..collector import collecting
from .request import RequestHandle

_END = object()
DRIVER_CHECK_S = 0.25  # a consumer without a new chunk for this long makes sure a driver runs


@dataclass(frozen=True)
class StreamChunk:
    """New ``text`` and the new ``token_ids`` since the previous chunk (either may be empty, not
    both)."""

    text: str
    token_ids: tuple[int, ...]


class _ChunkListener:
    """Turns the request's callbacks (on its driver's thread) into chunks handed to ``put``."""

    def __init__(self, put: Callable[[Any], None]) -> None:
        self._put = put
        self._ids: list[int] = []

    def on_token(self, token_id: int) -> None:
        self._ids.append(token_id)

    def on_text(self, chunk: str) -> None:
        ids, self._ids = tuple(self._ids), []
        self._put(StreamChunk(chunk, ids))

    def finish(self) -> None:
        if self._ids:
            ids, self._ids = tuple(self._ids), []
            self._put(StreamChunk("", ids))
        self._put(_END)


def _release_dropped(handle: RequestHandle) -> None:
    """A dropped stream's finalizer: cancel its request. Dropped by the last reference going away
    (user code), the cancel is done here and the KV is released when the finalizer returns;
    collected by the garbage collector, which may run on any thread, even one inside the serving
    loop's locks, the request is only flagged and the serving loop cancels it at its next step."""
    if handle.done():
        return
    handle.cancel_requested = True
    if not collecting():
        try:
            handle.cancel()
        except Exception:  # noqa: BLE001 - a finalizer must not raise; the flag still ends it at
                           # the next step
            pass


class TokenStream(Iterator[StreamChunk]):
    """The iterator ``LanguageModel.stream`` returns (see the module docstring): ``StreamChunk``
    after chunk, then StopIteration, or the request's error. Also a context manager whose exit is
    ``close()``. One consumer thread at a time; ``close()`` is safe from any thread (a consumer
    waiting for a chunk then stops)."""

    def __init__(self, submit: Callable[[Any], RequestHandle],
                 start_driver: Callable[[], None]) -> None:
        self._submit, self._start_driver = submit, start_driver
        self._chunks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._handle: RequestHandle | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None
        self._closed = False

    @property
    def handle(self) -> RequestHandle | None:
        """The request's handle once the first ``next()`` queued it (None before)."""
        return self._handle

    def __iter__(self) -> TokenStream:
        return self

    def __next__(self) -> StreamChunk:
        if self._closed:
            raise StopIteration
        handle = self._handle
        if handle is None:
            handle = self._start()
        while True:
            try:
                item = self._chunks.get(timeout=DRIVER_CHECK_S)
            except queue.Empty:
                if not handle.done():
                    # no chunk for a while: make sure a driver runs (one may have stopped)
                    self._start_driver()
                continue
            if item is _END or self._closed:
                closed = self._closed  # by close(), maybe from another thread: no error to raise
                self._finish()
                if not closed:
                    handle.result(0)  # the request's error, if it failed (it is done: no wait)
                raise StopIteration
            return item

    def _start(self) -> RequestHandle:
        listener = _ChunkListener(self._chunks.put)
        handle = self._submit(listener)
        handle.add_done_callback(lambda _: listener.finish())
        self._handle = handle
        finalizer = weakref.finalize(self, _release_dropped, handle)
        # at exit the serving loop ends every request (ServingLoop.release_at_exit)
        finalizer.atexit = False
        self._finalizer = finalizer
        if self._closed:  # closed by another thread while the request was being queued
            finalizer.detach()
            handle.cancel()
        else:
            self._start_driver()
        return handle

    def _finish(self) -> None:
        self._closed = True
        if self._finalizer is not None:
            self._finalizer.detach()

    def close(self) -> None:
        """End the stream: its request, if still running, is cancelled and its KV released when this
        returns (from a listener: at the end of the current step); later ``next()`` calls raise
        StopIteration. Idempotent."""
        self._finish()
        handle = self._handle
        if handle is not None and not handle.done():
            handle.cancel()
        self._chunks.put(_END)  # wakes a consumer waiting on another thread

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stream(submit: Callable[[Any], RequestHandle], start_driver: Callable[[], None]) -> TokenStream:
    """Chunks of the request ``submit(listener)`` queues at the first ``next()`` (see the module
    docstring)."""
    return TokenStream(submit, start_driver)


async def astream(submit: Callable[[Any], RequestHandle],
                  start_driver: Callable[[], None]) -> AsyncIterator[StreamChunk]:
    """``stream`` for asyncio: chunks arrive through the running loop (``call_soon_threadsafe``)."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[Any] = asyncio.Queue()
    def put(item: Any) -> None:
        loop.call_soon_threadsafe(chunks.put_nowait, item)

    listener = _ChunkListener(put)
    handle = submit(listener)
    handle.add_done_callback(lambda _: listener.finish())
    start_driver()
    try:
        while True:
            try:
                item = await asyncio.wait_for(chunks.get(), DRIVER_CHECK_S)
            except asyncio.TimeoutError:
                if not handle.done():
                    # no chunk for a while: make sure a driver runs (one may have stopped)
                    start_driver()
                continue
            if item is _END:
                break
            yield item
        handle.result(0)
    finally:
        if not handle.done():
            handle.cancel()
