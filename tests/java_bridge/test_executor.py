"""The bridged model's ``ModelExecutor`` step API (``java_bridge.adapters.executor``): Java drives
the Python model step by step (bind, prefill, decodeStep, finish, evict), asserted in Java by
``bridgetest.ExecutorScenarios`` against greedy ``generate``; here the Python side: the serving loop
never sees the executor's requests, ids it did not bind are refused, and a failed forward evicts."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

from .test_scenarios import run  # noqa: E402

SCENARIOS = scenario_names("ExecutorScenarios.java")
NEW_TOKENS = 8 if os.environ.get("SMILE_TEST_SCALE", "full") == "ci" else 16


def assert_clean(model: Any) -> None:
    pool = model.pool
    pool.check_invariants()
    assert pool.bound_request_count == 0
    assert pool.free_pages + pool.radix.total_size() // pool.page_size == \
        pool.num_slots // pool.page_size
    assert model.serving_loop.num_waiting == 0 and model.serving_loop.num_running == 0


@pytest.mark.timeout(300, method="thread")
@pytest.mark.parametrize("name", SCENARIOS)
def test_executor_scenario(jvm: Jvm, name: str) -> None:
    jvm.cls("bridgetest.ExecutorScenarios").newTokens = NEW_TOKENS
    run(jvm, "ExecutorScenarios", name)
    assert_clean(jvm.model)
    assert jvm.model_adapter.executor()._bound == {}


def test_scenario_names_match_java(jvm: Jvm) -> None:
    names = jvm.cls("bridgetest.Scenarios").names("bridgetest.ExecutorScenarios")
    assert sorted(SCENARIOS) == [str(n) for n in names]
    assert len(SCENARIOS) >= 7


@pytest.mark.timeout(120, method="thread")
def test_the_serving_loop_never_sees_the_executors_requests(jvm: Jvm) -> None:
    model, ex = jvm.model, jvm.model_adapter.executor()
    prompt = model.encode("def unseen(a):\n    ")
    rid = ex.bind(prompt, len(prompt) + 4)
    try:
        assert model.serving_loop.num_running == 0 and model.serving_loop.num_waiting == 0
        logits = ex.prefill(rid, prompt, ex.prefixLen(rid))
        assert list(logits.shape()) == [1, model.config.vocab_size]
        # generate meanwhile: its output is its solo output, and it leaves the request alone
        want = model.generate(prompt, 4).tokens
        assert model.pool.is_bound(rid) and model.pool.kv_len(rid) == len(prompt)
        row = list(logits.floatArray())
        token = row.index(max(row))
        assert token == want[0]
    finally:
        ex.evict(rid)
    assert_clean(model)


def test_ids_the_executor_did_not_bind_are_refused(jvm: Jvm) -> None:
    model, ex = jvm.model, jvm.model_adapter.executor()
    iae = jvm.cls("java.lang.IllegalArgumentException")
    prompt = model.encode("def not_mine():\n    ")
    rid = model.pool.bind_request(prompt, len(prompt) + 4)  # as the serving loop binds its own
    try:
        with pytest.raises(iae, match=f"requestId = {rid} is not a request bound by this executor"):
            ex.prefixLen(rid)
        with pytest.raises(iae, match=rf"requestIds\[0\] = {rid}"):
            ex.decodeStep([rid], [1], [0])
        ex.evict(rid)  # not the executor's: nothing
        assert model.pool.is_bound(rid)
    finally:
        model.pool.unbind_request(rid)
    assert_clean(model)


def test_a_failed_forward_evicts_its_requests(jvm: Jvm, monkeypatch: pytest.MonkeyPatch) -> None:
    model, ex = jvm.model, jvm.model_adapter.executor()
    prompt = model.encode("def failing():\n    ")
    rid = ex.bind(prompt, len(prompt) + 4)
    ex.prefill(rid, prompt, ex.prefixLen(rid))

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("forward failed")

    monkeypatch.setattr(model.transformer, "forward", boom)
    with pytest.raises(jvm.cls("java.lang.IllegalStateException"), match="forward failed"):
        ex.decodeStep([rid], [1], [len(prompt)])
    monkeypatch.undo()
    assert not model.pool.is_bound(rid) and rid not in ex._bound
    ex.evict(rid)  # a no-op now
    assert_clean(model)


@pytest.mark.timeout(120, method="thread")
def test_a_step_call_waits_for_the_serving_loops_step(jvm: Jvm) -> None:
    """While another thread holds the step lock (a step in progress), a step call waits, then
    runs."""
    model, ex = jvm.model, jvm.model_adapter.executor()
    prompt = model.encode("def waits():\n    ")
    loop = model.serving_loop
    inside, release, done = threading.Event(), threading.Event(), threading.Event()
    result: list[int] = []

    def hold() -> None:
        def body() -> None:
            inside.set()
            assert release.wait(60)
        loop.run_between_steps(body, 60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(60)

    def bind() -> None:
        result.append(ex.bind(prompt, len(prompt) + 1))
        done.set()

    binder = threading.Thread(target=bind)
    binder.start()
    assert not done.wait(0.3), "bind ran while the step lock was held"
    release.set()
    assert done.wait(60)
    holder.join(60)
    binder.join(60)
    assert not holder.is_alive() and not binder.is_alive()
    ex.evict(result[0])
    assert_clean(model)
