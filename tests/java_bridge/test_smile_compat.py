"""Smile source compatibility of the bridge's pool side, asserted in Java: scalar step forms, static factories,
``KvCacheLayout.of``, the ``smile.deep.tensor`` value types (``bridgetest.CompatScenarios``); Java NIO buffer
semantics (``bridgetest.NioScenarios``); Smile's ``RadixCache`` on standalone and pool trees
(``bridgetest.SmileRadixScenarios``). Plus a program written in Smile's style, compiled against the bridge jar alone
and run through the launcher."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import JAVA_TESTS, Jvm, require_java, scenario_names

require_java()

from .test_scenarios import run  # noqa: E402 - after require_java

DRIVERS = {"CompatScenarios": scenario_names("CompatScenarios.java"),
           "NioScenarios": scenario_names("NioScenarios.java"),
           "SmileRadixScenarios": scenario_names("SmileRadixScenarios.java")}
CASES = [(cls, name) for cls, names in DRIVERS.items() for name in names]
REPO = Path(__file__).resolve().parents[2]
# the scenarios that make no pool (value types, standalone trees): every other one must have audited its pools
NO_POOL = {"layoutOfWhenDenseDimsThenHeadDimDerived", "deviceAndScalarTypeWhenCreatedThenTorchNames",
           "matchWhenEndsInsideEdgeThenSplitAndLockProtectsPrefix", "evictWhenLeavesUnlockedThenLruOrderAndCascade",
           "handlesWhenEvictedResetOrForeignThenIllegalArgument",
           "namespacesWhenExtraKeyThenDisjointAndCloseHarmless"}


@pytest.mark.parametrize(("cls", "name"), CASES)
def test_compat_scenario(jvm: Jvm, cls: str, name: str) -> None:
    log = run(jvm, cls, name)
    assert log[-1].endswith(": 0") == (name in NO_POOL), f"audited pools: {log[-1]}"


def test_scenario_names_match_java(jvm: Jvm) -> None:
    names = jvm.cls("bridgetest.Scenarios").names
    for cls, parsed in DRIVERS.items():
        assert sorted(parsed) == [str(n) for n in names(f"bridgetest.{cls}")]
    assert [len(DRIVERS[c]) for c in DRIVERS] == [6, 5, 5]


def test_default_page_size_agrees_with_python(jvm: Jvm) -> None:
    """Smile's ``KvCachePool.DEFAULT_PAGE_SIZE`` (16) is Python's, and the default of ``allocate``."""
    from smile_llm.cache import KvCachePool
    from smile_llm.cache.factories import allocate

    java = int(jvm.cls("smile.llm.cache.KvCachePool").DEFAULT_PAGE_SIZE)
    assert java == KvCachePool.DEFAULT_PAGE_SIZE == inspect.signature(allocate).parameters["page_size"].default == 16


def test_scalar_form_reaches_python_as_an_int(jvm: Jvm) -> None:
    """The Java overloads ``sealLength(int)`` and ``sealLength(int[])`` arrive at one Python method: an int stays an
    int (the pool's "every row" form), an array becomes int64 numpy."""
    import numpy as np
    from jpype import JArray, JInt

    from java_bridge.adapters.convert import int_or_array

    assert int_or_array(JInt(7)) == 7 and type(int_or_array(JInt(7))) is int
    arr = int_or_array(JArray(JInt)([3, 4]))
    assert isinstance(arr, np.ndarray) and arr.dtype == np.int64 and arr.tolist() == [3, 4]
    with pytest.raises(ValueError, match="must not be null"):
        int_or_array(None)


def test_smile_style_app_compiles_against_the_jar_alone_and_passes(tmp_path: Path) -> None:
    """``smilestyle.SmileStyleApp`` uses only Smile's names: it compiles with nothing but the bridge jar on the class
    path and passes its own checks under the launcher."""
    from java_bridge.build import bridge_jar, compile_java

    classes = compile_java([JAVA_TESTS / "smilestyle" / "SmileStyleApp.java"], tmp_path / "classes",
                           classpath=[bridge_jar()])
    cmd = [sys.executable, "-m", "java_bridge", "--classpath", str(classes), "--main", "smilestyle.SmileStyleApp",
           "--no-model"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().endswith("SmileStyleApp OK")
