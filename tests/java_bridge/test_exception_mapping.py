"""No Python exception type reaches Java unmapped (``java_bridge.errors``): under load from eight Java threads, every
error is one of the documented Java types, with what the same call gives alone; and the paths Java reaches Python
without an adapter method (``PinThread``, binding errors, a failing ``to_java`` input) are mapped too."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import SCALE, Jvm, require_java

require_java()

from jpype import JArray, JClass, JImplements, JInt  # noqa: E402 - after the skip

from java_bridge.adapters import KvCachePoolAdapter, PinThread  # noqa: E402
from java_bridge.errors import bridged, to_java, translated  # noqa: E402
from smile_llm.cache import KvCachePool  # noqa: E402

IAE = "java.lang.IllegalArgumentException"


def python_message(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises((ValueError, TypeError)) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_eight_java_threads_get_only_documented_exceptions_and_their_solo_results(jvm: Jvm) -> None:
    model, drivers = jvm.model, jvm.cls("bridgetest.MappingUnderLoad")
    vocab = model.config.vocab_size
    text = "def add(a, b):\n"
    ids = [int(t) for t in model.encode(text)]
    new = 6
    solo_tokens = [int(t) for t in model.generate(ids, new).tokens]
    want = jvm.cls("bridgetest.MappingUnderLoad$Expected")(text, JArray(JInt)(ids), JArray(JInt)(ids),
                                                            JArray(JInt)(solo_tokens), new)
    with KvCachePool(1, 1024, 2, 16, 16) as pool:
        adapter = KvCachePoolAdapter(pool)
        solo = {str(k): str(v) for k, v in drivers.solo(jvm.model_adapter, adapter, want).items()}
        assert solo == {
            "encode-good": "ok",
            "encode-null": f"{IAE}: text must not be null",
            "decode-good": "ok",
            "decode-out-of-vocabulary": f"{IAE}: {python_message(model.decode, [1, vocab + 5])}",
            "decode-negative": f"{IAE}: {python_message(model.decode, [-3])}",
            "generate-good": "ok",
            "generate-null-prompt": f"{IAE}: prompt must not be null",
            "generate-out-of-vocabulary": f"{IAE}: {python_message(model.generate, [1, vocab + 5], 4)}",
            "generate-bad-temperature": f"{IAE}: {python_message(model.generate, ids, 4, temperature=-1.0)}",
            "generate-listener-throws": "the listener's own ListenerBoom",
            "generate-cancel-throws": "the supplier's own CancelBoom",
            "generate-cancelled": "java.util.concurrent.CancellationException: "
                                  "aborted: cancel() returned True between steps; KV released",
            "pool-bind-unbind": "ok",
            "pool-bind-null": f"{IAE}: array argument must not be null",
            "pool-bind-exhausted": "smile.llm.cache.KvCacheExhaustedException",
            "pool-kvlen-unknown": IAE,
        }
        threads, rounds = 8, (1 if SCALE == "ci" else 3)
        counts = {str(k): int(v) for k, v in drivers.concurrent(jvm.model_adapter, adapter, want, threads,
                                                                 rounds).items()}
        # every case gave exactly what it gives alone, on every thread and round (good calls included)
        assert counts == {f"{case} => {outcome}": threads * rounds for case, outcome in solo.items()}
        assert pool.bound_request_count == 0
        pool.check_invariants()
    assert model.pool.bound_request_count == 0
    model.pool.check_invariants()


# ------------------------------------------------------------------- paths without an adapter method
def test_pin_thread_is_bridged(jvm: Jvm, monkeypatch: pytest.MonkeyPatch) -> None:
    import java_bridge.adapters.factory as factory

    def broken() -> bool:
        raise IndexError("thread table")

    monkeypatch.setattr(factory, "pin_current_thread", broken)
    exc = jvm.cls("bridgetest.ExceptionDrivers").run(PinThread())
    assert str(exc.getClass().getName()) == "smile.llm.python.PythonException"
    assert str(exc.pythonType()) == "builtins.IndexError"
    assert str(exc.getMessage()) == "builtins.IndexError: thread table"


@JImplements("bridgetest.CheckedService", deferred=True)
@bridged
class TakesNothing:
    """Java calls ``call(String)``; this method takes no argument: JPype's binding error happens in the wrapper."""

    def call(self) -> str:
        return "never"


def test_a_call_with_the_wrong_number_of_arguments_arrives_as_illegal_argument(jvm: Jvm) -> None:
    exc = jvm.cls("bridgetest.ExceptionDrivers").callCheckedThrowable(TakesNothing(), "x")
    assert str(exc.getClass().getName()) == IAE
    assert str(exc.getMessage()) == "TakesNothing.call() takes 1 positional argument but 2 were given"


class Unprintable(Exception):
    def __str__(self) -> str:
        raise KeyError("no message")


def test_to_java_never_fails_on_the_exception_it_maps(jvm: Jvm) -> None:
    exc = to_java(Unprintable())
    assert isinstance(exc, JClass("smile.llm.python.PythonException"))
    assert str(exc.pythonType()) == f"{__name__}.Unprintable"
    assert str(exc.getMessage()) == (f"{__name__}.Unprintable: Unprintable (its message could not be formatted: "
                                     "KeyError)")
    assert str(exc.pythonTraceback()) == f"{__name__}.Unprintable: <exception str() failed>\n"  # Python's own


def test_translated_keeps_the_signature_defaults_varargs_and_keyword_calls(jvm: Jvm) -> None:
    def f(a: int, b: int = 2, *more: int) -> tuple[int, int, tuple[int, ...]]:
        return a, b, more

    g = translated(f)
    assert (g(1), g(1, 3), g(1, 3, 4, 5), g(a=9), g(1, b=5)) == ((1, 2, ()), (1, 3, ()), (1, 3, (4, 5)), (9, 2, ()),
                                                                  (1, 5, ()))
    assert g.__name__ == "f" and g.__wrapped__ is f  # type: ignore[attr-defined]
    with pytest.raises(JClass(IAE)) as info:
        g()
    assert str(info.value.getMessage()) == "test_translated_keeps_the_signature_defaults_varargs_and_keyword_calls." \
                                           "<locals>.f() missing 1 required positional argument: 'a'"
    with pytest.raises(JClass("smile.llm.python.PythonException")) as info:
        translated(lambda: [][0])()
    assert str(info.value.pythonType()) == "builtins.IndexError"


def test_checked_int_refuses_what_jpype_could_not_return() -> None:
    """Return values are checked inside the bridged method: JPype converts them only after it, where a failure would
    reach Java unmapped."""
    import numpy as np

    from java_bridge.adapters.convert import checked_int

    assert checked_int(np.int64(7), "x") == 7 and type(checked_int(np.int64(7), "x")) is int
    assert checked_int(-(1 << 31), "x") == -(1 << 31)
    assert checked_int(1 << 40, "x", bits=64) == 1 << 40
    for bad, bits, msg in ((1 << 31, 32, "Java int"), (-(1 << 31) - 1, 32, "Java int"), (1 << 63, 64, "Java long"),
                           (True, 32, "integer"), (2.0, 32, "integer"), (None, 32, "integer")):
        with pytest.raises(TypeError, match=msg):
            checked_int(bad, "x", bits=bits)
