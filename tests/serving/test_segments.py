"""Registered segments end to end (``LanguageModel.register_segment``, ``segments=[...]``, ``docs/segments.md``):
registration holds the KV in the pool, requests lay segments out at page boundaries, a segment at 0 shares its pages
and reproduces full prefill exactly, a shifted segment's keys equal those the model computes for the segment alone
at that offset, generation with segments (batched, n samples, the engine, a drafter) releases everything, the prefix
tree never caches spliced KV, and every refusal binds nothing and leaves the pool's digest unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from smile_llm import InferenceEngine, KvCacheExhaustedError, LanguageModel, RequestTypeError, SamplingParams
from smile_llm.errors import SegmentError, SegmentUnsupportedError
from smile_llm.serving.segments import Segment, pad_token

DOC_A = "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n"  # 65 tokens
DOC_B = "class Stack:\n    def __init__(self):\n        self.items = []\n"  # 55 tokens
QUESTION = "def sub(a, b):\n"
NEW = 12


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.default(max_batch_size=4, max_seq_len=512)
    yield model
    model.close()


@pytest.fixture
def docs(lm):
    a, b = lm.register_segment(DOC_A), lm.register_segment(DOC_B)
    yield a, b
    lm.release_segment(a)
    lm.release_segment(b)
    assert_released(lm)


def assert_released(lm: LanguageModel, pins: int = 0) -> None:
    """Every request released: only ``pins`` segment bindings remain, the pool's pages all accounted for."""
    pool = lm.pool
    pool.check_invariants()
    assert pool.bound_request_count == pins
    assert lm.serving_loop.num_running == 0 and lm.serving_loop.num_waiting == 0
    if pins == 0:
        assert lm.drafter is not None and lm.drafter.pool.bound_request_count == 0
        assert pool.free_pages + pool.radix.total_size() // pool.page_size == pool.num_slots // pool.page_size


def test_registration_keeps_the_kv_in_the_pool_until_release(lm) -> None:
    pool = lm.pool
    ps = pool.page_size
    free = pool.free_pages
    seg = lm.register_segment(DOC_A)
    pool.check_invariants()
    assert isinstance(seg, Segment) and seg.tokens == tuple(lm.encode(DOC_A)) and seg.length == 65
    assert repr(seg) == f"Segment(segment_id={seg.segment_id}, length=65, binding={seg.binding})"
    assert pool.bound_request_count == 1 and pool.kv_len(seg.binding) == 65
    assert pool.matched_prefix_len(seg.binding) == 64  # its whole pages in the tree, locked by it
    assert len(pool.peek_prefix_slots(seg.tokens)) == 64
    assert pool.radix.protected_size >= 64
    assert pool.free_pages <= free - 65 // ps - 1
    pool.evict(10_000)  # locked: eviction cannot take it
    assert len(pool.peek_prefix_slots(seg.tokens)) == 64
    assert lm.runner.segments.live == (seg,)
    assert lm.release_segment(seg) is True
    assert lm.release_segment(seg) is False  # already released
    pool.check_invariants()
    assert pool.bound_request_count == 0 and lm.runner.segments.live == ()
    assert pool.evict(10_000) >= 64  # evictable now


