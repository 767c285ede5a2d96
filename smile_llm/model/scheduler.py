"""Scheduler: the one owner of every request's life in the model's pools, whoever submitted it.

``generate``, ``generate_batch``, ``InferenceEngine`` and the JVM all queue validated requests here (through the
model's ``Server``); only the scheduler binds, prefills, steps, preempts, finishes and releases. Each ``step``:

1. applies cancellations (``RequestHandle.cancel`` from a listener, a request's ``cancel`` hook returning True);
2. admits: first resumes preempted jobs (oldest first), then binds queued jobs first come, first served with
   ``bind_request`` (prefix reuse; capacity for the prompt plus ``ADMIT_DECODE_TOKENS``), while the batch has room
   and the pool has pages; a job that does not fit waits, one that can never fit fails with KvCacheExhaustedError;
3. prefills up to ``prefill_tokens_per_step`` prompt tokens (chunked; whole short remainders together in padded
   forwards);
4. reserves each decoding row's next window: a row's capacity grows ``GROW_DECODE_TOKENS`` at a time
   (``grow_request``); when the pool is short, the most recently admitted running job is preempted (its private KV
   offloaded to host memory with ``offload_request``, restored byte-identical later, so its output is unchanged);
5. advances every decoding row by one forward (``Decoder.step``: speculative rounds where rows draft);
6. finishes rows that are done (``finish_request`` inserts their KV into the prefix tree) and fails rows whose
   hooks raised, alone.

An exception of a shared forward fails the rows of that forward (their KV is evicted) and nothing else. Not
thread-safe: the ``Server`` serialises calls.

In-batch prefix sharing (SGLang's in-batch prefix caching check): a job whose prompt shares at least
SHARE_MIN_TOKENS uncached tokens with a running job that is still prefilling waits (with everything behind it)
until that prompt is written and cached, then binds and matches it. A burst with one new system prompt computes it
once.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from ..cache import KvCacheExhaustedError
from ..cache.offload import OffloadedKv
from .decoder import BATCHED_PREFILL_TOKENS, PREFILL_CHUNK
from .errors import GenerationCancelled
from .request import RequestHandle
from .sequence import Sequence

if TYPE_CHECKING:
    from .language_model import LanguageModel

SHARE_MIN_TOKENS = 32  # a shared uncached run this long is worth waiting one prefill for
ADMIT_DECODE_TOKENS = 64  # decode positions bound with the prompt at admission
GROW_DECODE_TOKENS = 64  # positions added to a decoding row's capacity at a time
DEFAULT_MAX_RUNNING = 64  # requests advanced together unless an InferenceEngine sets another batch size


@dataclass(eq=False)
class Job:
    """One request inside the scheduler: its handle (which holds the validated request), its ``Sequence`` once bound,
    its admission number (preemption takes the most recent first) and its offloaded KV while preempted."""

    handle: RequestHandle
    seq: Sequence | None = None
    admitted: int = 0
    offload: OffloadedKv | None = field(default=None, repr=False)

    @property
    def final_len(self) -> int:
        """Prompt plus every token it may generate: the capacity it grows to at most."""
        req = self.handle.request
        return len(req.prompt) + req.limit


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class Scheduler:
    """Admission, stepping, preemption and release of every request of one model (see the module docstring).
    ``max_running`` bounds the rows advanced together; ``prefill_tokens_per_step`` the prompt tokens prefilled per
    step."""

    def __init__(self, model: LanguageModel, max_running: int = DEFAULT_MAX_RUNNING,
                 prefill_tokens_per_step: int = PREFILL_CHUNK) -> None:
        self.model = model
        self.max_running = max_running
        self.prefill_tokens_per_step = prefill_tokens_per_step
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []  # bound and resident, in admission order
        self.preempted: list[Job] = []  # bound, private KV offloaded, in admission order
        self.preemptions = 0
        self.ended = 0  # requests ended so far (completed, failed or cancelled): waiters need waking when it moves
        self._admissions = itertools.count(1)

    # ------------------------------------------------------------------ queries
    def has_work(self) -> bool:
        """Whether any job is queued, running or preempted."""
        return bool(self.waiting or self.running or self.preempted)

    def jobs(self) -> list[Job]:
        """Every job the scheduler holds (queued, running, preempted)."""
        return list(self.waiting) + self.running + self.preempted

    # ------------------------------------------------------------------ one step
    def step(self) -> bool:
        """One scheduling step (see the module docstring); False when nothing was running."""
        self._apply_cancellations()
        self.admit()
        if not self.running:
            return False
        decoding = self._prefill()
        decoding = self._reserve(decoding)
        if decoding:
            seqs = [job.seq for job in decoding if job.seq is not None]
            try:
                self.model.decoder.step(seqs)
            except Exception as exc:  # a failed shared forward: its rows' KV may be partial, evict them
                for job in decoding:
                    self._end(job, error=exc, insert=False)
        self._finish_done()
        return True

    # ------------------------------------------------------------------ admission
    def admit(self) -> None:
        """Resume preempted jobs (oldest first), then bind queued jobs first come, first served, while the batch has
        room and the pool has pages. A job that can never fit the pool fails with KvCacheExhaustedError."""
        pool = self.model.pool
        while self.preempted and len(self.running) < self.max_running:
            job = self.preempted[0]
            assert job.seq is not None and job.offload is not None
            try:
                pool.restore_request(job.seq.request_id, job.offload)
            except KvCacheExhaustedError:
                return  # FCFS: nothing newer is admitted before it
            self.preempted.pop(0)
            job.offload = None
            self._run(job)
        total = pool.num_slots
        while self.waiting and len(self.running) < self.max_running:
            job = self.waiting[0]
            req = job.handle.request
            if self._pages(job.final_len) * pool.page_size > total:
                self.waiting.popleft()
                self._end(job, error=KvCacheExhaustedError(
                    f"a request of {len(req.prompt)} prompt tokens and up to {req.limit} new ones needs "
                    f"{self._pages(job.final_len)} pages; the pool has {total // pool.page_size} in all"))
                continue
            if self.shares_a_prefill(job):
                break  # bind it once that prompt is cached (FCFS: the jobs behind it wait too)
            capacity = min(job.final_len, len(req.prompt) + ADMIT_DECODE_TOKENS)
            try:
                rid = pool.bind_request(req.prompt, capacity, reuse_prefix=req.params.prompt_logprobs is None)
            except KvCacheExhaustedError as exc:
                if not self.running and not self.preempted:  # nothing will free pages: it never fits
                    self.waiting.popleft()
                    self._end(job, error=exc)
                    continue
                break
            self.waiting.popleft()
            bound = self._pages(capacity) * pool.page_size
            seq = Sequence(self.model, req, rid, pool.matched_prefix_len(rid), min(bound, job.final_len))
            job.seq, job.admitted = seq, next(self._admissions)
            drafter = self.model.drafter
            if seq.speculative_tokens and drafter is not None:
                # a full draft pool only means this request decodes plainly; so does a drafter that raises
                self.model.decoder.drafter_call([seq], "bind", seq, job.final_len)
            self._run(job)
            seq.notify("on_input_tokens", len(req.prompt))
            seq.notify("on_cached_input_tokens", min(seq.matched, len(req.prompt)))

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.model.pool.page_size)

    def _run(self, job: Job) -> None:
        """Put ``job`` into the running set, keeping admission order."""
        self.running.append(job)
        self.running.sort(key=lambda j: j.admitted)

    def shares_a_prefill(self, job: Job) -> bool:
        """Whether ``job``'s prompt shares at least SHARE_MIN_TOKENS positions beyond its matched prefix with a
        running job still prefilling (positions that job computes and will cache). On a pool with per-request state
        (a hybrid model) a match can only end where the other prompt's state snapshot will be, at the last page
        boundary of that prompt, so the job waits only when it shares that much."""
        pool = self.model.pool
        if not pool.prefix_reuse_enabled or job.handle.request.params.prompt_logprobs is not None:
            return False  # (a request for prompt logprobs computes its whole prompt anyway)
        prompt = np.asarray(job.handle.request.prompt)
        for other in self.running:
            seq = other.seq
            if seq is not None and seq.prefilled < len(seq.prompt):
                shared = common_prefix_len(prompt, np.asarray(seq.prompt))
                if pool.state_pools:  # reusable only up to the other prompt's snapshot
                    end = len(seq.prompt) // pool.page_size * pool.page_size
                    shared = end if shared >= end and len(prompt) > end else 0
                if shared >= seq.matched + SHARE_MIN_TOKENS:
                    return True
        return False

    # ------------------------------------------------------------------ prefill
    def _prefill(self) -> list[Job]:
        """Prefill within the step's budget, first come, first served; returns the jobs that decode this step."""
        decoder = self.model.decoder
        budget = self.prefill_tokens_per_step
        decoding: list[Job] = []
        whole: list[Job] = []
        for job in list(self.running):
            seq = job.seq
            assert seq is not None
            if seq.remaining == 0:
                continue  # finished, or asked for no tokens: ended by _finish_done without a forward
            if seq.prefilled < len(seq.prompt):
                left = len(seq.prompt) - seq.prefilled
                if budget <= 0:
                    continue
                if left <= min(budget, BATCHED_PREFILL_TOKENS):  # prefilled below, with the others like it
                    whole.append(job)
                    budget -= left
                    continue
                before = seq.prefilled
                try:
                    if decoder.prefill(seq, budget):
                        self._prefilled(seq)
                except Exception as exc:
                    self._end(job, error=exc, insert=False)
                budget -= seq.prefilled - before
            elif seq.remaining > 0:
                decoding.append(job)
        if whole:
            try:
                decoder.prefill_together([job.seq for job in whole if job.seq is not None])
            except Exception as exc:
                for job in whole:
                    self._end(job, error=exc, insert=False)
                return decoding
            for job in whole:
                assert job.seq is not None
                self._prefilled(job.seq)
        return decoding

    def _prefilled(self, seq: Sequence) -> None:
        """A whole prompt is written: take the first token and cache the prompt, so later binds can match it."""
        seq.take_next()
        self.model.pool.cache_prefix(seq.request_id, seq.prompt)

    # ------------------------------------------------------------------ capacity and preemption
    def _reserve(self, decoding: list[Job]) -> list[Job]:
        """Grow each decoding row's capacity to hold its next window (oldest rows first), preempting the most
        recently admitted running jobs while the pool is short. Returns the rows that decode this step."""
        pool = self.model.pool
        for job in sorted(decoding, key=lambda j: j.admitted):
            seq = job.seq
            assert seq is not None
            if job not in self.running:
                continue  # preempted for an older row
            need = seq.last_pos + 1  # a plain step writes the last token's KV
            want = need + seq.round_span()
            while seq.capacity < want:
                target = min(job.final_len, self._pages(want + GROW_DECODE_TOKENS) * pool.page_size)
                try:
                    seq.capacity = min(job.final_len, pool.grow_request(seq.request_id, target))
                    break
                except KvCacheExhaustedError:
                    pass
                if seq.capacity >= need:
                    break  # a shorter speculative window (or a plain step) fits this step
                victim = self.running[-1]
                if victim is job and len(self.running) == 1:
                    self._end(job, error=KvCacheExhaustedError(
                        f"request {job.handle.request_number} needs a page more at position {need} and no other "
                        f"request can make room"), insert=False)
                    break
                self.preempt(victim)
                if victim is job:
                    break
        return [job for job in decoding if job in self.running and job.seq is not None and not job.seq.finished]

    def preempt(self, job: Job) -> None:
        """Pause a running job: offload its private KV to host memory (``offload_request``; restored byte-identical
        by ``admit``) and move it to the preempted list. Its draft history stays bound."""
        assert job.seq is not None
        job.offload = self.model.pool.offload_request(job.seq.request_id)
        self.running.remove(job)
        self.preempted.append(job)
        self.preempted.sort(key=lambda j: j.admitted)
        job.seq.preemptions += 1
        self.preemptions += 1

    # ------------------------------------------------------------------ ending requests
    def _finish_done(self) -> None:
        """Complete finished rows, fail rows whose hooks raised, apply cancellations made during the step."""
        for job in list(self.running):
            seq = job.seq
            assert seq is not None
            if seq.error is not None:
                self._end(job, error=seq.error)
            elif job.handle.cancel_requested:
                self.cancel(job)
            elif seq.remaining == 0 and (seq.prefilled == len(seq.prompt) or not seq.tokens):
                completion = seq.completion()  # flushes the held-back text: the listener may still fail it
                self._end(job, error=seq.error)
                if seq.error is None:
                    job.handle._set_result(completion)
        self._apply_cancellations(poll=False)

    def _apply_cancellations(self, poll: bool = True) -> None:
        """Cancel every job whose handle was cancelled from the serving thread or (``poll``, once per step before
        any forward) whose ``cancel`` hook returns True; a hook that raises fails its request with that error."""
        for job in self.jobs():
            hook = job.handle.request.cancel
            if poll and not job.handle.cancel_requested and hook is not None:
                try:
                    stop = bool(hook())
                except Exception as exc:
                    self._end(job, error=exc)
                    continue
                if stop:
                    self._end(job, error=GenerationCancelled(
                        "aborted: cancel() returned True between steps; KV released"))
                    continue
            if job.handle.cancel_requested:
                self.cancel(job)

    def cancel(self, job: Job) -> None:
        """End ``job`` with GenerationCancelled; its KV (whole between steps) goes into the prefix tree."""
        self._end(job, error=GenerationCancelled(
            f"request {job.handle.request_number} was cancelled; its KV was released"))

    def fail_all(self, error: BaseException) -> None:
        """End every job with ``error``, evicting its KV; a job whose release fails too still gets ``error``."""
        for job in self.jobs():
            try:
                self._end(job, error=error, insert=False)
            except Exception:  # noqa: BLE001 - the pool itself is broken; the handle must still end
                for queue in (self.waiting, self.running, self.preempted):
                    if job in queue:
                        queue.remove(job)
                job.handle._set_error(error)
                self.ended += 1

    def find(self, handle: RequestHandle) -> Job | None:
        """The job of ``handle``, if the scheduler still holds it."""
        return next((job for job in self.jobs() if job.handle is handle), None)

    def _end(self, job: Job, error: BaseException | None = None, insert: bool = True) -> None:
        """Take ``job`` out of the scheduler and release its bindings: its written KV is inserted into the prefix
        tree (``insert``, KV whole) or evicted. With ``error`` the handle raises it."""
        if job in self.waiting:
            self.waiting.remove(job)
        if job in self.running:
            self.running.remove(job)
        if job in self.preempted:
            self.preempted.remove(job)
        seq = job.seq
        if seq is not None:
            job.seq = None
            if self.model.drafter is not None:
                self.model.decoder.drafter_call([seq], "release", seq)
            forget = getattr(self.model.decoder.draft_policy, "forget", None)
            if seq.adaptive and forget is not None:
                forget(seq)
            pool = self.model.pool
            if insert and job.offload is None:
                pool.finish_request(seq.request_id, seq.prompt + seq.tokens)
            else:
                pool.unbind_request(seq.request_id)
            job.offload = None
        if error is not None:
            job.handle._set_error(error)
        self.ended += 1
