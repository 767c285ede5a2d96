"""Smile's values of ``DeviceType`` and ``ScalarType``, ``Device.emptyCache()`` and the host-array
``smile.deep.tensor.Tensor`` subset, asserted in Java (``bridgetest.TensorScenarios``); the Python
side of ``emptyCache`` is checked here by counting torch's ``empty_cache`` calls."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from .conftest import Jvm, require_java, scenario_names

require_java()

from .test_scenarios import run  # noqa: E402 - after require_java

SCENARIOS = scenario_names("TensorScenarios.java")
# needs torch's empty_cache functions counted (test_empty_cache_reaches_python)
PYTHON_COUNTED = "emptyCacheWhenLauncherFactoryThenPythonCalled"


@pytest.mark.parametrize("name", [n for n in SCENARIOS if n != PYTHON_COUNTED])
def test_tensor_scenario(jvm: Jvm, name: str) -> None:
    log = run(jvm, "TensorScenarios", name)
    assert log[-1].endswith(": 0"), "no scenario here makes a pool"


def test_scenario_names_match_java(jvm: Jvm) -> None:
    names = jvm.cls("bridgetest.Scenarios").names("bridgetest.TensorScenarios")
    assert sorted(SCENARIOS) == [str(n) for n in names]
    assert PYTHON_COUNTED in SCENARIOS and len(SCENARIOS) == 9


def _count(monkeypatch: pytest.MonkeyPatch, obj: Any, attr: str) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(obj, attr, lambda: calls.append(1))
    return calls


def test_empty_cache_reaches_python(jvm: Jvm, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Device.emptyCache()`` from Java goes through the registered factory: three CUDA devices are
    three ``torch.cuda.empty_cache()`` calls, MPS one ``torch.mps.empty_cache()`` (torch made to
    report MPS), the CPU none."""
    cuda = _count(monkeypatch, torch.cuda, "empty_cache")
    mps = _count(monkeypatch, torch.mps, "empty_cache")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    run(jvm, "TensorScenarios", PYTHON_COUNTED)
    assert (len(cuda), len(mps)) == (3, 1)


def test_empty_cache_on_mps_without_mps_does_nothing(jvm: Jvm,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    mps = _count(monkeypatch, torch.mps, "empty_cache")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    jvm.cls("smile.deep.tensor.Device").MPS().emptyCache()
    assert mps == []


def test_empty_cache_without_cuda_is_harmless(jvm: Jvm) -> None:
    """The real ``torch.cuda.empty_cache()`` does nothing while CUDA is not initialised (a CPU-only
    torch included), as Smile's call does on a build without CUDA."""
    jvm.cls("smile.deep.tensor.Device").CUDA().emptyCache()


def test_factory_refuses_a_device_torch_cannot_parse(jvm: Jvm) -> None:
    with pytest.raises(jvm.jpype.JClass("java.lang.IllegalArgumentException"),
                       match="not a torch device: 'gpu:x'"):
        jvm.factory.emptyCache("gpu:x")


def test_every_torch_name_is_a_torch_dtype(jvm: Jvm) -> None:
    """Each ``ScalarType.torchName()`` names a torch dtype, and ``ofTorchName`` of that dtype's
    string (what ``convert.java_scalar_type`` passes) is the constant again."""
    scalar_type = jvm.cls("smile.deep.tensor.ScalarType")
    values = list(scalar_type.values())
    assert len(values) == 30
    for t in values:
        dtype = getattr(torch, str(t.torchName()))
        assert isinstance(dtype, torch.dtype), t
        assert scalar_type.ofTorchName(str(dtype)) == t


def test_python_sees_smile_codes(jvm: Jvm) -> None:
    """Python reads the same values Java code does (MPS 9, Float 6, BFloat16 15, UInt64 29)."""
    device_type = jvm.cls("smile.deep.tensor.DeviceType")
    scalar_type = jvm.cls("smile.deep.tensor.ScalarType")
    assert [int(d.value()) for d in device_type.values()] == [0, 1, 9]
    assert [int(t.code()) for t in scalar_type.values()] == list(range(30))
    assert int(scalar_type.of(15).get().code()) == 15
    assert str(scalar_type.of(15).get()) == "BFloat16"
