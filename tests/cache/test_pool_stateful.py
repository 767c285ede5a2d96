"""Random sequences of every pool verb against a shadow model of what each request must read back.

The value written at position ``p`` of a request is a function of its tokens ``seq[:p + 1]`` only, so KV reached
through a prefix match must equal what the request would have written itself. After every step the pool's
invariants hold, every resident request reads back exactly its expected K/V for ``[0, kv_len)`` (and for the gap
writes it made past ``kv_len``), never-written private slots read as NaN (``fresh_page_fill="poison"``), caller
pages keep their bytes, and a call that raised changed nothing.
"""

from __future__ import annotations

import os
import zlib

import numpy as np
import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from smile_llm.cache import KvCacheExhaustedError, KvCachePool, StatePool, StateSpec

from .snapshot import assert_same_state, pool_snapshot

SCALE = os.environ.get("SMILE_TEST_SCALE", "full")
EXAMPLES = 40 if SCALE == "ci" else 100
TOKENS = st.lists(st.integers(1, 3), min_size=1, max_size=14)
SYSTEM_PROMPTS = [[1, 2, 3, 1], [2, 2, 1, 3, 3, 1], [3]]
PROMPTS = st.builds(lambda head, tail: head + tail, st.sampled_from(SYSTEM_PROMPTS),
                    st.lists(st.integers(1, 3), min_size=1, max_size=8))  # shared heads make prefix hits common


def value_of(tokens: np.ndarray) -> float:
    """Deterministic KV value of the last position of ``tokens`` (exact in float32)."""
    return float(zlib.crc32(tokens.astype(np.int64).tobytes()) % 100_000 + 1)


class Request:
    def __init__(self, seq: np.ndarray) -> None:
        self.seq = seq  # tokens for every position up to capacity
        self.gap_writes: set[int] = set()  # written positions past kv_len (still hold their values)
        self.zeroed: set[int] = set()  # rejected positions zeroed by truncate_to


