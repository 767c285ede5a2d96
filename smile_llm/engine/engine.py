"""InferenceEngine: continuous batching of many requests over one model's KV pool.

Each step (under one lock): handle cancellations, admit queued requests (``Scheduler.admit``), prefill up to
``prefill_tokens_per_step`` prompt tokens of newly admitted requests (chunked, so long prompts do not stall the
running ones; prompts whose whole remainder fits, at most ``BATCHED_PREFILL_TOKENS``, are prefilled together in
padded forwards: ``Decoder.prefill_together``), then advance every decoding request by one forward together:
speculative rounds for rows that can draft (rows at different positions in one verify batch), one ragged plain step
for the rest (``Decoder.step``). Finished requests are inserted into the prefix tree (``finish_request``); cancelled
ones are evicted at once (``unbind_request``). Greedy outputs equal what each request would produce alone.

Run it on its own thread (``start()``, the default) or drive it by hand with ``step()``. ``submit`` is safe from
any thread; listeners are called on the engine's thread, without the engine's lock being needed by them.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterator
from collections.abc import Sequence as Seq
from typing import Any

from ..model.decoder import BATCHED_PREFILL_TOKENS, PREFILL_CHUNK
from ..model.language_model import Completion, GenerationCancelled, LanguageModel
from ..model.sequence import Sequence
from .request import RequestHandle, SamplingParams
from .scheduler import Job, Scheduler


class EngineShutdownError(RuntimeError):
    """The engine was shut down before the request completed, or a submit came after shutdown."""


class InferenceEngine:
    """Continuous batching over one ``LanguageModel``: ``submit`` (any thread) queues a request and returns a
    ``RequestHandle``; the serving thread (started unless ``start=False``) admits requests first come, first served with
    ``bind_request``, prefills them in chunks of ``prefill_tokens_per_step`` tokens (default: one ``generate`` prefill
    chunk, ``PREFILL_CHUNK``) and advances every running request each step (speculative rounds where the model
    drafts). A context manager; ``shutdown`` ends it. ValueError for a bad ``max_batch_size`` or
    ``prefill_tokens_per_step``; RuntimeError if another engine already serves the model."""

    def __init__(self, model: LanguageModel, max_batch_size: int = 8, *, prefill_tokens_per_step: int = PREFILL_CHUNK,
                 start: bool = True) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an int >= 1, got {max_batch_size!r}")
        if isinstance(prefill_tokens_per_step, bool) or not isinstance(prefill_tokens_per_step, int) or \
                prefill_tokens_per_step < 1:
            raise ValueError(f"prefill_tokens_per_step must be an int >= 1, got {prefill_tokens_per_step!r}")
        if model.serving_engine is not None:
            raise RuntimeError("another InferenceEngine already serves this model; shut it down first")
        self.model = model
        self.prefill_tokens_per_step = prefill_tokens_per_step
        self.scheduler = Scheduler(model, max_batch_size)
        self._lock = threading.RLock()
        self._wake = threading.Condition(self._lock)
        self._numbers = itertools.count(1)
        self._stepping: int | None = None  # ident of the thread inside step()
        self._closed = False
        self._waiters = 0  # caller threads waiting for the lock
        self._counter_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.steps = 0
        model.serving_engine = self
        if start:
            self.start()

    # ------------------------------------------------------------------ submission
    def submit(self, prompt: str | Seq[int], params: SamplingParams | None = None,
               listener: Any = None) -> RequestHandle:
        """Queue a request; returns its handle at once. ValueError for bad input (checked here, like
        ``generate()``), EngineShutdownError after ``shutdown``."""
        params = params or SamplingParams()
        model = self.model
        ids = model.encode(prompt)
        model._check_sampling(params.max_new_tokens, params.temperature, params.top_p)
        model._check_draft_sampling(params.draft_sampling)
        k = model.speculative_tokens_for(params.speculative_tokens)
        stop_ids, stop_texts = model._stops(params.stop)
        limit = model._clamp_new_tokens(ids, params.max_new_tokens)
        with self._external():
            if self._closed:
                raise EngineShutdownError("the engine is shut down; create a new one")
            handle = RequestHandle(next(self._numbers), ids, self._cancel)
            self.scheduler.waiting.append(Job(handle, params, listener, ids, limit, stop_ids, stop_texts, k))
            self._wake.notify_all()
        return handle

    def generate(self, prompt: str | Seq[int], params: SamplingParams | None = None,
                 listener: Any = None) -> Completion:
        """``submit(...).result()``; needs the engine's thread (``start=True``)."""
        return self.submit(prompt, params, listener).result()

    # ------------------------------------------------------------------ cancellation
    def _cancel(self, handle: RequestHandle) -> bool:
        if handle.done():
            return False
        if self._stepping == threading.get_ident():  # a listener on the engine's thread: at the end of the step
            for job in self.scheduler.running:
                if job.handle is handle:
                    job.cancel_requested = True
            return True
        with self._external():
            if handle.done():
                return False
            self._abort(handle)
            return True

    @contextlib.contextmanager
    def _external(self) -> Iterator[None]:
        """The engine's lock for a caller thread: the serving loop yields to it between steps (a lock is not fair,
        and the loop takes it again at once)."""
        with self._counter_lock:
            self._waiters += 1
        try:
            with self._lock:
                yield
        finally:
            with self._counter_lock:
                self._waiters -= 1

    def _abort(self, handle: RequestHandle) -> None:
        """Drop a queued job or evict a running one (instant eviction: no insertion); the handle raises
        GenerationCancelled."""
        sched = self.scheduler
        for job in list(sched.waiting):
            if job.handle is handle:
                sched.waiting.remove(job)
        for job in list(sched.running):
            if job.handle is handle:
                sched.release(job, insert=False)
        handle._set_error(GenerationCancelled(f"request {handle.request_number} was cancelled; KV released"))

    # ------------------------------------------------------------------ stepping
    @property
    def num_waiting(self) -> int:
        """Requests queued and not yet bound into the pool."""
        return len(self.scheduler.waiting)

    @property
    def num_running(self) -> int:
        """Requests bound into the pool and being advanced."""
        return len(self.scheduler.running)

    def step(self) -> bool:
        """One scheduling step; False when there was nothing to do."""
        with self._lock:
            self._stepping = threading.get_ident()
            try:
                return self._step()
            finally:
                self._stepping = None

    def _step(self) -> bool:
        sched, decoder = self.scheduler, self.model.decoder
        for job, error in sched.admit():
            job.handle._set_error(error)
        if not sched.running:
            return False
        self.steps += 1
        active = list(sched.running)
        try:
            budget = self.prefill_tokens_per_step
            decoding, whole = [], []
            for job in active:  # first come, first served within the step's prefill budget
                seq = job.seq
                assert seq is not None
                if seq.prefilled < len(seq.prompt):
                    left = len(seq.prompt) - seq.prefilled
                    if budget <= 0 or seq.remaining == 0:
                        continue
                    if left <= min(budget, BATCHED_PREFILL_TOKENS):  # prefilled below, with the others like it
                        whole.append(seq)
                        budget -= left
                        continue
                    before = seq.prefilled
                    if decoder.prefill(seq, budget):
                        self._prefilled(seq)
                    budget -= seq.prefilled - before
                elif seq.remaining > 0:
                    decoding.append(seq)
            decoder.prefill_together(whole)  # short remainders: padded forwards together
            for seq in whole:
                self._prefilled(seq)
            if decoding:
                decoder.step(decoding)
        except Exception as exc:  # a failed forward: its rows' KV may be partial, so evict them all
            for job in active:
                sched.release(job, insert=False)
                job.handle._set_error(exc)
            return True
        for job in active:
            seq = job.seq
            assert seq is not None
            if job.cancel_requested:
                self._abort(job.handle)
            elif seq.remaining == 0 and (seq.prefilled == len(seq.prompt) or not seq.tokens):
                sched.release(job, insert=True)
                job.handle._set_result(seq.completion())
        return True

    def _prefilled(self, seq: Sequence) -> None:
        """A whole prompt is written: take the first token and cache the prompt, so later binds can match it."""
        seq.take_next()
        self.model.pool.cache_prefix(seq.request_id, seq.prompt)

    # ------------------------------------------------------------------ the engine thread
    def start(self) -> None:
        """Serve on a daemon thread until ``shutdown``."""
        with self._lock:
            if self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._loop, name="smile-llm-engine", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while True:
            with self._lock:
                if self._closed and not self.scheduler.running and not self.scheduler.waiting:
                    return
                worked = self.step()
                if not worked:
                    self._wake.wait(timeout=0.5)
            if self._waiters:
                time.sleep(0.001)  # let a caller thread waiting for the lock take it

    def shutdown(self, wait: bool = True, cancel_pending: bool = False) -> None:
        """Stop accepting requests. With ``cancel_pending`` every queued and running request is cancelled (KV
        released); otherwise the engine finishes them first (``wait`` blocks until it has). Without a thread the
        remaining requests are cancelled. Afterwards the model can be used by ``generate()`` again."""
        with self._external():
            self._closed = True
            if cancel_pending or self._thread is None:
                for job in list(self.scheduler.waiting) + list(self.scheduler.running):
                    self._abort(job.handle)
            self._wake.notify_all()
        if self._thread is not None and wait:
            self._thread.join()
        if self._thread is None or not self._thread.is_alive():
            with self._lock:
                for job in list(self.scheduler.waiting) + list(self.scheduler.running):
                    self._abort(job.handle)
                if self.model.serving_engine is self:
                    self.model.serving_engine = None

    def __enter__(self) -> InferenceEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown(wait=True, cancel_pending=exc[0] is not None)
