"""InferenceEngine: continuous batching gives each request exactly its solo output; queueing, aborts, shutdown,
listeners, chunked prefill and failures never leak KV pages."""

from __future__ import annotations

import threading
import time

import pytest

from smile_llm import GenerationCancelled, KvCacheExhaustedError, LanguageModel
from smile_llm.engine import EngineShutdownError, InferenceEngine, SamplingParams

PROMPTS = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "# a comment\n" * 6,
    "x = 1\n",
    "    for i in range(10):\n        if i % 2 == 0:\n",
    "def main(argv=None):\n    parser = argparse.ArgumentParser()\n",
]
LENGTHS = [40, 25, 60, 15, 50, 33, 45]


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.default(max_batch_size=8, max_seq_len=256)
    yield model
    model.close()


@pytest.fixture(scope="module")
def solo(lm):
    """Each prompt alone through generate(), plain greedy."""
    return [lm.generate(p, n, speculative_tokens=0).tokens for p, n in zip(PROMPTS, LENGTHS)]


def assert_no_leak(lm):
    lm.pool.check_invariants()
    assert lm.pool.bound_request_count == 0
    assert lm.drafter.pool.bound_request_count == 0
    lm.drafter.pool.check_invariants()
    assert lm.pool.free_pages + lm.pool.radix.total_size() // lm.pool.page_size == lm.pool.num_slots // lm.pool.page_size


@pytest.mark.parametrize("spec", [0, None, 2])
def test_concurrent_requests_match_their_solo_output(lm, solo, spec):
    with InferenceEngine(lm, max_batch_size=4) as engine:
        handles: list = [None] * len(PROMPTS)

        def submit(i):
            handles[i] = engine.submit(PROMPTS[i], SamplingParams(max_new_tokens=LENGTHS[i], speculative_tokens=spec))

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results = [h.result(timeout=120) for h in handles]
    for i, r in enumerate(results):
        assert r.tokens == solo[i], f"request {i} differs from its solo output"
        assert r.finish_reason == "length"
        assert (r.stats["speculative_rounds"] > 0) == (spec != 0)
    assert_no_leak(lm)


def test_manual_stepping_and_batches_of_different_positions(lm, solo):
    engine = InferenceEngine(lm, max_batch_size=8, start=False)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=n)) for p, n in zip(PROMPTS, LENGTHS)]
    assert engine.num_waiting == len(PROMPTS) and engine.num_running == 0
    while engine.step():
        assert engine.num_running <= 8
        lm.pool.check_invariants()
    assert [h.result(0).tokens for h in handles] == solo
    engine.shutdown()
    assert_no_leak(lm)


def test_requests_wait_for_pages_and_prompts_over_max_seq_len_are_refused():
    lm = LanguageModel.default(max_batch_size=2, max_seq_len=128)  # 256 slots: two requests of 128 at a time
    try:
        engine = InferenceEngine(lm, max_batch_size=8, start=False)
        fits = [engine.submit(p, SamplingParams(max_new_tokens=60)) for p in PROMPTS[:4]]
        running_max = 0
        while engine.step():
            running_max = max(running_max, engine.num_running)
            lm.pool.check_invariants()
        assert running_max == 2  # the others stayed queued until pages were freed
        assert all(h.result(0).tokens for h in fits)
        too_big = engine.submit(list(range(40, 100)) * 4, SamplingParams(max_new_tokens=10))  # 250 tokens, 1 page free
        too_big_ok = engine.submit("x", SamplingParams(max_new_tokens=10))
        lm.pool.check_invariants()
        # 240 prompt tokens + 10 fit 256 slots only when nothing else is bound; the second waits behind it
        while engine.step():
            pass
        assert too_big.result(0).tokens and too_big_ok.result(0).tokens
        huge = engine.submit(list(range(40, 100)) * 5, SamplingParams(max_new_tokens=0))  # 300 > max_seq_len
        pytest.fail(f"expected ValueError, got {huge}")
    except ValueError as exc:
        assert "max_seq_len" in str(exc)
    finally:
        lm.close()


