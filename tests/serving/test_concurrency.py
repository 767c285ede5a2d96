"""Many callers on one model: generate() from many threads returns each caller's solo output, errors stay with their
request, cancellation and shutdown from anywhere release every page, and the serving loop never dies."""

from __future__ import annotations

import threading
import time

import pytest

from smile_llm import GenerationCancelled, LanguageModel
from smile_llm.engine import EngineShutdownError, InferenceEngine, SamplingParams

PROMPTS = [f"def function_{i}(x, y):\n    " for i in range(16)]
NEW = 16


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.default(max_batch_size=4, max_seq_len=256)
    yield model
    model.close()


@pytest.fixture(scope="module")
def solo(lm):
    return [lm.generate(p, NEW).tokens for p in PROMPTS]


def assert_no_leak(lm: LanguageModel) -> None:
    pool = lm.pool
    pool.check_invariants()
    assert pool.bound_request_count == 0
    assert lm.drafter is not None and lm.drafter.pool.bound_request_count == 0
    lm.drafter.pool.check_invariants()
    assert pool.free_pages + pool.radix.total_size() // pool.page_size == pool.num_slots // pool.page_size
    assert lm.serving_loop.num_running == 0 and lm.serving_loop.num_waiting == 0


def run_threads(fn, n: int) -> list:
    out: list = [None] * n
    errors: list = [None] * n

    def body(i: int) -> None:
        try:
            out[i] = fn(i)
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to check
            errors[i] = exc

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a caller never returned"
    return list(zip(out, errors))


@pytest.mark.parametrize("spec", [None, 0])
def test_sixteen_threads_get_their_solo_output_batched_together(lm, solo, spec):
    steps_before = lm.serving_loop.steps
    results = run_threads(lambda i: lm.generate(PROMPTS[i], NEW, speculative_tokens=spec), len(PROMPTS))
    for i, (c, err) in enumerate(results):
        assert err is None, err
        assert c.tokens == solo[i], f"caller {i} differs from its solo output"
    # batched: far fewer steps than 16 callers one after another (each needs about NEW / accepted-per-round steps)
    assert lm.serving_loop.steps - steps_before < len(PROMPTS) * NEW / 2
    assert_no_leak(lm)


def test_a_raising_listener_fails_only_its_own_request(lm, solo):
    class Boom:
        def __init__(self, event: str) -> None:
            self.event = event

        def on_text(self, chunk: str) -> None:
            if self.event == "on_text":
                raise RuntimeError("listener failed in on_text")

        def on_input_tokens(self, n: int) -> None:
            if self.event == "on_input_tokens":
                raise RuntimeError("listener failed in on_input_tokens")

        def on_cached_input_tokens(self, n: int) -> None:
            if self.event == "on_cached_input_tokens":
                raise RuntimeError("listener failed in on_cached_input_tokens")

    events = {3: "on_text", 7: "on_input_tokens", 11: "on_cached_input_tokens"}

    def call(i: int):
        listener = Boom(events[i]) if i in events else None
        return lm.generate(PROMPTS[i], NEW, listener=listener)

    results = run_threads(call, len(PROMPTS))
    for i, (c, err) in enumerate(results):
        if i in events:
            assert isinstance(err, RuntimeError) and events[i] in str(err)
        else:
            assert err is None and c.tokens == solo[i]
    assert_no_leak(lm)


def test_a_listener_failing_on_the_final_flush_fails_its_request_only(lm, solo):
    calls: list[str] = []

    class FailAtEnd:
        def on_text(self, chunk: str) -> None:
            calls.append(chunk)
            raise ValueError("no text please")

    # a stop string longer than the output holds all text back until the final flush at completion
    with pytest.raises(ValueError, match="no text please"):
        lm.generate(PROMPTS[0], NEW, listener=FailAtEnd(), stop="#" * 200)
    assert len(calls) == 1
    assert lm.generate(PROMPTS[0], NEW).tokens == solo[0]
    assert_no_leak(lm)


def test_cancel_from_another_thread_releases_at_once(lm, solo):
    started = threading.Event()

    class Signal:
        def on_generated_tokens(self, n: int) -> None:
            started.set()

    with InferenceEngine(lm, max_batch_size=4) as engine:
        long = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=200), Signal())
        other = engine.submit(PROMPTS[1], SamplingParams(max_new_tokens=NEW))
        assert started.wait(60)
        assert long.cancel() is True
        assert long.done() and isinstance(long.exception(0), GenerationCancelled)
        assert not lm.serving_loop.scheduler.holds(long)  # gone from the scheduler when cancel returned
        assert long.cancel() is False
        assert other.result(120).tokens == solo[1]
    assert_no_leak(lm)


def test_a_cancel_hook_that_raises_fails_its_request_only(lm, solo):
    def bad() -> bool:
        raise KeyError("hook broke")

    results = run_threads(lambda i: lm.generate(PROMPTS[i], NEW, cancel=bad if i == 0 else None), 3)
    assert isinstance(results[0][1], KeyError)
    assert [c.tokens for c, _ in results[1:]] == solo[1:3]
    assert_no_leak(lm)


