"""A stream's request always ends and is always released: after an ``InferenceEngine`` shutdown the stream still
finishes (the engine's thread was its only driver), ``close()`` from the model's listener fails pending requests
with the documented EngineShutdownError, a held iterator is released when it is closed, dropped or collected, and
a script that ends while holding a stream (or an engine with work) exits cleanly instead of aborting."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable

import pytest

from smile_llm import GenerationCancelled, LanguageModel
from smile_llm.engine import EngineShutdownError, InferenceEngine, SamplingParams

PROMPT = "def read_lines(path):\n"
HOG = "class Tree:\n"
NEW = 64
JOIN_S = 120.0  # the longest any caller may take to return in these tests


@pytest.fixture(scope="module")
def lm():
    model = LanguageModel.default(max_batch_size=2, max_seq_len=256)
    yield model
    model.close()


@pytest.fixture(scope="module")
def solo(lm) -> str:
    return lm.generate(PROMPT, NEW, speculative_tokens=0).text


def wait_for(condition: Callable[[], bool], timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def assert_released(lm: LanguageModel) -> None:
    lm.pool.check_invariants()
    assert lm.pool.bound_request_count == 0
    assert lm.serving_loop.num_running == 0 and lm.serving_loop.num_waiting == 0


def consume_in_thread(iterate: Callable[[], list]) -> tuple[threading.Thread, list, list]:
    """Run ``iterate`` on a daemon thread; returns it, the chunks it got and the error it raised (if any)."""
    got: list = []
    errors: list = []

    def body() -> None:
        try:
            got.extend(iterate())
        except BaseException as exc:  # noqa: BLE001 - recorded for the test to check
            errors.append(exc)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, got, errors


# ---------------------------------------------------------------------------------------------- engine shutdown
@pytest.mark.parametrize("how", [{"wait": True}, {"cancel_pending": True}, {"wait": False}],
                         ids=["wait", "cancel_pending", "no_wait"])
def test_a_stream_finishes_after_the_engine_that_drove_it_shuts_down(lm, solo, how):
    """The engine (batch of 1) runs its own request while the stream's waits behind it, so the engine's thread is
    the stream's only driver when ``shutdown`` stops it; the stream must still finish, with solo's text."""
    engine = InferenceEngine(lm, max_batch_size=1)
    hog = engine.submit(HOG, SamplingParams(max_new_tokens=32, speculative_tokens=0))
    thread, got, errors = consume_in_thread(lambda: list(lm.stream(PROMPT, NEW, speculative_tokens=0)))
    assert wait_for(lambda: lm.serving_loop.num_waiting >= 1 or bool(got))  # the stream's request is queued
    engine.shutdown(**how)
    thread.join(JOIN_S)
    assert not thread.is_alive(), "the stream never ended after the engine shut down"
    assert not errors
    assert "".join(c.text for c in got) == solo
    outcome = hog.exception(JOIN_S)
    assert isinstance(outcome, GenerationCancelled) if how.get("cancel_pending") else outcome is None
    assert wait_for(lambda: not lm.serving_loop.thread_alive)  # the driver that took over stops once idle
    assert_released(lm)


def test_an_async_stream_finishes_after_the_engine_shuts_down(lm, solo):
    engine = InferenceEngine(lm, max_batch_size=1)
    engine.submit(HOG, SamplingParams(max_new_tokens=32, speculative_tokens=0))

    async def collect() -> list:
        return [c async for c in lm.astream(PROMPT, NEW, speculative_tokens=0)]

    thread, got, errors = consume_in_thread(lambda: asyncio.run(collect()))
    assert wait_for(lambda: lm.serving_loop.num_waiting >= 1 or bool(got))
    engine.shutdown(cancel_pending=True)
    thread.join(JOIN_S)
    assert not thread.is_alive(), "the async stream never ended after the engine shut down"
    assert not errors and "".join(c.text for c in got) == solo
    assert wait_for(lambda: not lm.serving_loop.thread_alive)
    assert_released(lm)


def test_a_stream_started_before_the_engine_shutdown_runs_on_to_its_end(lm, solo):
    with InferenceEngine(lm, max_batch_size=2) as engine:
        it = lm.stream(PROMPT, NEW, speculative_tokens=0)
        first = next(it)  # running on the engine's thread
        engine.shutdown(wait=True)
        thread, rest, errors = consume_in_thread(lambda: list(it))
        thread.join(JOIN_S)
    assert not thread.is_alive() and not errors
    assert first.text + "".join(c.text for c in rest) == solo
    assert_released(lm)


def test_a_stream_finishes_after_an_engine_shutdown_from_a_listener(lm, solo):
    """``shutdown`` from a listener on the engine's own thread returns at once and stops that thread after the
    step; the engine's request and the stream both finish on the driver that takes over."""
    engine = InferenceEngine(lm, max_batch_size=2)

    class ShutdownOnce:
        def on_generated_tokens(self, n: int) -> None:
            engine.shutdown(wait=True)

    it = lm.stream(PROMPT, NEW, speculative_tokens=0)
    first = next(it)
    own = engine.submit(HOG, SamplingParams(max_new_tokens=32, speculative_tokens=0), ShutdownOnce())
    thread, rest, errors = consume_in_thread(lambda: list(it))
    thread.join(JOIN_S)
    assert not thread.is_alive() and not errors
    assert first.text + "".join(c.text for c in rest) == solo
    assert own.exception(JOIN_S) is None and not lm.serving_loop.engine_attached
    assert wait_for(lambda: not lm.serving_loop.thread_alive)
    assert_released(lm)