def test_a_request_larger_than_the_pool_fails_with_kv_exhausted():
    lm = LanguageModel.default(max_batch_size=1, max_seq_len=512)
    lm.max_seq_len = 1024  # allow a request the pool (512 slots) can never hold
    try:
        engine = InferenceEngine(lm, start=False)
        h = engine.submit("abc", SamplingParams(max_new_tokens=900))
        engine.step()
        with pytest.raises(KvCacheExhaustedError):
            h.result(0)
        assert lm.pool.bound_request_count == 0
        engine.shutdown()
    finally:
        lm.close()


def test_cancel_frees_pages_at_once(lm):
    with InferenceEngine(lm, max_batch_size=2) as engine:
        free_before = lm.pool.free_pages + lm.pool.radix.evictable_size // lm.pool.page_size
        long = [engine.submit(p, SamplingParams(max_new_tokens=200)) for p in PROMPTS[:3]]
        deadline = time.time() + 30
        while engine.num_running < 2 and time.time() < deadline:
            time.sleep(0.01)
        assert long[0].cancel() and long[1].cancel() and long[2].cancel()  # two running, one queued
        for h in long:
            with pytest.raises(GenerationCancelled):
                h.result(0)
        assert not long[0].cancel()  # already done
        assert lm.pool.bound_request_count == 0  # evicted when cancel() returned
        assert lm.pool.free_pages + lm.pool.radix.evictable_size // lm.pool.page_size == free_before
    assert_no_leak(lm)


def test_cancel_from_a_listener_on_the_engine_thread(lm):
    class StopAfter:
        def __init__(self):
            self.n = 0
            self.handle = None

        def on_generated_tokens(self, n):
            self.n += n
            if self.n >= 5:
                self.handle.cancel()

    listener = StopAfter()
    with InferenceEngine(lm) as engine:
        listener.handle = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=100, speculative_tokens=0),
                                        listener)
        with pytest.raises(GenerationCancelled):
            listener.handle.result(30)
    assert listener.n < 10
    assert_no_leak(lm)


def test_listener_events_in_order_and_text_equals_completion(lm):
    events = []

    class Rec:
        def on_input_tokens(self, n):
            events.append(("in", n))

        def on_cached_input_tokens(self, n):
            events.append(("cached", n))

        def on_generated_tokens(self, n):
            events.append(("gen", n))

        def on_text(self, s):
            assert s
            events.append(("text", s))

    with InferenceEngine(lm) as engine:
        c = engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=30), Rec())
    assert events[0] == ("in", len(lm.encode(PROMPTS[2])))
    assert events[1][0] == "cached"
    assert sum(n for kind, n in events if kind == "gen") == len(c.tokens) == 30
    assert "".join(s for kind, s in events if kind == "text") == c.text


def test_chunked_prefill_across_steps_gives_the_same_tokens(lm, solo):
    engine = InferenceEngine(lm, max_batch_size=4, prefill_tokens_per_step=7, start=False)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=n)) for p, n in zip(PROMPTS[:4], LENGTHS[:4])]
    steps = 0
    while engine.step():
        steps += 1
    assert [h.result(0).tokens for h in handles] == solo[:4]
    engine.shutdown()
    assert_no_leak(lm)


def test_zero_new_tokens_and_stop_strings(lm, solo):
    with InferenceEngine(lm) as engine:
        empty = engine.submit("abc", SamplingParams(max_new_tokens=0)).result(30)
        assert empty.tokens == [] and empty.finish_reason == "length"
        text = lm.tokenizer.decode(solo[0])
        stop = text[10:13]
        c = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=LENGTHS[0], stop=stop))
        assert c.finish_reason == "stop" and c.text == text[: text.find(stop)]
    assert_no_leak(lm)