def test_cancel_and_shutdown_from_a_listener(lm, solo):
    engine = InferenceEngine(lm, max_batch_size=4, start=False)
    queued: list = []

    class CancelOthers:
        def on_generated_tokens(self, n: int) -> None:
            for h in queued:
                h.cancel()

    first = engine.submit(PROMPTS[0], SamplingParams(max_new_tokens=NEW), CancelOthers())
    queued.append(engine.submit(PROMPTS[1], SamplingParams(max_new_tokens=NEW)))
    engine.step()  # admits both, the listener cancels the second: it must not run on
    assert isinstance(queued[0].exception(0), GenerationCancelled)
    assert first.result(120).tokens == solo[0]

    class Shutdown:
        def on_generated_tokens(self, n: int) -> None:
            engine.shutdown(wait=True)  # from the driving thread: returns at once, the request is cancelled

    late = engine.submit(PROMPTS[2], SamplingParams(max_new_tokens=NEW), Shutdown())
    assert isinstance(late.exception(60), GenerationCancelled)
    with pytest.raises(EngineShutdownError):
        engine.submit("abc")
    assert not lm.serving_loop.engine_attached
    assert_no_leak(lm)


def test_waiting_on_a_request_from_a_listener_fails_at_once(lm, solo):
    other = lm.submit(PROMPTS[1], SamplingParams(max_new_tokens=NEW))
    seen: list[BaseException] = []

    class Waits:
        def on_generated_tokens(self, n: int) -> None:
            if not seen:
                try:
                    other.result(timeout=5)
                except RuntimeError as exc:
                    seen.append(exc)

    t0 = time.perf_counter()
    c = lm.generate(PROMPTS[0], NEW, listener=Waits())
    assert time.perf_counter() - t0 < 60
    assert seen and "listener" in str(seen[0])
    assert c.tokens == solo[0]
    assert other.result(120).tokens == solo[1]
    assert_no_leak(lm)


def test_tiny_temperature_and_top_p_are_greedy(lm, solo):
    assert lm.generate(PROMPTS[0], NEW, temperature=1e-38, seed=3).tokens == solo[0]
    assert lm.generate(PROMPTS[0], NEW, temperature=0.7, top_p=1e-50, seed=3).tokens == solo[0]
    assert_no_leak(lm)


@pytest.mark.parametrize("kwargs, field", [({"seed": 1.5}, "seed"), ({"seed": -(1 << 63) - 1}, "seed"), ({"seed": "1"}, "seed"),
                                           ({"max_new_tokens": None}, "max_new_tokens"), ({"logprobs": 21}, "logprobs")])
def test_bad_fields_are_refused_before_anything_is_bound(lm, kwargs, field):
    with pytest.raises(ValueError, match=field):
        lm.generate(PROMPTS[0], **kwargs)
    with pytest.raises(ValueError, match=field):
        lm.generate_batch(PROMPTS[:2], **kwargs)
    with pytest.raises(TypeError, match="cancel"):
        lm.generate(PROMPTS[0], cancel=True)  # type: ignore[arg-type]
    assert_no_leak(lm)


def test_preemption_under_a_small_pool_gives_the_unconstrained_output():
    """Six speculative requests of 150 tokens on a pool of 512 slots: the scheduler admits what fits, preempts the
    newest rows when decoding runs out of pages, resumes them byte-identical, and every output equals its solo run."""
    small = LanguageModel.default(max_batch_size=2, max_seq_len=256)
    try:
        prompts = PROMPTS[:6]
        expected = [small.generate(p, 150).tokens for p in prompts]
        results = run_threads(lambda i: small.generate(prompts[i], 150), len(prompts))
        assert [c.tokens for c, _ in results] == expected
        assert small.serving_loop.scheduler.preemptions > 0
        assert sum(c.stats["preemptions"] for c, _ in results) == small.serving_loop.scheduler.preemptions
        small.pool.check_invariants()
        assert small.pool.bound_request_count == 0
    finally:
        small.close()


def test_close_while_serving_ends_every_request_and_the_loop():
    model = LanguageModel.default(max_batch_size=2, max_seq_len=256)
    engine = InferenceEngine(model, max_batch_size=4)
    handles = [engine.submit(p, SamplingParams(max_new_tokens=200)) for p in PROMPTS[:6]]
    time.sleep(0.3)
    model.close()
    for h in handles:
        err = h.exception(30)
        assert err is None or isinstance(err, (EngineShutdownError, GenerationCancelled))
    assert any(h.exception(0) is not None for h in handles)
    assert not model.serving_loop.thread_alive
    with pytest.raises(RuntimeError):
        model.generate("abc", 3)


def test_a_single_caller_runs_every_step_on_its_own_thread(lm, solo):
    threads: set[int] = set()

    class Where:
        def on_generated_tokens(self, n: int) -> None:
            threads.add(threading.get_ident())

    assert lm.generate(PROMPTS[0], NEW, listener=Where()).tokens == solo[0]
    assert threads == {threading.get_ident()}  # no hop to a serving thread
    assert not lm.serving_loop.thread_alive


