"""Streaming iterators: ``for chunk in lm.stream(prompt)`` and ``async for chunk in lm.astream(prompt)``.

Each chunk holds the text decoded since the previous chunk and the ids of the tokens generated since then (text may
trail its tokens: a UTF-8 character split across tokens, or text held back while it may still become a stop string,
arrives with a later chunk; the last chunk carries whatever is left). The request runs on the model's one request
path; a background driver advances it (``Server.serve_until_idle``) while the caller consumes, so a slow consumer
never blocks the serving loop. Leaving the loop early (``break``, an exception, ``close()``, cancelling the task)
cancels the request, which releases its KV at the next step. The request's error, if it fails, is raised by the
iteration after the chunks that came before it.
"""

from __future__ import annotations

import asyncio
import queue
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any, Callable

from .request import RequestHandle

_END = object()


@dataclass(frozen=True)
class StreamChunk:
    """New ``text`` and the new ``token_ids`` since the previous chunk (either may be empty, not both)."""

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


def stream(submit: Callable[[Any], RequestHandle], start_driver: Callable[[], None]) -> Iterator[StreamChunk]:
    """Chunks of the request ``submit(listener)`` queues (see the module docstring)."""
    chunks: queue.SimpleQueue[Any] = queue.SimpleQueue()
    listener = _ChunkListener(chunks.put)
    handle = submit(listener)
    handle.add_done_callback(lambda _: listener.finish())
    start_driver()
    try:
        while (item := chunks.get()) is not _END:
            yield item
        handle.result()  # the request's error, if it failed
    finally:
        if not handle.done():
            handle.cancel()


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
        while (item := await chunks.get()) is not _END:
            yield item
        handle.result()
    finally:
        if not handle.done():
            handle.cancel()
