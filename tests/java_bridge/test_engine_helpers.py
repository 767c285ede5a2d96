"""The engine's pure-Java helpers ``smile.llm.engine.TextStreamer`` and
``smile.llm.engine.Sampling``, asserted in Java with exact values
(``bridgetest.EngineHelperScenarios``); one pytest test per scenario. The draws at a temperature
above 0 are checked by properties every draw must have (the token lies in the nucleus), never by
frequencies."""

from __future__ import annotations

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

from .test_scenarios import run  # noqa: E402 - after require_java

SCENARIOS = scenario_names("EngineHelperScenarios.java")


@pytest.mark.parametrize("name", SCENARIOS)
def test_engine_helper_scenario(jvm: Jvm, name: str) -> None:
    log = run(jvm, "EngineHelperScenarios", name)
    assert log[-1].endswith(": 0"), "no scenario here makes a pool"


def test_scenario_names_match_java(jvm: Jvm) -> None:
    names = jvm.cls("bridgetest.Scenarios").names("bridgetest.EngineHelperScenarios")
    assert sorted(SCENARIOS) == [str(n) for n in names]
    assert sum(n.startswith("textStreamer") for n in SCENARIOS) == 9
    assert sum(n.startswith(("sampling", "mergeWithPromptMask")) for n in SCENARIOS) == 5


def test_sampling_errors_reach_python_named(jvm: Jvm) -> None:
    """A refused argument is an IllegalArgumentException naming it, in Python too."""
    jpype = jvm.jpype
    tensor = jvm.cls("smile.deep.tensor.Tensor")
    sampling = jvm.cls("smile.llm.engine.Sampling")
    ints = tensor.of(jpype.JArray(jpype.JInt)([1, 2, 3]), jpype.JArray(jpype.JLong)([]))
    with pytest.raises(jpype.JClass("java.lang.IllegalArgumentException"),
                       match=r"logits must be Float or Double: Tensor\(dtype=Int32, shape=\[3\]\)"):
        sampling.sampleNext(ints, 0.0, 0.9)
    floats = tensor.of(jpype.JArray(jpype.JFloat)([0.5, 2.0, -1.0]), jpype.JArray(jpype.JLong)([]))
    assert list(sampling.sampleNext(floats, 0.0, 0.9).longArray()) == [1]