def test_serve_until_idle_finishes_requests_nobody_waits_on_then_stops(lm, solo):
    done = threading.Event()
    outcomes: list = []

    def settled(handle) -> None:
        outcomes.append((handle.request_number, handle.done(), handle.exception(0)))
        if len(outcomes) == 3:
            done.set()

    handles = [lm.submit(p, SamplingParams(NEW)) for p in PROMPTS[:3]]
    for h in handles:
        h.add_done_callback(settled)
    lm.serving_loop.serve_until_idle()
    assert done.wait(60), "requests nobody waited on did not finish"
    assert sorted(outcomes) == [(h.request_number, True, None) for h in handles]
    assert [h.result(0).tokens for h in handles] == solo[:3]
    for _ in range(200):  # the driver stops once idle
        if not lm.serving_loop.thread_alive:
            break
        time.sleep(0.01)
    assert not lm.serving_loop.thread_alive
    assert_no_leak(lm)


def test_done_callbacks_run_once_in_order_and_after_the_fact(lm, solo):
    calls: list = []
    handle = lm.submit(PROMPTS[1], SamplingParams(NEW))
    handle.add_done_callback(lambda h: calls.append(("first", h.done())))
    handle.add_done_callback(lambda h: 1 / 0)  # ignored: the outcome is settled
    handle.add_done_callback(lambda h: calls.append(("second", h.done())))
    assert handle.result().tokens == solo[1]
    handle.add_done_callback(lambda h: calls.append(("late", threading.get_ident())))
    assert calls == [("first", True), ("second", True), ("late", threading.get_ident())]


def test_cancelling_a_queued_request_settles_it_outside_the_serving_loops_lock(lm):
    seen: list = []
    handle = lm.submit(PROMPTS[2], SamplingParams(NEW))
    # the callback takes the serving loop's intake lock (ServingLoop._cv): it would deadlock if run while cancel held it
    handle.add_done_callback(lambda h: seen.append((lm.serving_loop.num_waiting, type(h.exception(0)).__name__)))
    assert handle.cancel()
    assert seen == [(0, "GenerationCancelled")]
    assert_no_leak(lm)


def test_an_engine_keeps_a_driver_started_by_serve_until_idle(lm, solo):
    lm.serving_loop.serve_until_idle()  # nothing queued: it stops at once, or is still alive when the engine attaches
    with InferenceEngine(lm, 2) as engine:
        time.sleep(0.05)
        assert lm.serving_loop.thread_alive  # the engine's driver does not stop when idle
        handle = engine.submit(PROMPTS[3], SamplingParams(NEW))
        assert handle.result(60).tokens == solo[3]
    assert_no_leak(lm)


def test_run_between_steps_runs_while_no_step_does(lm, solo):
    loop = lm.serving_loop
    assert loop.run_between_steps(lambda: 42) == 42
    outside: list[bool] = []
    handle = lm.submit(PROMPTS[4], SamplingParams(max_new_tokens=NEW))
    loop.serve_until_idle()
    deadline = time.monotonic() + 120
    while not handle.done() and time.monotonic() < deadline:
        # inside fn the step lock is ours: no thread is inside a step
        outside.append(loop.run_between_steps(lambda: loop._stepping is None, 60))
    assert handle.result(60).tokens == solo[4]
    assert outside and all(outside)
    seen: list[BaseException] = []

    class Inside:
        def on_generated_tokens(self, n: int) -> None:
            if not seen:
                try:
                    loop.run_between_steps(lambda: None, 1)
                except RuntimeError as exc:
                    seen.append(exc)

    assert lm.generate(PROMPTS[5], NEW, listener=Inside()).tokens == solo[5]
    assert seen and "inside a step" in str(seen[0])
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        loop.run_between_steps(lambda: (held.set(), release.wait(60)), 60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(60)
        with pytest.raises(TimeoutError, match="step lock"):
            loop.run_between_steps(lambda: None, 0.05)
    finally:
        release.set()
        holder.join(60)
    assert not holder.is_alive()
    assert_no_leak(lm)


def test_a_raising_deferred_call_is_logged_and_the_others_still_run(lm, caplog):
    """Calls deferred to a step's end (the server's stream publications) run whatever one of them raises: the
    others run, the driving thread goes on serving, the request completes."""
    ran: list[str] = []

    class Deferring:
        def __init__(self) -> None:
            self.deferred = False

        def on_token(self, token_id: int) -> None:
            if not self.deferred:
                self.deferred = True
                lm.serving_loop.defer(lambda: (_ for _ in ()).throw(RuntimeError("deferred broke")))
                lm.serving_loop.defer(lambda: ran.append("second"))

    with caplog.at_level("ERROR", logger="smile_llm.serving.serving_loop"):
        out = lm.submit(PROMPTS[0], SamplingParams(NEW), listener=Deferring()).result(timeout=60)
    assert len(out.tokens) == NEW and ran == ["second"]
    assert any("deferred broke" in (r.exc_text or "") for r in caplog.records)
    assert lm.generate(PROMPTS[1], NEW).tokens
    assert_no_leak(lm)
