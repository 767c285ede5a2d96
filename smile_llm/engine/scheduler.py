"""Scheduler: the waiting queue and the running set of the engine, and admission into the KV pool.

Admission is first come, first served: the head of the queue is bound with ``bind_request`` (prefix reuse, pages
for prompt plus ``max_new_tokens``); a KvCacheExhaustedError leaves it (and everything behind it) queued until
running requests finish and free pages. A request that cannot fit even with nothing else running fails with that
error instead of waiting forever. Not thread-safe: the engine calls it under its lock.

In-batch prefix sharing (SGLang's in-batch prefix caching check): a request whose prompt shares at least
SHARE_MIN_TOKENS uncached tokens with a running request that is still prefilling waits (with everything behind
it) until that prompt is written and cached, then binds and matches it, instead of computing the same prefix again.
So a burst of requests with one new system prompt computes it once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from ..cache import KvCacheExhaustedError
from ..model.language_model import LanguageModel
from ..model.listener import notify
from ..model.sequence import Sequence
from .request import RequestHandle, SamplingParams


@dataclass
class Job:
    """One submitted request inside the scheduler: its handle, sampling parameters, listener, prompt ids, the clamped
    new-token limit, stop ids and strings, draft count, and its ``Sequence`` once bound."""

    handle: RequestHandle
    params: SamplingParams
    listener: object
    prompt: list[int]
    limit: int  # max new tokens, clamped to the model's max_seq_len
    stop_ids: set[int]
    stop_texts: list[str]
    speculative_tokens: int
    seq: Sequence | None = None  # set once bound
    cancel_requested: bool = False


SHARE_MIN_TOKENS = 32  # a shared uncached run this long is worth waiting one prefill for


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class Scheduler:
    """First-come, first-served admission of queued jobs into the model's pool (``bind_request``), up to
    ``max_batch_size`` running jobs; a job that does not fit yet stays queued until pages free up. Not locked: the
    engine serialises calls."""

    def __init__(self, model: LanguageModel, max_batch_size: int) -> None:
        self.model = model
        self.max_batch_size = max_batch_size
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []

    def admit(self) -> list[tuple[Job, BaseException]]:
        """Bind queued jobs while the batch has room and the pool has pages; returns the jobs that can never fit
        (removed from the queue) with their error."""
        failed: list[tuple[Job, BaseException]] = []
        pool, drafter = self.model.pool, self.model.drafter
        while self.waiting and len(self.running) < self.max_batch_size:
            job = self.waiting[0]
            if self.shares_a_prefill(job):
                break  # bind it once that prompt is cached (FCFS: the jobs behind it wait too)
            capacity = len(job.prompt) + job.limit
            try:
                rid = pool.bind_request(job.prompt, capacity)
            except KvCacheExhaustedError as exc:
                if not self.running:  # nothing will free pages: it never fits
                    self.waiting.popleft()
                    failed.append((job, exc))
                    continue
                break
            self.waiting.popleft()
            p = job.params
            seq = Sequence(self.model, job.prompt, pool.matched_prefix_len(rid), limit=job.limit,
                           temperature=p.temperature, top_p=p.top_p, logprobs=p.logprobs, seed=p.seed,
                           listener=job.listener, stop_ids=job.stop_ids, stop_texts=job.stop_texts,
                           speculative_tokens=job.speculative_tokens, draft_sampling=p.draft_sampling,
                           request_id=rid, capacity=capacity)
            if job.speculative_tokens and drafter is not None:
                drafter.bind(seq)  # a full history pool only means this request decodes without drafts
            job.seq = seq
            self.running.append(job)
            notify(job.listener, "on_input_tokens", len(job.prompt))
            notify(job.listener, "on_cached_input_tokens", min(seq.matched, len(job.prompt)))
        return failed

    def shares_a_prefill(self, job: Job) -> bool:
        """Whether ``job``'s prompt shares at least SHARE_MIN_TOKENS positions beyond its matched prefix with a
        running job still prefilling (positions that job computes and will cache)."""
        if not self.model.pool.prefix_reuse_enabled:
            return False
        prompt = np.asarray(job.prompt)
        for other in self.running:
            seq = other.seq
            if seq is not None and seq.prefilled < len(seq.prompt):
                shared = common_prefix_len(prompt, np.asarray(seq.prompt))
                if shared >= seq.matched + SHARE_MIN_TOKENS:
                    return True
        return False

    def release(self, job: Job, insert: bool) -> None:
        """Take ``job`` out of the running set: finish it into the prefix tree (``insert``) or evict it."""
        seq = job.seq
        if job in self.running:
            self.running.remove(job)
        if seq is None:
            return
        if self.model.drafter is not None:
            self.model.drafter.release(seq)
        if insert:
            self.model.pool.finish_request(seq.request_id, seq.prompt + seq.tokens)
        else:
            self.model.pool.unbind_request(seq.request_id)
