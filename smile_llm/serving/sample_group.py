"""SampleGroup: the handle of a request for ``n > 1`` samples of one prompt.

The request becomes ``n`` ordinary requests (``SamplingParams.sample(i)``: sample 0 keeps the seed,
the others get derived seeds), queued together on the one scheduler. The first computes the prompt
and caches it; the others wait for that prefill (the scheduler's in-batch prefix sharing) and bind
on the cached prompt, so its KV is computed once and shared by every sample (only the positions
after its last full page are recomputed per sample).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from .request import Request, RequestHandle

if TYPE_CHECKING:
    from .completion import Completion


def sample_requests(request: Request) -> list[Request]:
    """The ``n`` one-sample requests of ``request``, sample i with ``params.sample(i)`` and its own
    listener (``sample_listeners[i]``, when given; prompt logprobs are computed by sample 0
    only)."""
    listeners = request.sample_listeners
    if request.params.n == 1:
        return [replace(request, listener=listeners[0], sample_listeners=()) if listeners
                else request]
    return [replace(request, params=request.params.sample(i), sample_listeners=(),
                    listener=listeners[i] if listeners else request.listener)
            for i in range(request.params.n)]


class SampleGroup:
    """The ``n`` samples of one request, future-like like ``RequestHandle`` and safe from any
    thread: ``result()`` is the list of their Completions in sample order (each carrying the
    prompt's ``prompt_logprobs`` when asked for). If one sample fails, ``result()`` cancels the
    others and raises that error."""

    def __init__(self, request: Request, handles: list[RequestHandle]) -> None:
        self.request = request
        self.prompt = request.prompt
        self.handles = handles
        self.request_number = handles[0].request_number

    def done(self) -> bool:
        """True once every sample finished, failed or was cancelled."""
        return all(h.done() for h in self.handles)

    def result(self, timeout: float | None = None) -> list[Completion]:
        """The samples' Completions; raises the first error among them (the other samples are then
        cancelled), or TimeoutError when the samples are not all done within ``timeout`` seconds
        overall."""
        error = self.exception(timeout)
        if error is not None:
            raise error
        out = [h.result(0) for h in self.handles]
        prompt_logprobs = out[0].prompt_logprobs
        return [c if i == 0 else replace(c, prompt_logprobs=prompt_logprobs)
                for i, c in enumerate(out)]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The first sample's error (the rest are then cancelled), or None once all completed; waits
        like ``result``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for h in self.handles:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            error = h.exception(left)
            if error is not None:
                self.cancel()
                return error
        return None

    def cancel(self) -> bool:
        """Cancel every sample still running; True if any was (their KV is released when this
        returns)."""
        return any([h.cancel() for h in self.handles])

    def add_done_callback(self, fn: Callable[[SampleGroup], None]) -> None:
        """Call ``fn(group)`` once every sample is done (on the thread that ends the last one, or at
        once)."""
        left = [len(self.handles)]
        lock = threading.Lock()

        def one_done(_: RequestHandle) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                fn(self)

        for h in self.handles:
            h.add_done_callback(one_done)
