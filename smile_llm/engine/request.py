"""What a caller submits to the engine and what it gets back: ``SamplingParams`` and the future-like
``RequestHandle``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..model.language_model import Completion


@dataclass(frozen=True)
class SamplingParams:
    """Per-request settings, with ``generate()``'s meanings: greedy at temperature 0, nucleus sampling otherwise;
    ``seed`` 0 is nondeterministic; ``stop`` token ids or strings; ``speculative_tokens`` None for the model's
    default, 0 for plain decoding; ``draft_sampling`` "greedy" or "sample"."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    logprobs: bool = False
    stop: Any = None
    speculative_tokens: int | None = None
    draft_sampling: str = "greedy"


class RequestHandle:
    """A submitted request: ``result()`` waits for its Completion (or raises what ended it: GenerationCancelled
    after ``cancel()``, KvCacheExhaustedError if it can never fit the pool, ValueError-free by then since input is
    checked at submit, or the model's error). Safe to use from any thread."""

    def __init__(self, request_number: int, prompt: list[int], canceller: Callable[[RequestHandle], bool]) -> None:
        self.request_number = request_number  # submission order, from 1
        self.prompt = prompt
        self._canceller = canceller
        self._done = threading.Event()
        self._result: Completion | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        """True once the request finished, failed or was cancelled (never blocks)."""
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> Completion:
        """The Completion; raises the request's error, or TimeoutError if not done within ``timeout`` seconds."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_number} not done within {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error that ended the request, or None if it completed; waits up to ``timeout`` seconds (None: forever).
        TimeoutError if it is not done by then."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_number} not done within {timeout} s")
        return self._error

    def cancel(self) -> bool:
        """Abort the request: a queued one leaves the queue, a running one is evicted (its KV pages are free when
        this returns, unless called from a listener on the engine's own thread, where it takes effect at the end of
        the current step). False if it had already finished."""
        return self._canceller(self)

    # ------------------------------------------------------------------ engine side
    def _set_result(self, completion: Completion) -> None:
        self._result = completion
        self._done.set()

    def _set_error(self, error: BaseException) -> None:
        self._error = error
        self._done.set()