class PoolMachine(RuleBasedStateMachine):
    @initialize(page_size=st.sampled_from([1, 2, 4]), num_pages=st.integers(4, 16), zero=st.booleans(),
                state_slots=st.sampled_from([None, 1, 2, 5]), snapshots=st.sampled_from([0, 1, 3]))
    def setup(self, page_size: int, num_pages: int, zero: bool, state_slots: int | None, snapshots: int) -> None:
        self.ps = page_size
        self.pool = KvCachePool(2, page_size * num_pages, 1, 1, page_size, fresh_page_fill="poison",
                                zero_rejected_kv=zero)
        # a per-request state pool bound with every request (fewer slots than pages: binds also run out of slots);
        # its prefix snapshots decide where matches may end
        self.states = None if state_slots is None else StatePool({"s": StateSpec((3,))}, state_slots,
                                                                 snapshots=snapshots)
        if self.states is not None:
            self.pool.attach_state(self.states)
        self.requests: dict[int, Request] = {}
        self.caller: dict[int, bytes] = {}  # caller page -> layer-0 K bytes written into it
        self.handles: dict[int, object] = {}

    # ------------------------------------------------------------------ helpers
    def attempt(self, fn, *args, expected=(KvCacheExhaustedError,)):
        before = pool_snapshot(self.pool)
        try:
            return True, fn(*args)
        except expected:
            assert_same_state(before, pool_snapshot(self.pool))
            return False, None

    def write(self, starts: list[int], n: int) -> None:
        ids = self.pool._step.ids
        vals = np.zeros((len(ids), n), dtype=np.float32)
        for row, (rid, start) in enumerate(zip(ids, starts)):
            seq = self.requests[rid].seq
            vals[row] = [value_of(seq[: p + 1]) for p in range(start, start + n)]
        k = torch.from_numpy(vals).view(len(ids), n, 1, 1)
        self.pool.put(0, starts, k, -k)
        self.pool.put(1, starts, -k, k)

    def resident(self) -> list[int]:
        return [rid for rid in self.requests if rid not in self.handles]

    def released_by_exclusive(self) -> None:
        for rid in list(self.requests):
            if not self.pool.is_bound(rid):
                del self.requests[rid]
                self.handles.pop(rid, None)

    # ------------------------------------------------------------------ rules
    @rule(prompt=PROMPTS, extra=st.integers(0, 10), more=TOKENS, exclusive=st.booleans())
    def bind(self, prompt: list[int], extra: int, more: list[int], exclusive: bool) -> None:
        self.bind_one(prompt, extra, more, exclusive)

    def bind_one(self, prompt: list[int], extra: int, more: list[int], exclusive: bool) -> int | None:
        capacity = len(prompt) + extra
        seq = np.array((prompt + more * 30)[: capacity + self.ps], dtype=np.int64)
        verb = self.pool.bind_with_prefix if exclusive else self.pool.bind_request
        # bind_request refuses only for lack of pages; bind_with_prefix clamps, and refuses (ValueError) only
        # when even the prompt does not fit.
        refusal = ValueError if exclusive else KvCacheExhaustedError
        ok, result = self.attempt(verb, prompt, capacity, expected=(refusal,))
        if not ok:
            event("bind refused")
            return None
        rid = self.pool._step.ids[0] if exclusive else result
        self.released_by_exclusive()
        self.requests[rid] = Request(seq)
        matched = self.pool.matched_prefix_len(rid)
        if self.states is not None:  # a slot starts from the state after the matched prefix; mark it with the id
            state = self.states.buffers["s"][self.states.slot(rid)]
            assert (state == (value_of(seq[:matched]) if matched else 0.0)).all(), f"restored {state} at {matched}"
            state.fill_(float(rid))
        assert matched % self.ps == 0 and matched <= max(0, len(prompt) - 1)
        assert self.pool.kv_len(rid) == matched
        event("bind matched a cached prefix" if matched else "bind missed")
        return rid

    @rule(prompt=PROMPTS, generated=st.integers(1, 6), more=TOKENS, exclusive=st.booleans())
    def serve(self, prompt: list[int], generated: int, more: list[int], exclusive: bool) -> None:
        """A whole request: bind, compute the prompt and all generated tokens but the last sampled one, finish."""
        rid = self.bind_one(prompt, generated, more, exclusive)
        if rid is None:
            return
        self.pool.activate_step(rid)
        start = self.pool.kv_len(rid)
        end = min(len(prompt) + generated - 1, self.pool._table.get(rid).capacity)  # exclusive binds clamp
        if end > start:
            self.write([start], end - start)
        aligned = end // self.ps * self.ps
        if self.states is not None and aligned > start:  # the forward's snapshot at the last page boundary
            self.keep_snapshot(rid, aligned)
        self.finish_one(rid, len(prompt) + generated)

    @rule(data=st.data())
    def activate(self, data: st.DataObject) -> None:
        resident = self.resident()
        if resident:
            ids = data.draw(st.lists(st.sampled_from(resident), min_size=1, max_size=3, unique=True))
            self.pool.activate_step(*ids)

    @rule(n=st.integers(1, 6), gap=st.integers(0, 2))
    def put(self, n: int, gap: int) -> None:
        step = self.pool._step
        if step is None:
            return
        starts = [self.pool.kv_len(rid) + gap for rid in step.ids]
        if any(s + n > self.pool._table.get(rid).capacity for rid, s in zip(step.ids, starts)):
            before = pool_snapshot(self.pool)
            k = torch.zeros(step.batch, n, 1, 1)
            try:
                self.pool.put(0, starts, k, k)
                raise AssertionError("put past capacity did not raise")
            except KvCacheExhaustedError:
                assert_same_state(before, pool_snapshot(self.pool))
            return
        kv_before = {rid: self.pool.kv_len(rid) for rid in step.ids}
        self.write(starts, n)
        for rid, start in zip(step.ids, starts):
            self.requests[rid].zeroed -= set(range(start, start + n))
        for rid, start in zip(step.ids, starts):
            if gap:
                self.requests[rid].gap_writes.update(range(start, start + n))
                assert self.pool.kv_len(rid) == kv_before[rid]
            else:
                assert self.pool.kv_len(rid) == start + n

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        """A speculative round's rejection: seal each row somewhere in [matched, kv_len]."""
        step = self.pool._step
        if step is None:
            return
        kv = [self.pool.kv_len(rid) for rid in step.ids]
        sealed = [data.draw(st.integers(int(m), k)) for m, k in zip(step.matched, kv)]
        self.pool.truncate_to(sealed, kv)
        for rid, s_len, k_len in zip(step.ids, sealed, kv):
            req = self.requests[rid]
            rejected = set(range(s_len, k_len))
            if self.pool.zero_rejected_kv:
                req.zeroed |= rejected
                req.gap_writes -= rejected
            else:
                req.gap_writes |= rejected
            assert self.pool.kv_len(rid) == s_len

    @rule(data=st.data(), cut=st.integers(0, 20))
    def finish(self, data: st.DataObject, cut: int) -> None:
        if self.requests:
            rid = data.draw(st.sampled_from(sorted(self.requests)))
            self.finish_one(rid, self.pool.matched_prefix_len(rid) + cut)

    def finish_one(self, rid: int, length: int) -> None:
        seq = self.requests[rid].seq[:length]
        b = self.pool._table.get(rid)
        insert_len = (min(len(seq), self.pool.kv_len(rid)) // self.ps) * self.ps
        inserts = b.offload is None and self.pool.prefix_reuse_enabled
        cached = self.pool.radix.total_size()
        self.pool.finish_request(rid, seq)
        grew = self.pool.radix.total_size() - cached
        if inserts:  # the written, page-aligned prefix is now cached (by this finish or an earlier one)
            assert sum(s.matched for s in self.pool.radix.peek_prefix(seq[:insert_len])) == insert_len
            assert grew <= max(0, insert_len - b.matched_len)
        else:
            assert grew == 0
        event("finish inserted" if grew else "finish inserted nothing")
        del self.requests[rid]
        self.handles.pop(rid, None)
        assert not self.pool.is_bound(rid)

    @precondition(lambda self: self.states is not None)
    @rule(data=st.data())
    def snapshot(self, data: st.DataObject) -> None:
        """A forward's snapshot of a request's state after its written tokens (the state "value" of its prefix)."""
        resident = self.resident()
        if resident:
            rid = data.draw(st.sampled_from(resident))
            kv_len = self.pool.kv_len(rid)
            if kv_len and kv_len % self.ps == 0:
                self.keep_snapshot(rid, kv_len)

    def keep_snapshot(self, rid: int, length: int) -> None:
        state = self.states.buffers["s"][self.states.slot(rid)]
        state.fill_(value_of(self.requests[rid].seq[:length]))
        kept = self.states.snapshot(rid, length)
        event("snapshot kept" if kept else "snapshot skipped")
        state.fill_(float(rid))

    @rule(data=st.data())
    def unbind(self, data: st.DataObject) -> None:
        if self.requests:
            rid = data.draw(st.sampled_from(sorted(self.requests)))
            self.pool.unbind_request(rid)
            del self.requests[rid]
            self.handles.pop(rid, None)

    @rule()
    def unbind_all(self) -> None:
        self.pool.unbind_requests()
        self.requests.clear()
        self.handles.clear()

    @rule(on=st.booleans())
    def toggle_reuse(self, on: bool) -> None:
        self.pool.prefix_reuse_enabled = on

    @rule(n=st.integers(0, 9), fill=st.integers(0, 255))
    def alloc(self, n: int, fill: int) -> None:
        ok, slots = self.attempt(self.pool.alloc, n)
        if ok:
            assert len(slots) == -(-n // self.ps) * self.ps
            for page in np.unique(slots // self.ps):
                data = bytes([fill]) * (self.ps * 4)
                self.pool.write_page(0, int(page), data, data)
                self.caller[int(page)] = data

    @precondition(lambda self: self.caller)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        pages = data.draw(st.lists(st.sampled_from(sorted(self.caller)), min_size=1, unique=True))
        self.pool.free((np.array(pages)[:, None] * self.ps + np.arange(self.ps)).reshape(-1))
        for p in pages:
            del self.caller[p]

    @rule(data=st.data())
    def offload(self, data: st.DataObject) -> None:
        resident = self.resident()
        if resident:
            rid = data.draw(st.sampled_from(resident))
            self.handles[rid] = self.pool.offload_request(rid)  # every private page, byte for byte

    @precondition(lambda self: self.handles)
    @rule(data=st.data())
    def restore(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.handles)))
        ok, _ = self.attempt(self.pool.restore_request, rid, self.handles[rid])
        event("restore " + ("succeeded" if ok else "refused"))
        if ok:
            del self.handles[rid]

    @rule(n=st.integers(0, 12))
    def evict(self, n: int) -> None:
        evictable = self.pool.radix.evictable_size
        got = self.pool.evict(n)
        assert got >= min(n, evictable) and self.pool.radix.evictable_size == evictable - got

    # ------------------------------------------------------------------ invariants
    @invariant()
    def pool_is_consistent(self) -> None:
        self.pool.check_invariants()
        assert self.pool.bound_request_count == len(self.requests)
        if self.states is not None:  # each resident request holds its own slot, its mark kept across offloads
            assert self.states.bound_ids == set(self.resident())
            for rid in self.resident():
                assert (self.states.buffers["s"][self.states.slot(rid)] == float(rid)).all(), f"request {rid}"
        k_cache = self.pool.key_cache
        for rid in self.resident():
            b = self.pool._table.get(rid)
            req = self.requests[rid]
            kv_len = self.pool.kv_len(rid)
            positions = np.arange(b.capacity)
            slots = b.page_ids[positions // self.ps] * self.ps + positions % self.ps
            idx = torch.from_numpy(slots)
            got = k_cache[0, idx, 0, 0].numpy()
            # put() writes (K, V) = (x, -x) on layer 0 and (-x, x) on layer 1: all four must agree.
            value_cache = self.pool.value_cache
            for other in (-value_cache[0, idx, 0, 0], -k_cache[1, idx, 0, 0], value_cache[1, idx, 0, 0]):
                assert np.array_equal(got, other.numpy(), equal_nan=True), f"request {rid}: V or layer 1 disagree"
            for p in range(b.capacity):
                if p in req.zeroed and p >= kv_len:
                    assert got[p] == 0.0, f"request {rid} position {p} was rejected and zeroed but reads {got[p]}"
                elif p < kv_len or p in req.gap_writes:
                    assert got[p] == value_of(req.seq[: p + 1]), f"request {rid} position {p}: {got[p]}"
                elif p >= b.matched_len:
                    assert np.isnan(got[p]), f"request {rid} position {p} was never written but reads {got[p]}"
        for page, data in self.caller.items():
            assert self.pool.read_page(0, page)[0] == data


TestPoolStateMachine = PoolMachine.TestCase
TestPoolStateMachine.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