def test_pieces_are_laid_out_with_each_segment_at_the_next_page_boundary(lm, docs) -> None:
    a, b = docs
    ps = lm.pool.page_size
    pad = pad_token(lm.tokenizer.encode, lm.config.eos_token_ids)
    assert pad == lm.encode(" ")[0]
    head = lm.encode("# notes\n")
    req = lm.request(QUESTION, SamplingParams(segments=["# notes\n", a, "\n", b, [10, 10]]))
    off_a, off_b = (s.offset for s in req.splices)
    assert [s.segment for s in req.splices] == [a, b]
    assert off_a == ps and off_b == -(-(off_a + a.length + 1) // ps) * ps
    tokens = req.prompt
    assert tokens[: len(head)] == head and tokens[len(head) : off_a] == [pad] * (off_a - len(head))
    assert tokens[off_a : off_a + a.length] == list(a.tokens) and tokens[off_a + a.length] == 10
    assert tokens[off_a + a.length + 1 : off_b] == [pad] * (off_b - off_a - a.length - 1)
    assert tokens[off_b : off_b + b.length] == list(b.tokens)
    assert tokens[off_b + b.length :] == [10, 10] + lm.encode(QUESTION)
    at_zero = lm.request(QUESTION, SamplingParams(segments=[a]))
    assert at_zero.splices[0].offset == 0 and at_zero.prompt == list(a.tokens) + lm.encode(QUESTION)
    assert SamplingParams(segments=[]) == SamplingParams()  # an empty list is no segments
    assert SamplingParams(segments=[np.array([1, 2]), torch.tensor([3])]).segments == ((1, 2), (3,))


def test_a_segment_at_zero_shares_its_pages_and_reproduces_full_prefill(lm, docs) -> None:
    a, _ = docs
    ps = lm.pool.page_size
    out = lm.generate(QUESTION, NEW, segments=[a])
    full = lm.generate(lm.request(QUESTION, SamplingParams(segments=[a])).prompt, NEW)
    assert out.tokens == full.tokens  # exact: the segment at 0 is what full prefill computes
    assert out.stats["cached_tokens"] >= a.length // ps * ps  # its whole pages: matched in the tree, not copied
    assert out.stats["spliced_tokens"] <= a.length % ps
    assert_released(lm, pins=2)


def test_a_shifted_segment_runs_and_the_tree_never_caches_spliced_kv(lm, docs) -> None:
    a, b = docs
    pool = lm.pool
    pieces = ["# notes\n", a, b]
    req = lm.request(QUESTION, SamplingParams(segments=pieces))
    first = req.splices[0].offset
    out = lm.generate(QUESTION, NEW, segments=pieces)
    assert len(out.tokens) == NEW and out.stats["spliced_tokens"] == a.length + b.length
    assert out.prompt_tokens == req.prompt
    assert_released(lm, pins=2)
    assert len(pool.peek_prefix_slots(req.prompt)) <= first  # nothing past the first shifted segment
    again = lm.generate(QUESTION, NEW, segments=pieces)
    assert again.tokens == out.tokens and again.stats["cached_tokens"] <= first


def test_spliced_keys_equal_the_keys_the_model_computes_for_the_segment_at_that_offset(lm, docs) -> None:
    """Direct computation: the same model runs the segment alone at positions ``[M, M + N)`` (RoPE offsets, a causal
    mask over the segment only: the hidden states the registration saw at ``[0, N)``); the splice turns the
    registered keys by M. They agree within float32 noise, on every layer (keys copied unturned would not: the
    last check)."""
    a, _ = docs
    pool, n = lm.pool, a.length
    for offset in (16, 256):
        prompt = [32] * offset + list(a.tokens) + [10]

        unturned: list[torch.Tensor] = []

        def body() -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            rid = pool.bind_request(prompt, len(prompt), reuse_prefix=False)
            direct_id = pool.bind_request(list(a.tokens) + [10], n + 1, reuse_prefix=False)
            try:
                pool.activate_step(rid)
                text = torch.tensor([prompt[:offset]])
                lm.transformer(text, np.array([0]), pool, lm.backend)
                pool.splice_kv(rid, offset, a.binding, 0, n, lm.runner.segments.rotation)
                spliced = [pool.get(layer, offset + n)[0][0, offset:] for layer in range(pool.num_layers)]
                pool.activate_step(direct_id)
                mask = torch.from_numpy(np.tril(np.ones((n, n), dtype=bool)).reshape(-1))
                lm.transformer(torch.tensor([list(a.tokens)]), np.array([0]), pool, lm.backend,
                               offsets=np.arange(offset, offset + n)[None], mask=mask)
                direct = [pool.get(layer, n)[0][0] for layer in range(pool.num_layers)]
                pool.activate_step(a.binding)
                unturned.append(pool.get(0, n)[0][0])
                return spliced, direct
            finally:
                pool.unbind_request(rid)
                pool.unbind_request(direct_id)

        spliced, direct = lm.serving_loop.run_between_steps(body)
        for layer, (s, d) in enumerate(zip(spliced, direct)):
            err = float((s - d).abs().max() / d.abs().max())
            assert err < 5e-5, (offset, layer, err)  # measured at most 6e-6
        assert float((unturned[0] - direct[0]).abs().max() / direct[0].abs().max()) > 0.1
    assert_released(lm, pins=2)


def test_batches_samples_chat_and_the_engine_release_everything(lm, docs) -> None:
    a, b = docs
    pieces = ["# notes\n", a, "\n", b]
    alone = lm.generate(QUESTION, NEW, segments=pieces)
    batch = lm.generate_batch([QUESTION, "def div(a, b):\n"], NEW, segments=pieces)
    assert batch[0].tokens == alone.tokens and all(c.stats["spliced_tokens"] == a.length + b.length for c in batch)
    samples = lm.generate(QUESTION, NEW, segments=pieces, n=2, temperature=0.8, seed=5)
    assert len(samples) == 2 and all(len(c.tokens) == NEW for c in samples)
    with InferenceEngine(lm, max_batch_size=2) as engine:
        got = engine.generate(QUESTION, SamplingParams(max_new_tokens=NEW, segments=pieces))
        running = engine.submit(QUESTION, SamplingParams(max_new_tokens=64, segments=pieces))
        late = lm.register_segment("# registered while the engine's thread steps\n")  # between two steps
        with_late = engine.generate(QUESTION, SamplingParams(max_new_tokens=NEW, segments=[late, a]))
        assert running.result().stats["spliced_tokens"] == a.length + b.length
        assert with_late.stats["spliced_tokens"] >= a.length
        assert lm.release_segment(late)
    assert got.tokens == alone.tokens
    plain = lm.generate(QUESTION, NEW, segments=pieces, speculative_tokens=0)
    assert plain.tokens == alone.tokens  # speculation never changes greedy output
    messages = [{"role": "user", "content": "What does add do?"}]
    chat = lm.chat(messages, NEW, segments=pieces)  # the pieces come before the rendered conversation
    assert chat.prompt_tokens == lm.request(lm.encode_chat(messages), SamplingParams(segments=pieces)).prompt
    assert chat.stats["spliced_tokens"] == a.length + b.length
    assert_released(lm, pins=2)


def test_refusals_bind_nothing_and_leave_the_pool_unchanged(lm, docs) -> None:
    a, _ = docs
    pool = lm.pool
    other = LanguageModel.default(max_batch_size=1, max_seq_len=256)
    try:
        foreign = other.register_segment(DOC_A)
        digest = pool.state_digest()
        with pytest.raises(SegmentError, match="registered with another model"):
            lm.generate(QUESTION, NEW, segments=[foreign])
        with pytest.raises(SegmentError, match="another model"):
            lm.release_segment(foreign)
        with pytest.raises(SegmentError, match="prompt_logprobs"):
            lm.generate(QUESTION, NEW, segments=[a], prompt_logprobs=1)
        with pytest.raises(RequestTypeError, match=r"segments\[1\] must be"):
            lm.generate(QUESTION, NEW, segments=[a, 3.5])
        with pytest.raises(RequestTypeError, match="segments must be a list"):
            lm.generate(QUESTION, NEW, segments=a)
        with pytest.raises(ValueError, match="outside the vocabulary"):
            lm.generate(QUESTION, NEW, segments=[a, [10, 999]])
        with pytest.raises(SegmentError, match="must be a Segment"):
            lm.release_segment("not a segment")
        with pytest.raises(ValueError, match="empty"):
            lm.register_segment("")
        with pytest.raises(ValueError, match="leaves no room"):
            lm.register_segment([65] * lm.max_seq_len)
        with pytest.raises(ValueError, match="exceeds max_seq_len"):
            lm.generate(QUESTION, NEW, segments=[a] * 8)
        assert pool.state_digest() == digest
        # released while a request that names it waits: that request fails alone, everything released
        c = other.register_segment(DOC_B)
        solo = other.generate(QUESTION, NEW).tokens
        handle = other.submit(QUESTION, SamplingParams(max_new_tokens=NEW, segments=["#\n", c]))
        plain = other.submit(QUESTION, SamplingParams(max_new_tokens=NEW))  # prefilled in the same step
        other.release_segment(c)
        with pytest.raises(SegmentError, match="was released"):
            handle.result(timeout=60)
        assert plain.result(timeout=60).tokens == solo
        with pytest.raises(SegmentError, match="was released"):
            other.generate(QUESTION, NEW, segments=[c])
        other.release_segment(foreign)
        assert_released(other)
    finally:
        other.close()


def test_no_room_to_register_allocates_nothing() -> None:
    small = LanguageModel.default(max_batch_size=1, max_seq_len=128)
    try:
        pool = small.pool
        held = pool.alloc(pool.free_slots - 2 * pool.page_size)  # leave two pages
        digest = pool.state_digest()
        with pytest.raises(KvCacheExhaustedError):
            small.register_segment(DOC_A)  # 65 tokens need five pages
        assert pool.state_digest() == digest
        pool.check_invariants()
        pool.free(held)
    finally:
        small.close()


def test_a_hybrid_model_refuses_segments_naming_why() -> None:
    hybrid = LanguageModel.default("hybrid", max_batch_size=1, max_seq_len=256)
    try:
        digest = hybrid.pool.state_digest()
        with pytest.raises(SegmentUnsupportedError, match="Gated DeltaNet layers carry a recurrent state"):
            hybrid.register_segment(DOC_A)
        with pytest.raises(SegmentUnsupportedError, match="recurrent state"):
            hybrid.generate(QUESTION, NEW, segments=["# notes\n"])
        assert hybrid.pool.state_digest() == digest and hybrid.pool.bound_request_count == 0
    finally:
        hybrid.close()
