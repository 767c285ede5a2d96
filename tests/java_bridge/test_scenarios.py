"""Smile's KvCachePoolTest and RadixCacheTest scenarios, asserted in Java (``bridgetest.PoolScenarios``,
``bridgetest.RadixScenarios``) against the Python pool through the bridge; one pytest test per scenario."""

from __future__ import annotations

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

POOL = scenario_names("PoolScenarios.java")
RADIX = scenario_names("RadixScenarios.java")


def run(jvm: Jvm, cls: str, name: str) -> list[str]:
    """Runs one scenario; a Java AssertionError (or any other exception) fails the test with its Java message."""
    scenarios = jvm.cls("bridgetest.Scenarios")
    checks = jvm.cls("bridgetest.Audited").CHECKS
    before = checks.get()
    try:
        log = [str(line) for line in scenarios.run(f"bridgetest.{cls}", name)]
    except jvm.jpype.JException as exc:
        pytest.fail(f"{cls}.{name} failed in Java:\n{exc.stacktrace()}", pytrace=False)
    return log + [f"invariant checks: {checks.get() - before}"]


@pytest.mark.parametrize("name", POOL)
def test_pool_scenario(jvm: Jvm, name: str) -> None:
    log = run(jvm, "PoolScenarios", name)
    if name != "closedPoolWhenCalledThenIllegalState":  # the only pool a scenario must not audit
        assert not log[-1].endswith(": 0"), "the scenario's pool was not audited"


@pytest.mark.parametrize("name", RADIX)
def test_radix_scenario(jvm: Jvm, name: str) -> None:
    log = run(jvm, "RadixScenarios", name)
    assert not log[-1].endswith(": 0")


def test_scenario_names_match_java(jvm: Jvm) -> None:
    """The names parsed from the sources at collection are exactly the @Scenario methods Java sees."""
    names = jvm.cls("bridgetest.Scenarios").names
    assert sorted(POOL) == [str(n) for n in names("bridgetest.PoolScenarios")]
    assert sorted(RADIX) == [str(n) for n in names("bridgetest.RadixScenarios")]
    assert len(POOL) >= 10 and len(RADIX) >= 10


def test_failed_java_assertion_fails_the_run(jvm: Jvm) -> None:
    """A Java AssertionError reaches Python as a Java exception carrying its message."""
    check = jvm.cls("bridgetest.Check")
    with pytest.raises(jvm.jpype.JClass("java.lang.AssertionError"), match="freePages: expected 3, got 4"):
        check.eq(jvm.jpype.JLong(3), jvm.jpype.JLong(4), "freePages")