# ---------------------------------------------------------------------------------------------- close from a listener
def test_close_from_a_listener_fails_pending_requests_with_engine_shutdown_error():
    model = LanguageModel.default(max_batch_size=2, max_seq_len=256)
    try:
        other = model.submit(HOG, SamplingParams(max_new_tokens=NEW))

        class CloseOnFirstToken:
            def on_generated_tokens(self, n: int) -> None:
                model.close()

        with pytest.raises(EngineShutdownError):
            model.generate(PROMPT, NEW, listener=CloseOnFirstToken())
        assert isinstance(other.exception(JOIN_S), EngineShutdownError)
        assert model.pool.closed
    finally:
        model.close()


# ---------------------------------------------------------------------------------------------- releasing a held stream
def test_a_held_stream_is_released_when_dropped_or_closed(lm):
    it = lm.stream(PROMPT, 200, speculative_tokens=0)
    for _ in it:
        break  # the iterator is still held: its request may run on
    del it  # dropped: cancelled before del returns
    assert_released(lm)

    it = lm.stream(PROMPT, 200, speculative_tokens=0)
    next(it)
    it.close()
    assert_released(lm)
    assert list(it) == []  # closed: the iteration is over

    with lm.stream(PROMPT, 200, speculative_tokens=0) as chunks:
        for _ in chunks:
            break
    assert_released(lm)


def test_a_collected_stream_is_released_at_the_next_step(lm):
    def make_cycle() -> None:
        it = lm.stream(PROMPT, 200, speculative_tokens=0)
        next(it)
        holder: list = [it]
        holder.append(holder)  # a reference cycle: only the garbage collector frees it

    make_cycle()
    gc.collect()
    assert wait_for(lambda: lm.pool.bound_request_count == 0)  # flagged by the collector, cancelled by the loop
    assert_released(lm)


def test_close_from_another_thread_ends_a_waiting_consumer(lm):
    it = lm.stream(PROMPT, 200, speculative_tokens=0)
    next(it)
    thread, got, errors = consume_in_thread(lambda: list(it))
    time.sleep(0.05)
    it.close()  # the request (200 tokens) is still running: the consumer is waiting or about to
    thread.join(JOIN_S)
    assert not thread.is_alive() and not errors  # a StopIteration, not the cancellation
    assert_released(lm)


# ---------------------------------------------------------------------------------------------- interpreter exit
EXIT_SCRIPTS = {
    "held_after_next": """
        it = lm.stream("import os\\n", 200, speculative_tokens=0)
        next(it)
    """,
    "held_after_break": """
        it = lm.stream("import os\\n", 200)
        for chunk in it:
            break
    """,
    "engine_with_work": """
        from smile_llm.engine import InferenceEngine, SamplingParams
        engine = InferenceEngine(lm, 2)
        handles = [engine.submit("import os\\n", SamplingParams(max_new_tokens=200)) for _ in range(3)]
        it = lm.stream("def f(x):\\n", 200)
        next(it)
    """,
    "daemon_generate": """
        import threading, time
        threading.Thread(target=lambda: lm.generate("import os\\n", 200, speculative_tokens=0), daemon=True).start()
        while lm.pool.bound_request_count == 0:
            time.sleep(0.01)
    """,
}


@pytest.mark.parametrize("case", list(EXIT_SCRIPTS))
def test_a_script_ending_with_work_in_flight_exits_cleanly(case):
    script = textwrap.dedent("""
        import atexit
        lm = None
        # registered before smile_llm is imported, so it runs after the model's own release at exit
        atexit.register(lambda: print("bound at exit:", lm.pool.bound_request_count, flush=True))
        from smile_llm import LanguageModel
        lm = LanguageModel.default(max_batch_size=4, max_seq_len=256)
    """) + textwrap.dedent(EXIT_SCRIPTS[case])
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert "terminate called" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bound at exit: 0" in proc.stdout, proc.stdout + proc.stderr[-2000:]
