"""``LanguageModel.generate`` behaviour on a tiny random Qwen3 (GQA, head_dim 16, q/k norm, byte tokenizer, no EOS):
input errors, prefix reuse, poison pages, seeds, logprobs, stops, length limits, the pool's capacity clamp,
listener order, cancellation and errors inside the forward. Every call leaves the pool clean."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from smile_llm.cache import KvCachePool
from smile_llm.serving.completion import Completion
from smile_llm.errors import GenerationCancelled
from smile_llm.serving.listener import GenerationListener
from smile_llm.language_model import LanguageModel

from tests.hf_zoo import PROMPT, assert_clean

pytest.importorskip("transformers")

N = 12


@pytest.fixture
def hf(zoo):
    return zoo("qwen3")


@pytest.fixture
def lm(hf) -> LanguageModel:
    return hf.load()


def gen(lm: LanguageModel, prompt, n: int = N, **kw) -> Completion:
    """generate() followed by the pool checks every call must pass."""
    c = lm.generate(prompt, n, **kw)
    assert_clean(lm.pool)
    assert len(c.tokens) <= n
    assert all(0 <= t < lm.config.vocab_size for t in c.tokens)
    return c


def with_pool(lm: LanguageModel, num_slots: int | None = None, **pool_kwargs) -> LanguageModel:
    """The same weights on a new pool (``num_slots`` defaults to the original's)."""
    p = lm.pool
    pool = KvCachePool(p.num_layers, num_slots or p.num_slots, p.num_kv_heads, p.head_dim, p.page_size,
                       p.device, p.dtype, **pool_kwargs)
    return LanguageModel(lm.config, lm.transformer, lm.tokenizer, pool, lm.backend)


class Recorder(GenerationListener):
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def on_input_tokens(self, n: int) -> None:
        self.events.append(("input", n))

    def on_cached_input_tokens(self, n: int) -> None:
        self.events.append(("cached", n))

    def on_generated_tokens(self, n: int) -> None:
        self.events.append(("generated", n))

    def on_thinking_tokens(self, n: int) -> None:
        self.events.append(("thinking", n))

    def on_text(self, chunk: str) -> None:
        self.events.append(("text", chunk))

    @property
    def chunks(self) -> list[str]:
        return [v for k, v in self.events if k == "text"]  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------- bad input
BAD_CALLS = {
    "empty ids": {"prompt": []},
    "empty text": {"prompt": ""},
    "negative id": {"prompt": [5, -1, 7]},
    "id == vocab_size": {"prompt": [5, 97]},
    "id > vocab_size": {"prompt": [10**6]},
    "text outside the vocabulary": {"prompt": "abc"},  # byte tokenizer with 97 ids: 'a' is 97
    "numpy id == vocab_size": {"prompt": np.array([3, 97])},
    "tensor negative id": {"prompt": torch.tensor([3, -2])},
    "bool ids": {"prompt": [True, False]},
    "float ids": {"prompt": [1.0, 2.0]},
    "nested ids": {"prompt": [[1, 2], [3, 4]]},
    "None prompt": {"prompt": None},
    "max_new_tokens -1": {"max_new_tokens": -1},
    "max_new_tokens 1.5": {"max_new_tokens": 1.5},
    "max_new_tokens True": {"max_new_tokens": True},
    "max_new_tokens None": {"max_new_tokens": None},
    "temperature -1": {"temperature": -1.0},
    "temperature nan": {"temperature": float("nan")},
    "temperature inf": {"temperature": float("inf")},
    "temperature str": {"temperature": "0.5"},
    "top_p 0": {"top_p": 0.0},
    "top_p 1.5": {"top_p": 1.5},
    "top_p -0.1": {"top_p": -0.1},
    "top_p nan": {"top_p": float("nan")},
    "stop float entry": {"stop": [1.5]},
    "stop None entry": {"stop": [None]},
    "stop bool entry": {"stop": [True]},
    "stop bytes entry": {"stop": [b"ab"]},
    "stop list entry": {"stop": [[1, 2]]},
    "prompt longer than the pool": {"prompt": list(range(97)) * 6},
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_raises_value_error_and_leaves_pool_clean(lm, case):
    kw = {"prompt": PROMPT, "max_new_tokens": 4}
    kw.update(BAD_CALLS[case])
    gen(lm, PROMPT[:12], 3)  # some content in the prefix tree first
    before = lm.pool.stats()
    with pytest.raises(ValueError):
        lm.generate(kw.pop("prompt"), kw.pop("max_new_tokens"), **kw)
    assert_clean(lm.pool)
    assert lm.pool.stats()["cached_tokens"] == before["cached_tokens"]
    assert gen(lm, PROMPT[:12], 3).stats["cached_tokens"] > 0  # still usable, cache intact


@pytest.mark.parametrize("stop", [3.0, object()], ids=["float", "object"])
def test_stop_of_wrong_type_not_iterable(lm, stop):
    with pytest.raises(ValueError):
        lm.generate(PROMPT, 2, stop=stop)


def test_stop_bytes_rejected(lm):
    with pytest.raises(ValueError):
        lm.generate(PROMPT, 2, stop=b"ab")


@pytest.mark.parametrize("kw", [{"temperature": True}, {"top_p": True}], ids=["temperature", "top_p"])
def test_bool_sampling_parameters_rejected(lm, kw):
    with pytest.raises(ValueError):
        lm.generate(PROMPT, 2, **kw)


def test_generate_batch_bad_input(lm):
    assert lm.generate_batch([], 4) == []
    for prompts, kw in [([PROMPT, []], {}), ([PROMPT, [97]], {}), ([PROMPT], {"temperature": -1}),
                        ([PROMPT], {"top_p": 0}), ([PROMPT], {"max_new_tokens": -1}), ([PROMPT], {"stop": [1.5]})]:
        with pytest.raises(ValueError):
            lm.generate_batch(prompts, **{"max_new_tokens": 4, **kw})
        assert_clean(lm.pool)


def test_generate_batch_larger_than_the_pool_queues_and_preempts(hf, lm):
    # 4 rows x 128 slots in the pool: five rows of 128 tokens never fit together; the scheduler admits what fits,
    # preempts the newest rows when the pool runs short mid-decode (their KV offloaded, then restored), and every
    # row gets exactly what the same batch gets on a pool large enough for all of it
    prompts = [PROMPT[i:] for i in range(5)]
    roomy = hf.load(max_batch_size=8)
    try:
        unconstrained = roomy.generate_batch(prompts, 128 - len(PROMPT))
        assert roomy.serving_loop.scheduler.preemptions == 0
    finally:
        roomy.close()
    rows = lm.generate_batch(prompts, 128 - len(PROMPT))
    assert [r.tokens for r in rows] == [r.tokens for r in unconstrained]
    assert sum(r.stats["preemptions"] for r in rows) == lm.serving_loop.scheduler.preemptions > 0
    assert_clean(lm.pool)


# ---------------------------------------------------------------------------------------------- prefix reuse
def test_repeated_prompt_reports_cached_tokens_and_same_output(lm):
    first = gen(lm, PROMPT, logprobs=True)
    assert first.stats["cached_tokens"] == 0
    rec = Recorder()
    second = gen(lm, PROMPT, logprobs=True, listener=rec)
    assert second.stats["cached_tokens"] > 0
    assert second.stats["cached_tokens"] < len(PROMPT)  # the last prompt token is always recomputed
    assert rec.events[:2] == [("input", len(PROMPT)), ("cached", second.stats["cached_tokens"])]
    assert (second.tokens, second.text, second.finish_reason) == (first.tokens, first.text, first.finish_reason)
    np.testing.assert_allclose(second.logprobs, first.logprobs, atol=1e-5)


def test_continuation_reuses_generated_tokens(lm, hf):
    """A follow-up prompt = prompt + completion + more reuses the KV written for the generated tokens too."""
    first = gen(lm, PROMPT)
    follow = PROMPT + first.tokens + [3, 14, 15, 92, 65]
    again = gen(lm, follow, 8)
    assert again.stats["cached_tokens"] > len(PROMPT)
    fresh = gen(hf.load(), follow, 8)
    assert fresh.stats["cached_tokens"] == 0
    assert again.tokens == fresh.tokens


@pytest.mark.parametrize("page_size", [4, 16])
def test_poison_pool_gives_identical_output(hf, page_size):
    """NaN-filled fresh pages: any read of a slot that was never written would poison the logits."""
    normal = hf.load(page_size=page_size)
    poison = with_pool(normal, fresh_page_fill="poison")
    assert poison.pool.fresh_page_fill == "poison"
    a, b = gen(normal, PROMPT, logprobs=True), gen(poison, PROMPT, logprobs=True)
    assert a.tokens == b.tokens and all(math.isfinite(x) for x in b.logprobs)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-6)
    # with prefix reuse: the same prompt again, and a continuation that shares a prefix
    for prompt in (PROMPT[:-3] + [1, 2, 3, 4, 5], PROMPT + a.tokens[:5] + [7]):
        a2, b2 = gen(normal, prompt, 6, logprobs=True), gen(poison, prompt, 6, logprobs=True)
        assert b2.stats["cached_tokens"] > 0
        assert a2.tokens == b2.tokens
        np.testing.assert_allclose(a2.logprobs, b2.logprobs, atol=1e-5)


def test_poison_pool_generate_batch(hf):
    normal = hf.load()
    poison = with_pool(normal, fresh_page_fill="poison")
    prompts = [PROMPT, PROMPT[:7], PROMPT[2:19]]
    want = [c.tokens for c in normal.generate_batch(prompts, 8)]
    assert [c.tokens for c in poison.generate_batch(prompts, 8)] == want
    assert_clean(poison.pool)


# ---------------------------------------------------------------------------------------------- sampling
def test_seeds_reproduce_and_differ(lm):
    kw = {"temperature": 0.8, "top_p": 0.9}
    a = gen(lm, PROMPT, seed=1234, **kw)
    b = gen(lm, PROMPT, seed=1234, **kw)
    c = gen(lm, PROMPT, seed=99, **kw)
    assert len(a.tokens) == N
    assert a.tokens == b.tokens and a.text == b.text
    assert a.tokens != c.tokens
    greedy = gen(lm, PROMPT)
    assert a.tokens != greedy.tokens  # the distribution is not degenerate, so sampling really sampled


def test_tiny_top_p_is_greedy(lm):
    greedy = gen(lm, PROMPT)
    assert gen(lm, PROMPT, temperature=1.0, top_p=1e-6, seed=7).tokens == greedy.tokens


def test_generate_batch_row_seeds(lm):
    """Row i of generate_batch samples with seed + i, like generate with that seed."""
    prompts = [PROMPT, PROMPT[:9], PROMPT[4:]]
    kw = {"temperature": 0.8, "top_p": 0.9}
    batch = lm.generate_batch(prompts, 8, seed=50, **kw)
    assert_clean(lm.pool)
    for i, (p, c) in enumerate(zip(prompts, batch)):
        assert gen(lm, p, 8, seed=50 + i, **kw).tokens == c.tokens


def _hf_logprobs(hf, prompt, tokens) -> torch.Tensor:
    logits = hf.logits(prompt + tokens)[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_logprobs_greedy_match_hf(lm, hf):
    c = gen(lm, PROMPT, logprobs=True)
    assert c.logprobs is not None and len(c.logprobs) == len(c.tokens) == N
    assert all(math.isfinite(x) and x <= 0 for x in c.logprobs)
    np.testing.assert_allclose(c.logprobs, _hf_logprobs(hf, PROMPT, c.tokens).numpy(), atol=1e-4)
    assert gen(lm, PROMPT).logprobs is None


def test_logprobs_sampled_are_raw_model_logprobs(lm, hf):
    c = gen(lm, PROMPT, logprobs=True, temperature=0.8, top_p=0.9, seed=3)
    assert len(c.logprobs) == len(c.tokens) == N
    assert all(math.isfinite(x) and x <= 0 for x in c.logprobs)
    np.testing.assert_allclose(c.logprobs, _hf_logprobs(hf, PROMPT, c.tokens).numpy(), atol=1e-4)


# ---------------------------------------------------------------------------------------------- stops / length
def _first_new(tokens: list[int], at_least: int) -> int:
    return next(i for i in range(at_least, len(tokens)) if tokens[i] not in tokens[:i])


def test_stop_token_ids(lm):
    full = gen(lm, PROMPT)
    k = _first_new(full.tokens, 3)
    for stop in (full.tokens[k], [full.tokens[k]], [full.tokens[k], 3], (full.tokens[k], "\x00never")):
        c = gen(lm, PROMPT, stop=stop, logprobs=True)
        assert c.tokens == full.tokens[:k]
        assert c.finish_reason == "stop"
        assert len(c.logprobs) == k
        assert c.text == lm.tokenizer.decode(full.tokens[:k])
    with pytest.raises(ValueError, match="stop entries"):
        gen(lm, PROMPT, stop=[full.tokens[k], 10**6])  # an id outside the vocabulary can never be sampled


def test_stop_strings(lm):
    full = gen(lm, PROMPT)
    assert full.finish_reason == "length" and full.text == lm.tokenizer.decode(full.tokens)
    for start, length in ((3, 1), (4, 2), (5, 3)):
        s = full.text[start : start + length]
        at = full.text.find(s)
        rec = Recorder()
        c = gen(lm, PROMPT, stop=[s], listener=rec)
        assert c.finish_reason == "stop"
        assert c.text == full.text[:at] and s not in c.text
        assert full.tokens[: len(c.tokens)] == c.tokens  # a prefix of the unconstrained output
        assert "".join(rec.chunks) == c.text and all(rec.chunks)
    # a stop string given alone, and one that never occurs
    assert gen(lm, PROMPT, stop=full.text[4:6]).text == full.text[: full.text.find(full.text[4:6])]
    never = gen(lm, PROMPT, stop=["\x7f\x7f\x7f\x7f"])
    assert never.finish_reason == "length" and never.text == full.text
    assert gen(lm, PROMPT, stop=["", []][0]).tokens == full.tokens  # empty stop strings are ignored


def test_max_new_tokens_ends_with_length(lm):
    for n in (1, 5, N):
        c = gen(lm, PROMPT, n)
        assert len(c.tokens) == n and c.finish_reason == "length"
        assert c.stats["generated_tokens"] == n


def test_max_new_tokens_zero_generates_nothing(lm):
    rec = Recorder()
    c = gen(lm, PROMPT, 0, listener=rec, logprobs=True)
    assert c.tokens == [] and c.text == "" and c.logprobs == [] and c.finish_reason == "length"
    assert rec.events == [("input", len(PROMPT)), ("cached", 0)]
    assert [b.tokens for b in lm.generate_batch([PROMPT, PROMPT[:5]], 0)] == [[], []]
    assert_clean(lm.pool)


@pytest.mark.parametrize("prompt_len", [17, 31])
def test_small_pool_clamps_capacity(lm, prompt_len):
    """A 32-slot pool: the request is clamped and ends with "length" exactly at the pool limit."""
    small = with_pool(lm, num_slots=32)
    prompt = (PROMPT * 2)[:prompt_len]
    ref = gen(lm, prompt, 32 - prompt_len)
    c = gen(small, prompt, 40)
    assert c.finish_reason == "length"
    assert len(prompt) + len(c.tokens) == 32
    assert c.tokens == ref.tokens[: len(c.tokens)]
    again = gen(small, prompt, 40)  # the tree now holds the pages; they are evictable, so the clamp is the same
    assert again.tokens == c.tokens and again.stats["cached_tokens"] > 0


def test_prompt_filling_the_pool_generates_nothing(lm):
    small = with_pool(lm, num_slots=32)
    c = gen(small, (PROMPT * 2)[:32], 40)
    assert c.tokens == [] and c.finish_reason == "length"


def test_prompt_longer_than_small_pool(lm):
    small = with_pool(lm, num_slots=32)
    with pytest.raises(ValueError):
        small.generate((PROMPT * 2)[:33], 4)
    assert_clean(small.pool)


# ---------------------------------------------------------------------------------------------- listener
def test_listener_order_and_text_chunks(lm):
    rec = Recorder()
    c = gen(lm, PROMPT, listener=rec)
    assert rec.events[0] == ("input", len(PROMPT))
    assert rec.events[1] == ("cached", 0)
    rest = rec.events[2:]
    assert {k for k, _ in rest} <= {"generated", "text"}
    assert sum(v for k, v in rest if k == "generated") == len(c.tokens)  # type: ignore[misc]
    assert all(rec.chunks) and "".join(rec.chunks) == c.text
    # with a repeated prompt the cached count is reported once, second
    rec2 = Recorder()
    c2 = gen(lm, PROMPT, listener=rec2, stop=[c.text[6:9]])
    assert [k for k, _ in rec2.events].count("input") == 1 and [k for k, _ in rec2.events].count("cached") == 1
    assert rec2.events[:2] == [("input", len(PROMPT)), ("cached", c2.stats["cached_tokens"])]
    assert c2.stats["cached_tokens"] > 0
    assert all(rec2.chunks) and "".join(rec2.chunks) == c2.text


def test_duck_typed_listener(lm):
    chunks: list[str] = []

    class OnlyText:
        def on_text(self, chunk: str) -> None:
            chunks.append(chunk)

    c = gen(lm, PROMPT, listener=OnlyText())
    assert "".join(chunks) == c.text


@pytest.mark.parametrize("event", ["on_input_tokens", "on_cached_input_tokens"])
def test_listener_error_before_first_step_releases_kv(lm, event):
    class Boom:
        pass

    def boom(n):
        raise RuntimeError("listener failed")

    listener = Boom()
    setattr(listener, event, boom)
    with pytest.raises(RuntimeError, match="listener failed"):
        lm.generate(PROMPT, 4, listener=listener)
    assert_clean(lm.pool)


def test_listener_error_while_generating_releases_kv(lm):
    class Boom:
        def on_generated_tokens(self, n):
            raise RuntimeError("listener failed")

    with pytest.raises(RuntimeError, match="listener failed"):
        lm.generate(PROMPT, 4, listener=Boom())
    assert_clean(lm.pool)


# ---------------------------------------------------------------------------------------------- cancel / errors
def test_cancel_after_three_polls(lm, hf):
    polls = []

    def cancel() -> bool:
        polls.append(1)
        return len(polls) >= 3

    rec = Recorder()
    with pytest.raises(GenerationCancelled):
        lm.generate(PROMPT, N, cancel=cancel, listener=rec)
    assert len(polls) == 3
    assert_clean(lm.pool)
    # Smile's order: poll, forward, sample. Poll 1 -> prefill -> token 1; poll 2 -> decode -> token 2; poll 3 stops.
    assert sum(v for k, v in rec.events if k == "generated") == 2  # type: ignore[misc]
    # the prompt and the first decoded token were written (22 + 1 = 23 slots): 5 whole pages (20) are cached
    greedy = gen(hf.load(), PROMPT)
    c = gen(lm, PROMPT + greedy.tokens[:3], 4)
    assert c.stats["cached_tokens"] == 20
    assert c.tokens == greedy.tokens[3:7]


def test_cancel_at_first_poll_computes_nothing(lm):
    rec = Recorder()
    with pytest.raises(GenerationCancelled):
        lm.generate(PROMPT, N, cancel=lambda: True, listener=rec)
    assert_clean(lm.pool)
    assert not [k for k, _ in rec.events if k in ("generated", "text")]  # polled before the prefill
    assert gen(lm, PROMPT).stats["cached_tokens"] == 0  # nothing was written, nothing was cached
    assert gen(lm, PROMPT, cancel=lambda: False).stats["cached_tokens"] == 20  # floor_page(22 - 1), page 4


@pytest.mark.parametrize("fail_on_call", [1, 3])
def test_error_inside_forward_releases_and_inserts_nothing(lm, monkeypatch, fail_on_call):
    layer = lm.transformer.model.layers[1]
    real = layer.forward
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == fail_on_call:
            raise RuntimeError("injected forward failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(layer, "forward", flaky)
    with pytest.raises(RuntimeError, match="injected"):
        lm.generate(PROMPT, N)
    assert_clean(lm.pool)
    # a failed prefill caches nothing; after a failed decode step only the prompt (cached once it was written,
    # page-aligned) is in the tree, never a generated token
    cached = 0 if fail_on_call == 1 else (len(PROMPT) // lm.pool.page_size) * lm.pool.page_size
    assert lm.pool.prefix_insert_tokens == cached and lm.pool.stats()["cached_tokens"] == cached
    monkeypatch.setattr(layer, "forward", real)
    c = gen(lm, PROMPT)
    assert c.stats["cached_tokens"] == min(cached, ((len(PROMPT) - 1) // lm.pool.page_size) * lm.pool.page_size)
    assert len(c.tokens) == N


def test_error_inside_forward_keeps_earlier_cache(lm, monkeypatch):
    first = gen(lm, PROMPT)
    inserted = lm.pool.prefix_insert_tokens
    layer = lm.transformer.model.layers[0]
    real = layer.forward
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected forward failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(layer, "forward", flaky)
    other = PROMPT[:-2] + [60, 61, 62, 63, 64]
    with pytest.raises(RuntimeError, match="injected"):
        lm.generate(other, N)
    assert_clean(lm.pool)
    # the new prompt's written pages were cached after its prefill; the failed step added nothing
    assert lm.pool.prefix_insert_tokens - inserted <= len(other) - len(other) % lm.pool.page_size
    monkeypatch.setattr(layer, "forward", real)
    again = gen(lm, PROMPT)
    assert again.stats["cached_tokens"] > 0 and again.tokens == first.tokens


def test_error_inside_forward_in_generate_batch(lm, monkeypatch):
    layer = lm.transformer.model.layers[1]
    real = layer.forward
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:  # three prefills, then the second batched decode step
            raise RuntimeError("injected forward failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(layer, "forward", flaky)
    prompts = [PROMPT, PROMPT[:9], PROMPT[3:]]
    with pytest.raises(RuntimeError, match="injected"):
        lm.generate_batch(prompts, 8)
    assert_clean(lm.pool)
    # only the prompts' written KV was cached (cache_prefix after each prefill); no generated token reached the tree
    ids = [lm.encode(p) for p in prompts]
    for node in lm.pool.radix.nodes():
        path: list[int] = []
        while node is not None and node.parent is not None:
            path = [int(t) for t in node.key] + path
            node = node.parent
        assert any(p[: len(path)] == path for p in ids), path