def test_bad_input_is_refused_at_submit_and_generate_shares_the_scheduler(lm, solo):
    for kwargs, field in (({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                          ({"max_new_tokens": -1}, "max_new_tokens"), ({"speculative_tokens": -2}, "speculative_tokens"),
                          ({"draft_sampling": "beam"}, "draft_sampling"), ({"seed": "7"}, "seed"),
                          ({"seed": 1 << 64}, "seed"), ({"seed": -(1 << 63) - 1}, "seed"), ({"logprobs": 21}, "logprobs"), ({"logprobs": "1"}, "logprobs"), ({"stop": [1.5]}, "stop")):
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)
    with InferenceEngine(lm) as engine:
        with pytest.raises(ValueError, match="vocabulary"):
            engine.submit([300], SamplingParams())
        with pytest.raises(TypeError, match="params must be a SamplingParams"):
            engine.submit("abc", {"max_new_tokens": 5})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="cancel must be None or a callable"):
            engine.submit("abc", cancel=True)  # type: ignore[arg-type]
        assert lm.pool.bound_request_count == 0 and engine.num_waiting == 0
        # generate() while an engine serves joins the same scheduler
        h = engine.submit(PROMPTS[1], SamplingParams(max_new_tokens=LENGTHS[1]))
        assert lm.generate(PROMPTS[0], LENGTHS[0]).tokens == solo[0]
        assert h.result(60).tokens == solo[1]
        with pytest.raises(RuntimeError, match="already serves"):
            InferenceEngine(lm)
    assert not lm.serving_loop.engine_attached
    assert len(lm.generate("abc", 3).tokens) == 3
    with pytest.raises(EngineShutdownError):
        engine.submit("abc")
    with pytest.raises(ValueError):
        InferenceEngine(lm, max_batch_size=0)
    assert_no_leak(lm)


def test_shutdown_cancel_pending_releases_everything(lm):
    engine = InferenceEngine(lm, max_batch_size=2)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=150)) for p in PROMPTS]
    time.sleep(0.2)
    engine.shutdown(cancel_pending=True)
    for h in handles:
        assert h.done()
        err = h.exception(0)
        assert err is None or isinstance(err, GenerationCancelled)
    assert any(isinstance(h.exception(0), GenerationCancelled) for h in handles)
    assert_no_leak(lm)


def test_a_failing_forward_evicts_its_rows_and_the_engine_keeps_serving(lm, solo, monkeypatch):
    engine = InferenceEngine(lm, start=False)
    calls = {"n": 0}
    real_step = lm.runner.step

    def flaky(seqs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated device error")
        return real_step(seqs)

    monkeypatch.setattr(lm.runner, "step", flaky)
    bad = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=40))
    while engine.step():
        pass
    with pytest.raises(RuntimeError, match="simulated"):
        bad.result(0)
    lm.pool.check_invariants()
    assert lm.pool.bound_request_count == 0
    good = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=LENGTHS[0]))
    while engine.step():
        pass
    assert good.result(0).tokens == solo[0]
    engine.shutdown()
    assert_no_leak(lm)


