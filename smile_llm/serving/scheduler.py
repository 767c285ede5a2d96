"""Scheduler: the one owner of every request's life in the model's pools, whoever submitted it.

``generate``, ``generate_batch``, ``InferenceEngine`` and the JVM all queue validated requests here
(through the model's ``ServingLoop``); only the scheduler binds, prefills, steps, preempts, finishes
and releases. Each ``step``:

1. applies cancellations (``RequestHandle.cancel`` from a listener, a request's ``cancel`` hook
   returning True);
2. admits: first resumes preempted rows (oldest first), then binds queued requests first come, first
   served with ``bind_request`` (prefix reuse; capacity for the prompt plus
   ``ADMIT_DECODE_TOKENS``), while the batch has room and the pool has pages; a request that does
   not fit waits, one that can never fit fails with KvCacheExhaustedError;
3. prefills up to ``prefill_tokens_per_step`` prompt tokens (chunked; whole short remainders
   together in padded forwards);
4. reserves each decoding row's next window: a row's capacity grows ``GROW_DECODE_TOKENS`` at a time
   (``grow_request``); when the pool is short, the most recently admitted running row is preempted
   (its private KV offloaded to host memory with ``offload_request``, restored byte-identical later,
   so its output is unchanged);
5. advances every decoding row by one forward (``ModelRunner.step``: speculative rounds where rows
   draft);
6. finishes rows that are done (``finish_request`` inserts their KV into the prefix tree) and fails
   rows whose hooks raised, alone.

An exception of a shared forward fails the rows of that forward (their KV is evicted) and nothing
else. Not thread-safe: the ``ServingLoop`` serialises calls.

In-batch prefix sharing (SGLang's in-batch prefix caching check): a request whose prompt shares at
least SHARE_MIN_TOKENS uncached tokens with a running row that is still prefilling waits (with
everything behind it) until that prompt is written and cached, then binds and matches it. A burst
with one new system prompt computes it once.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from ..cache import KvCacheExhaustedError
from .model_runner import BATCHED_PREFILL_TOKENS, PREFILL_CHUNK
from ..errors import GenerationCancelled
from .request import RequestHandle
from .request_row import RequestRow
from .kv_fingerprint_log import KvEndHook, hook_from_env

if TYPE_CHECKING:
    from .context import ServingContext

LOGGER = logging.getLogger(__name__)

SHARE_MIN_TOKENS = 32  # a shared uncached run this long is worth waiting one prefill for
ADMIT_DECODE_TOKENS = 64  # decode positions bound with the prompt at admission
GROW_DECODE_TOKENS = 64  # positions added to a decoding row's capacity at a time
# requests advanced together unless an InferenceEngine sets another batch size
DEFAULT_MAX_RUNNING = 64


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


class Scheduler:
    """Admission, stepping, preemption and release of every request of one model (see the module
    docstring). ``max_running`` bounds the rows advanced together; ``prefill_tokens_per_step`` the
    prompt tokens prefilled per step. A queued request is its handle; once bound it is its
    ``RequestRow`` (which holds the handle)."""

    def __init__(self, context: ServingContext, max_running: int = DEFAULT_MAX_RUNNING,
                 prefill_tokens_per_step: int = PREFILL_CHUNK) -> None:
        self.context = context
        self.max_running = max_running
        self.prefill_tokens_per_step = prefill_tokens_per_step
        self.waiting: deque[RequestHandle] = deque()  # queued, first come first served
        self.running: list[RequestRow] = []  # bound and resident, in admission order
        self.preempted: list[RequestRow] = []  # bound, private KV offloaded, in admission order
        # every running or preempted row, by its handle
        self._bound: dict[RequestHandle, RequestRow] = {}
        self.preemptions = 0
        # requests ended so far (completed, failed or cancelled): waiters need waking when it moves
        self.ended = 0
        self._admissions = itertools.count(1)
        # run with a request's KV still bound, just before its release (SMILE_KV_FINGERPRINT=1)
        self.kv_end_hook: KvEndHook | None = hook_from_env()

    # ------------------------------------------------------------------ queries
    def has_work(self) -> bool:
        """Whether any request is queued, running or preempted."""
        return bool(self.waiting or self.running or self.preempted)

    def handles(self) -> list[RequestHandle]:
        """The handle of every request the scheduler holds (queued, running, preempted)."""
        return list(self.waiting) + [seq.handle for seq in self.running + self.preempted]

    def holds(self, handle: RequestHandle) -> bool:
        """Whether the scheduler still holds ``handle``'s request."""
        return handle in self._bound or handle in self.waiting

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
            try:
                self.context.runner.step(decoding)
            except Exception as exc:
                # a failed shared forward: its rows' KV may be partial, evict them
                for seq in decoding:
                    self.end(seq.handle, error=exc, insert=False)
        self._finish_done()
        return True

    # ------------------------------------------------------------------ admission
    def admit(self) -> None:
        """Resume preempted rows (oldest first), then bind queued requests first come, first served,
        while the batch has room and the pool has pages. A request that can never fit the pool fails
        with KvCacheExhaustedError."""
        pool = self.context.pool
        while self.preempted and len(self.running) < self.max_running:
            seq = self.preempted[0]
            assert seq.offload is not None
            try:
                pool.restore_request(seq.request_id, seq.offload)
            except KvCacheExhaustedError:
                return  # FCFS: nothing newer is admitted before it
            self.preempted.pop(0)
            seq.offload = None
            self._run(seq)
        total = pool.num_slots
        while self.waiting and len(self.running) < self.max_running:
            handle = self.waiting[0]
            req = handle.request
            final_len = len(req.prompt) + req.max_new_tokens
            if self._pages(final_len) * pool.page_size > total:
                self.waiting.popleft()
                self.end(handle, error=KvCacheExhaustedError(
                    f"a request of {len(req.prompt)} prompt tokens and up to {req.max_new_tokens} "
                    f"new ones needs {self._pages(final_len)} pages; the pool has "
                    f"{total // pool.page_size} in all"))
                continue
            if self.shares_a_prefill(req.prompt, req.params.prompt_logprobs is not None):
                break  # bind it once that prompt is cached (FCFS: the requests behind it wait too)
            capacity = min(final_len, len(req.prompt) + ADMIT_DECODE_TOKENS)
            try:
                rid = pool.bind_request(req.prompt, capacity,
                                        reuse_prefix=req.params.prompt_logprobs is None)
            except KvCacheExhaustedError as exc:
                # nothing will free pages: it never fits
                if not self.running and not self.preempted:
                    self.waiting.popleft()
                    self.end(handle, error=exc)
                    continue
                break
            self.waiting.popleft()
            bound = self._pages(capacity) * pool.page_size
            try:
                seq = self.context.row(handle, rid, pool.matched_prefix_len(rid),
                                            min(bound, final_len))
            except Exception as exc:  # this request alone (its grammar could not start, say)
                pool.unbind_request(rid)
                self.end(handle, error=exc)
                continue
            seq.admitted = next(self._admissions)
            self._bound[handle] = seq
            if seq.speculative_tokens:
                # a full draft pool only means this request decodes plainly; so does a drafter that
                # raises
                self.context.runner.drafting.bind(seq, final_len)
            self._run(seq)
            seq.notify("on_input_tokens", len(req.prompt))
            seq.notify("on_cached_input_tokens", min(seq.matched, len(req.prompt)))

    def _pages(self, tokens: int) -> int:
        return -(-tokens // self.context.pool.page_size)

    def _run(self, seq: RequestRow) -> None:
        """Put ``seq`` into the running set, keeping admission order."""
        self.running.append(seq)
        self.running.sort(key=lambda s: s.admitted)

    def shares_a_prefill(self, prompt_ids: list[int], wants_prompt_logprobs: bool = False) -> bool:
        """Whether a queued prompt shares at least SHARE_MIN_TOKENS positions beyond the matched
        prefix with a running row still prefilling (positions that row computes and will cache). On
        a pool with per-request state (a hybrid model) a match can only end where the other prompt's
        state snapshot will be, at the last page boundary of that prompt, so the request waits only
        when it shares that much."""
        pool = self.context.pool
        if not pool.prefix_reuse_enabled or wants_prompt_logprobs:
            return False  # (a request for prompt logprobs computes its whole prompt anyway)
        prompt = np.asarray(prompt_ids)
        for seq in self.running:
            if seq.prefilled < len(seq.prompt):
                shared = common_prefix_len(prompt, np.asarray(seq.prompt))
                if pool.state_pools:  # reusable only up to the other prompt's snapshot
                    end = len(seq.prompt) // pool.page_size * pool.page_size
                    shared = end if shared >= end and len(prompt) > end else 0
                if shared >= seq.matched + SHARE_MIN_TOKENS:
                    return True
        return False

    # ------------------------------------------------------------------ prefill
    def _prefill(self) -> list[RequestRow]:
        """Prefill within the step's budget, first come, first served; returns the rows that decode
        this step."""
        runner = self.context.runner
        budget = self.prefill_tokens_per_step
        decoding: list[RequestRow] = []
        whole: list[RequestRow] = []
        for seq in list(self.running):
            if seq.remaining == 0:
                # finished, or asked for no tokens: ended by _finish_done without a forward
                continue
            if seq.prefilled < len(seq.prompt):
                left = len(seq.prompt) - seq.prefilled
                if budget <= 0:
                    continue
                # prefilled below, with the others like it (a row that splices segments alone: a
                # segment it cannot use fails that row only)
                if left <= min(budget, BATCHED_PREFILL_TOKENS) and not seq.splices:
                    whole.append(seq)
                    budget -= left
                    continue
                before = seq.prefilled
                try:
                    if runner.prefill(seq, budget):
                        self._prefilled(seq)
                except Exception as exc:
                    self.end(seq.handle, error=exc, insert=False)
                budget -= seq.prefilled - before
            elif seq.remaining > 0:
                decoding.append(seq)
        if whole:
            try:
                runner.prefill_together(whole)
            except Exception as exc:
                for seq in whole:
                    self.end(seq.handle, error=exc, insert=False)
                return decoding
            for seq in whole:
                self._prefilled(seq)
        return decoding

    def _prefilled(self, seq: RequestRow) -> None:
        """A whole prompt is written: take the first token and cache the prompt (up to its first
        shifted segment, ``RequestRow.cacheable``), so later binds can match it."""
        seq.take_next()
        self.context.pool.cache_prefix(seq.request_id, seq.cacheable(seq.prompt))

    # ------------------------------------------------------------------ capacity and preemption
    def _reserve(self, decoding: list[RequestRow]) -> list[RequestRow]:
        """Grow each decoding row's capacity to hold its next window (oldest rows first), preempting
        the most recently admitted running rows while the pool is short. Returns the rows that
        decode this step."""
        pool = self.context.pool
        for seq in sorted(decoding, key=lambda s: s.admitted):
            if seq not in self.running:
                continue  # preempted for an older row
            need = seq.last_pos + 1  # a plain step writes the last token's KV
            want = need + seq.round_span()
            while seq.capacity < want:
                target = min(seq.final_len, self._pages(want + GROW_DECODE_TOKENS) * pool.page_size)
                try:
                    seq.capacity = min(seq.final_len, pool.grow_request(seq.request_id, target))
                    break
                except KvCacheExhaustedError:
                    pass
                if seq.capacity >= need:
                    break  # a shorter speculative window (or a plain step) fits this step
                victim = self.running[-1]
                if victim is seq and len(self.running) == 1:
                    self.end(seq.handle, error=KvCacheExhaustedError(
                        f"request {seq.handle.request_number} needs a page more at position {need} "
                        "and no other request can make room"), insert=False)
                    break
                self.preempt(victim)
                if victim is seq:
                    break
        return [seq for seq in decoding if seq in self.running and not seq.finished]

    def preempt(self, seq: RequestRow) -> None:
        """Pause a running row: offload its private KV to host memory (``offload_request``; restored
        byte-identical by ``admit``) and move it to the preempted list. Its draft history stays
        bound."""
        seq.offload = self.context.pool.offload_request(seq.request_id)
        self.running.remove(seq)
        self.preempted.append(seq)
        self.preempted.sort(key=lambda s: s.admitted)
        seq.preemptions += 1
        self.preemptions += 1

    # ------------------------------------------------------------------ ending requests
    def _finish_done(self) -> None:
        """Complete finished rows, fail rows whose hooks raised, apply cancellations made during the
        step."""
        for seq in list(self.running):
            if seq.error is not None:
                self.end(seq.handle, error=seq.error)
            elif seq.handle.cancel_requested:
                self.cancel(seq.handle)
            elif seq.remaining == 0 and (seq.prefilled == len(seq.prompt) or not seq.tokens):
                # flushes the held-back text: the listener may still fail it
                completion = seq.completion()
                self.end(seq.handle, error=seq.error)
                if seq.error is None:
                    seq.handle._set_result(completion)
        self._apply_cancellations(poll=False)

    def _apply_cancellations(self, poll: bool = True) -> None:
        """Cancel every request whose handle was cancelled from the serving thread or (``poll``,
        once per step before any forward) whose ``cancel`` hook returns True; a hook that raises
        fails its request with that error."""
        for handle in self.handles():
            hook = handle.request.cancel
            if poll and not handle.cancel_requested and hook is not None:
                try:
                    stop = bool(hook())
                except Exception as exc:
                    self.end(handle, error=exc)
                    continue
                if stop:
                    self.end(handle, error=GenerationCancelled(
                        "aborted: cancel() returned True between steps; KV released"))
                    continue
            if handle.cancel_requested:
                self.cancel(handle)

    def cancel(self, handle: RequestHandle) -> None:
        """End ``handle``'s request with GenerationCancelled; its KV (whole between steps) goes into
        the prefix tree."""
        self.end(handle, error=GenerationCancelled(
            f"request {handle.request_number} was cancelled; its KV was released"))

    def fail_all(self, error: BaseException) -> None:
        """End every request with ``error``, evicting its KV; a request whose release fails too
        still gets ``error``."""
        for handle in self.handles():
            try:
                self.end(handle, error=error, insert=False)
            except Exception:  # noqa: BLE001 - the pool itself is broken; the handle must still end
                seq = self._bound.pop(handle, None)
                if handle in self.waiting:
                    self.waiting.remove(handle)
                for rows in (self.running, self.preempted):
                    if seq is not None and seq in rows:
                        rows.remove(seq)
                handle._set_error(error)
                self.ended += 1

    def end(self, handle: RequestHandle, error: BaseException | None = None,
            insert: bool = True) -> None:
        """Take ``handle``'s request out of the scheduler and release its bindings: its written KV
        is inserted into the prefix tree (``insert``, KV whole) or evicted. With ``error`` the
        handle raises it. Does nothing for a request the scheduler no longer holds."""
        if handle in self.waiting:
            self.waiting.remove(handle)
        seq = self._bound.pop(handle, None)
        if seq is not None:
            if seq in self.running:
                self.running.remove(seq)
            if seq in self.preempted:
                self.preempted.remove(seq)
            seq.release_grammar_state()
            runner = self.context.runner
            runner.drafting.release(seq)
            if seq.adaptive:
                runner.policy.forget(seq)
            pool = self.context.pool
            if self.kv_end_hook is not None and seq.offload is None:
                try:  # an observer: its failure must not keep the row bound or its waiter waiting
                    self.kv_end_hook(pool, seq)
                except Exception:  # noqa: BLE001 - logged; the request ends as it would have
                    LOGGER.exception("the KV end hook failed for request %d", seq.request_id)
            if insert and seq.offload is None:
                pool.finish_request(seq.request_id, seq.cacheable(seq.prompt + seq.tokens))
            else:
                pool.unbind_request(seq.request_id)
            seq.offload = None
        if error is not None:
            handle._set_error(error)
        self.ended += 1
