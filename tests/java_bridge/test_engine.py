"""``smile.llm.engine.InferenceEngine`` from Java: its own step loop over a fake Java
``ModelExecutor`` (admission, prefill budget, decode batching, stop tokens, listener events, abort,
admission timeout, counters, close) and the bridged model's serving loop (greedy equality with
``generate`` and ``chat``), asserted in Java by ``bridgetest.EngineScenarios``."""

from __future__ import annotations

import os
from typing import Any

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

from .test_chat import chat_model  # noqa: E402,F401 - the fixture, after require_java
from .test_scenarios import run  # noqa: E402

SCENARIOS = scenario_names("EngineScenarios.java")
NEW_TOKENS = 8 if os.environ.get("SMILE_TEST_SCALE", "full") == "ci" else 16


@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("name", SCENARIOS)
def test_engine_scenario(jvm: Jvm, chat_model: Any, name: str) -> None:  # noqa: F811
    jvm.cls("bridgetest.EngineScenarios").newTokens = NEW_TOKENS
    run(jvm, "EngineScenarios", name)
    pool = jvm.model.pool
    pool.check_invariants()
    assert pool.bound_request_count == 0
    assert not jvm.model.serving_loop.engine_attached  # every scenario closes its engine
    assert jvm.model.serving_loop.num_waiting == 0 and jvm.model.serving_loop.num_running == 0


def test_speculation_limit_is_the_models_while_the_engine_is_open(jvm: Jvm) -> None:
    engine = jvm.cls("smile.llm.engine.InferenceEngine")(jvm.model_adapter.executor(), 2)
    before = jvm.model.speculative_max_batch
    try:
        engine.setMaxSpeculativeConcurrency(3)
        assert jvm.model.speculative_max_batch == 3
        engine.setMaxSpeculativeConcurrency(-1)
        assert jvm.model.speculative_max_batch is None
        engine.setMaxSpeculativeConcurrency(0)
        assert jvm.model.speculative_max_batch == 0
    finally:
        engine.close()
    assert jvm.model.speculative_max_batch == before
    assert not jvm.model.serving_loop.engine_attached


def test_scenario_names_match_java(jvm: Jvm) -> None:
    names = jvm.cls("bridgetest.Scenarios").names("bridgetest.EngineScenarios")
    assert sorted(SCENARIOS) == [str(n) for n in names]
    assert len(SCENARIOS) >= 12