def test_speculative_max_batch_decodes_large_steps_plainly(lm, solo, monkeypatch):
    """With ``speculative_max_batch = 2`` a step of more rows is plain; once rows finish and two or fewer are left,
    they speculate again from their kept draft history. Every row still gets its solo greedy tokens."""
    steps: list[tuple[str, int]] = []
    real_spec, real_plain = lm.runner._verify, lm.runner.decode
    monkeypatch.setattr(lm.runner, "_verify", lambda seqs, n, drafts, probs: steps.append(("spec", len(seqs))) or
                        real_spec(seqs, n, drafts, probs))
    monkeypatch.setattr(lm.runner, "decode", lambda seqs, allow_graph=True: steps.append(("plain", len(seqs))) or
                        real_plain(seqs, allow_graph))
    with pytest.raises(ValueError, match="speculative_max_batch"):
        lm.speculative_max_batch = -1
    lm.speculative_max_batch = 2
    try:
        with InferenceEngine(lm, max_batch_size=4, start=False) as engine:
            picks = [3, 1, 6, 2]  # 15, 25, 45 and 60 new tokens
            handles = [engine.submit(PROMPTS[i], SamplingParams(max_new_tokens=LENGTHS[i])) for i in picks]
            while not all(h.done() for h in handles):
                alive = sum(not h.done() for h in handles)
                steps.append(("alive", alive))
                engine.step()
            assert [h.result().tokens for h in handles] == [solo[i] for i in picks]
    finally:
        lm.speculative_max_batch = None
    alive = 0
    for kind, n in steps:
        if kind == "alive":
            alive = n
        elif kind == "spec":
            assert alive <= 2, steps
    assert ("plain", 4) in steps and any(kind == "spec" for kind, _ in steps)
    assert_no_leak(lm)


def test_short_prompts_admitted_together_are_prefilled_in_one_forward(lm, solo, monkeypatch):
    """Requests admitted in one step whose whole prompts fit the prefill budget are prefilled together
    (``prefill_batch``, padding sealed off); a prompt longer than the budget is chunked as before. Outputs equal
    each request's solo output."""
    batches: list[int] = []
    real = lm.runner.prefill_batch

    def spy(seqs):  # type: ignore[no-untyped-def]
        batches.append(len(seqs))
        real(seqs)
        assert all(lm.pool.kv_len(s.request_id) == len(s.prompt) for s in seqs)

    monkeypatch.setattr(lm.runner, "prefill_batch", spy)
    monkeypatch.setattr(lm.pool, "prefix_reuse_enabled", False)  # whole prompts (solo cached them)
    picks = [0, 1, 4, 2]  # PROMPTS[2] (88 tokens) does not fit what the three before it leave of a 100-token budget
    with InferenceEngine(lm, max_batch_size=4, prefill_tokens_per_step=100, start=False) as engine:
        handles = [engine.submit(PROMPTS[i], SamplingParams(max_new_tokens=LENGTHS[i], speculative_tokens=0))
                   for i in picks]
        engine.step()
        assert batches == [3]
        assert [h.done() for h in handles] == [False] * 4
        while not all(h.done() for h in handles):
            engine.step()
        assert [h.result().tokens for h in handles] == [solo[i] for i in picks]
    assert_no_leak(lm)


def test_a_burst_sharing_a_new_prefix_computes_it_once(lm):
    """Requests submitted together with one uncached system prompt: the first is admitted and prefilled alone (in
    chunks), the others wait until its prompt is cached, then bind, match it and prefill only their own lines (in
    one padded forward). Outputs equal plain generate()."""
    header = "# burst test: a system prompt no other test uses\n" + "".join(f"V_{i} = {i * i}\n" for i in range(12))
    prompts = [header + tail for tail in ("def a():\n", "def bb():\n    return 1\n", "class C:\n", "x = [\n")]
    with InferenceEngine(lm, max_batch_size=4, prefill_tokens_per_step=96, start=False) as engine:
        handles = [engine.submit(p, SamplingParams(max_new_tokens=12, speculative_tokens=0)) for p in prompts]
        admitted = []
        while not all(h.done() for h in handles):
            engine.step()
            admitted.append(len(engine.scheduler.running))
        results = [h.result() for h in handles]
    header_len = len(lm.encode(header))
    assert admitted[:2] == [1, 1] and max(admitted) == 4, admitted  # ~150 header tokens take two steps
    assert results[0].stats["cached_tokens"] == 0
    assert all(r.stats["cached_tokens"] >= header_len - lm.pool.page_size for r in results[1:])
    assert [r.tokens for r in results] == [lm.generate(p, 12, speculative_tokens=0).tokens for p in prompts]
    assert_no_leak(lm)
