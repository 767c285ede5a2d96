"""Registered segments from Java (``bridgetest.SegmentScenarios``): ``PythonLanguageModel.registerSegment`` and
``releaseSegment``, ``SamplingParams.Builder.segments(...)`` reaching Python's ``segments``, the layout and a segment
at 0 against full prefill, and bad pieces refused by name, nothing left bound."""

from __future__ import annotations

import pytest

from .conftest import Jvm, require_java, scenario_names

require_java()

from .test_scenarios import run  # noqa: E402 - after require_java

SCENARIOS = scenario_names("SegmentScenarios.java")


@pytest.mark.parametrize("name", SCENARIOS)
def test_segment_scenario(jvm: Jvm, name: str) -> None:
    run(jvm, "SegmentScenarios", name)
    jvm.model.pool.check_invariants()
    assert jvm.model.pool.bound_request_count == 0 and jvm.model.runner.segments.live == ()


def test_java_pieces_become_python_pieces(jvm: Jvm) -> None:
    from java_bridge.adapters.sampling import python_params
    from java_bridge.adapters.segments import SegmentAdapter

    adapter = jvm.model_adapter.registerSegment(jvm.jpype.JString("def f():\n    pass\n"))
    try:
        assert isinstance(adapter, SegmentAdapter)
        java = jvm.cls("smile.llm.SamplingParams").builder().segments(
            "text", adapter, jvm.jpype.JArray(jvm.jpype.JInt)([1, 2])).build()
        got = python_params(java).segments
        assert got == ("text", adapter.segment, (1, 2))
        assert python_params(jvm.cls("smile.llm.SamplingParams").defaults()).segments is None
    finally:
        jvm.model.release_segment(adapter.segment)
