"""InferenceEngine: the public serving API of one model, over the model's one scheduler.

The engine does not own a second request path: ``submit`` validates a request
(``LanguageModel.request``) and queues it on the model's ``ServingLoop``, the same scheduler that
``LanguageModel.generate`` uses, so engine requests and ``generate()`` calls from other threads are
batched together. The engine sets the scheduler's batch size and prefill budget while it is
attached, and runs a background driver thread (``start=True``, the default) so requests advance
while nobody waits on them; with ``start=False`` call ``step()`` by hand (or wait on a handle, which
drives).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq
from typing import Any

from ..serving.model_runner import PREFILL_CHUNK
from ..language_model import LanguageModel
from ..errors import EngineShutdownError
from ..serving.listener import Listener
from ..serving.request import RequestHandle, SamplingParams
from ..speculative.acceptance import RoundRecord
from ..serving.sample_group import SampleGroup
from ..serving.scheduler import DEFAULT_MAX_RUNNING, Scheduler
from ..serving.completion import Completion


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int >= 1, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return value


class InferenceEngine:
    """Continuous batching over one ``LanguageModel``: ``submit`` (any thread) queues a request and
    returns a ``RequestHandle``; requests are admitted first come, first served (``bind_request``;
    those that do not fit wait for pages, running ones may be preempted and resumed), prefilled in
    chunks of ``prefill_tokens_per_step`` tokens per step and advanced together (speculative rounds
    where the model drafts). At most ``max_batch_size`` requests run at once. A context manager;
    ``shutdown`` ends it. ValueError/TypeError for a bad ``max_batch_size`` or
    ``prefill_tokens_per_step``; RuntimeError if another engine is already attached to the model."""

    DEFAULT_PREFILL_TOKENS_PER_STEP = PREFILL_CHUNK  # prompt tokens prefilled per step unless given

    def __init__(self, model: LanguageModel, max_batch_size: int = 8, *,
                 prefill_tokens_per_step: int = PREFILL_CHUNK, start: bool = True) -> None:
        _positive_int(max_batch_size, "max_batch_size")
        _positive_int(prefill_tokens_per_step, "prefill_tokens_per_step")
        self.model = model
        self.serving_loop = model.serving_loop
        if self.serving_loop.engine_attached:
            raise RuntimeError("another InferenceEngine already serves this model; shut it down "
                               "first")
        self.max_batch_size, self.prefill_tokens_per_step = max_batch_size, prefill_tokens_per_step
        sched = self.serving_loop.scheduler
        sched.max_running, sched.prefill_tokens_per_step = max_batch_size, prefill_tokens_per_step
        self._lock = threading.Lock()
        self._handles: list[RequestHandle | SampleGroup] = []
        self._closed = False
        self.serving_loop.engine_attached = True
        if start:
            self.serving_loop.start_thread()

    @property
    def scheduler(self) -> Scheduler:
        """The model's scheduler (shared with ``generate`` callers)."""
        return self.serving_loop.scheduler

    @property
    def steps(self) -> int:
        """Scheduling steps run on the model so far (by any driver)."""
        return self.serving_loop.steps

    # ------------------------------------------------------------------ submission
    def submit(self, prompt: str | Seq[int], params: SamplingParams | None = None,
               listener: Listener = None, *, cancel: Callable[[], bool] | None = None,
               on_round: Callable[[RoundRecord], None] | None = None
               ) -> RequestHandle | SampleGroup:
        """Validate and queue a request; returns its handle at once (a ``SampleGroup`` of the
        samples for ``params.n > 1``). ``listener``: a ``GenerationListener``, or a plain callable
        that receives each text chunk. ``RequestError`` for bad input (naming the field, nothing
        bound), EngineShutdownError after ``shutdown``."""
        request = self.model.request(prompt, params, listener=listener, cancel=cancel,
                                     on_round=on_round)
        with self._lock:
            if self._closed:
                raise EngineShutdownError("the engine is shut down; create a new one")
            handle = self.serving_loop.submit(request)
            self._handles = [h for h in self._handles if not h.done()] + [handle]
        return handle

    def generate(self, prompt: str | Seq[int], params: SamplingParams | None = None,
                 listener: Listener = None) -> Completion | list[Completion]:
        """``submit(...).result()`` (a list of the samples for ``params.n > 1``)."""
        return self.submit(prompt, params, listener).result()

    # ------------------------------------------------------------------ stepping
    @property
    def num_waiting(self) -> int:
        """Requests queued and not yet bound into the pool (from any caller of the model)."""
        return self.serving_loop.num_waiting

    @property
    def num_running(self) -> int:
        """Requests bound into the pool (from any caller of the model)."""
        return self.serving_loop.num_running

    def step(self) -> bool:
        """One scheduling step on the calling thread; False when nothing was running."""
        return self.serving_loop.step()

    # ------------------------------------------------------------------ shutdown
    def shutdown(self, wait: bool = True, cancel_pending: bool = False) -> None:
        """Stop accepting requests and detach from the model. With ``cancel_pending`` (or without a
        serving thread) the engine's queued and running requests are cancelled (KV released);
        otherwise ``wait`` blocks until they finish (not from a listener, where it returns at once).
        The model's ``generate`` keeps working; the scheduler's batch size and prefill budget return
        to their defaults. Idempotent.

        Requests the engine did not submit (a ``stream`` of the model, another thread's ``submit``)
        are not the engine's to end: once its serving thread stops, a driver that stops when idle
        (``ServingLoop.serve_until_idle``) finishes them, so every caller still gets its result."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            handles = list(self._handles)
        threaded = self.serving_loop.thread_alive
        if cancel_pending or not threaded:
            for h in handles:
                h.cancel()
        elif wait and not self.serving_loop.in_step():
            for h in handles:
                h.exception()
        # the serving thread itself finishes what is left
        when_idle = not wait and not cancel_pending
        loop = self.serving_loop
        loop.stop_thread(wait=wait and not loop.in_step(), when_idle=when_idle)
        if not when_idle and self.serving_loop.has_work():
            # other callers' requests keep advancing without the engine's thread
            self.serving_loop.serve_until_idle()
        sched = self.serving_loop.scheduler
        sched.max_running, sched.prefill_tokens_per_step = DEFAULT_MAX_RUNNING, PREFILL_CHUNK
        self.serving_loop.engine_attached = False

    def __enter__(self) -> InferenceEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=True, cancel_pending=exc[0] is not None)
