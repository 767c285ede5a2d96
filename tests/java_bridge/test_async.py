"""The asynchronous JVM API (``LanguageModel.submit`` futures, ``stream`` publishers, ``engine`` with
``GenerationHandle``), asserted in Java by ``bridgetest.AsyncScenarios``; one pytest test per scenario."""

from __future__ import annotations

import os

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

ASYNC = scenario_names("AsyncScenarios.java")
NEW_TOKENS = 8 if os.environ.get("SMILE_TEST_SCALE", "full") == "ci" else 24


@pytest.mark.timeout(180, method="thread")
@pytest.mark.parametrize("name", ASYNC)
def test_async_scenario(jvm: Jvm, name: str) -> None:
    scenarios = jvm.cls("bridgetest.AsyncScenarios")
    scenarios.newTokens = NEW_TOKENS
    try:
        jvm.cls("bridgetest.Scenarios").run("bridgetest.AsyncScenarios", name)
    except jvm.jpype.JException as exc:
        pytest.fail(f"AsyncScenarios.{name} failed in Java:\n{exc.stacktrace()}", pytrace=False)
    pool = jvm.model.pool
    pool.check_invariants()
    assert pool.bound_request_count == 0
    assert not jvm.model.serving_loop.engine_attached  # every scenario detaches its engine
    assert jvm.model.serving_loop.num_waiting == 0 and jvm.model.serving_loop.num_running == 0


def test_java_engine_defaults_are_smiles(jvm: Jvm) -> None:
    engine = jvm.cls("smile.llm.engine.InferenceEngine")
    assert int(engine.DEFAULT_PREFILL_TOKEN_BUDGET) == 2048
    assert int(engine.DEFAULT_ADMISSION_TIMEOUT_MS) == 120_000


def test_scenario_names_match_java(jvm: Jvm) -> None:
    assert sorted(ASYNC) == [str(n) for n in jvm.cls("bridgetest.Scenarios").names("bridgetest.AsyncScenarios")]
    assert len(ASYNC) >= 8
