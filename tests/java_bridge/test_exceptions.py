"""Python errors arrive in Java as the mapped Java exceptions with the Python message (``java_bridge.errors``);
Java exceptions pass through Python unchanged; checked exceptions follow the Java proxy rules."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Jvm, require_java

require_java()

from jpype import JClass, JImplements, JOverride  # noqa: E402 - after the skip

from java_bridge.adapters import KvCachePoolAdapter  # noqa: E402
from java_bridge.errors import bridged  # noqa: E402
from smile_llm.cache import KvCachePool  # noqa: E402


def drivers(jvm: Jvm) -> Any:
    return jvm.cls("bridgetest.ExceptionDrivers")


def python_error(fn: Any, *args: Any, **kwargs: Any) -> BaseException:
    """What ``fn(*args, **kwargs)`` raises in Python."""
    with pytest.raises(BaseException) as info:
        fn(*args, **kwargs)
    return info.value


def assert_java(exc: Any, java_type: str, message: str) -> None:
    """``exc`` (caught in Java) is exactly ``java_type`` and carries ``message``."""
    assert str(exc.getClass().getName()) == java_type
    assert str(exc.getMessage()) == message


@pytest.fixture
def pool(jvm: Jvm) -> Any:
    with KvCachePool(1, 64, 2, 16, 16) as p:
        yield KvCachePoolAdapter(p)


def test_value_error_arrives_as_illegal_argument_with_the_python_message(jvm: Jvm, pool: Any) -> None:
    err = python_error(pool.pool.activate_step, 999)
    assert isinstance(err, ValueError)
    exc = drivers(jvm).activateStep(pool, [999])
    assert_java(exc, "java.lang.IllegalArgumentException", str(err))
    assert "Unknown request id: 999" in str(exc.getMessage())
    # a failed call changed nothing
    pool.pool.check_invariants()


def test_exhausted_arrives_as_kv_cache_exhausted_which_is_an_illegal_state(jvm: Jvm, pool: Any) -> None:
    err = python_error(pool.pool.bind_request, [1, 2, 3], 1000)
    exc = drivers(jvm).bindRequest(pool, [1, 2, 3], 1000)
    assert_java(exc, "smile.llm.cache.KvCacheExhaustedException", str(err))
    assert isinstance(exc, JClass("java.lang.IllegalStateException"))
    assert pool.pool.bound_request_count == 0 and pool.pool.free_pages == 4


def test_closed_pool_and_no_active_step_arrive_as_illegal_state(jvm: Jvm) -> None:
    with KvCachePool(1, 64, 2, 16, 16) as p:
        adapter = KvCachePoolAdapter(p)
        exc = drivers(jvm).get(adapter, 0, 1)  # nothing bound: the adapter's own RuntimeError
        assert_java(exc, "java.lang.IllegalStateException",
                    "no active step: bind a request or call activateStep first")
        p.close()
        err = python_error(lambda: p.free_pages)
        exc = drivers(jvm).freePages(adapter)
        assert_java(exc, "java.lang.IllegalStateException", str(err))
        assert "closed" in str(exc.getMessage())


def test_unmapped_error_arrives_as_python_exception_with_type_and_traceback(
        jvm: Jvm, pool: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_bind(prompt: Any, capacity: int) -> int:
        raise KeyError("no such page table")  # the traceback must name this line

    line = broken_bind.__code__.co_firstlineno + 1
    monkeypatch.setattr(pool.pool, "bind_request", broken_bind)
    exc = drivers(jvm).bindRequest(pool, [1, 2, 3], 16)
    assert isinstance(exc, JClass("smile.llm.python.PythonException"))
    assert isinstance(exc, JClass("java.lang.RuntimeException"))
    assert str(exc.pythonType()) == "builtins.KeyError"
    assert str(exc.getMessage()) == "builtins.KeyError: 'no such page table'"
    tb = str(exc.pythonTraceback())
    assert tb.startswith("Traceback (most recent call last):")
    assert f'{__file__}", line {line}, in broken_bind' in tb
    assert "java_bridge/adapters/pool.py" in tb and "in bindRequest" in tb
    assert tb.rstrip().endswith("KeyError: 'no such page table'")


def test_java_exception_raised_in_python_passes_through_unchanged(jvm: Jvm, pool: Any,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    boom = JClass("java.lang.UnsupportedOperationException")("not in this pool")

    def raise_java(prompt: Any, capacity: int) -> int:
        raise boom

    monkeypatch.setattr(pool.pool, "bind_request", raise_java)
    exc = drivers(jvm).bindRequest(pool, [1], 16)
    assert exc.equals(boom)  # the same Java object
    assert_java(exc, "java.lang.UnsupportedOperationException", "not in this pool")


def test_type_error_and_null_array_arrive_as_illegal_argument(jvm: Jvm, pool: Any) -> None:
    exc = drivers(jvm).bindRequest(pool, None, 16)
    assert_java(exc, "java.lang.IllegalArgumentException", "array argument must not be null")


def test_generate_cancelled_arrives_as_cancellation_exception(jvm: Jvm) -> None:
    prompt = [int(t) for t in jvm.model.encode("def add(a, b):\n")]
    for after in (0, 3):
        exc = drivers(jvm).generateCancelled(jvm.model_adapter, prompt, after)
        assert_java(exc, "java.util.concurrent.CancellationException",
                    "aborted: cancel() returned True between steps; KV released")
    assert jvm.model.pool.bound_request_count == 0


def test_generate_bad_input_arrives_as_illegal_argument(jvm: Jvm) -> None:
    vocab = jvm.model.config.vocab_size
    err = python_error(jvm.model.generate, [1, vocab + 5], 4)
    exc = drivers(jvm).generate(jvm.model_adapter, [1, vocab + 5], 4, 0.0, 1.0)
    assert_java(exc, "java.lang.IllegalArgumentException", str(err))
    err = python_error(jvm.model.generate, [1, 2], 4, temperature=-1.0)
    exc = drivers(jvm).generate(jvm.model_adapter, [1, 2], 4, -1.0, 1.0)
    assert_java(exc, "java.lang.IllegalArgumentException", str(err))


@pytest.mark.parametrize("event", ["onInputTokens", "onGeneratedTokens", "onText"])
def test_java_listener_exception_propagates_through_generate_unchanged(jvm: Jvm, event: str) -> None:
    prompt = [int(t) for t in jvm.model.encode("x = 1\n")]
    result = str(drivers(jvm).listenerThrows(jvm.model_adapter, prompt, event))  # asserts identity in Java
    assert result.startswith(f"boom in {event}")
    assert jvm.model.pool.bound_request_count == 0
    jvm.model.pool.check_invariants()


# --------------------------------------------------------------------------------- checked vs unchecked exceptions
@JImplements("bridgetest.CheckedService", deferred=True)
class RawService:
    """A plain JPype proxy (no ``bridged``): what the Java proxy rules do with raised Java exceptions."""

    @JOverride
    def call(self, what: Any) -> str:
        return raise_for(str(what))


@JImplements("bridgetest.CheckedService", deferred=True)
@bridged
class BridgedService:
    """The same through ``errors.bridged``: Java exceptions must pass through it unchanged."""

    def call(self, what: Any) -> str:
        return raise_for(str(what))


def raise_for(what: str) -> str:
    if what == "declared":
        raise JClass("java.io.FileNotFoundException")("declared checked: kv.bin")
    if what == "undeclared":
        raise JClass("java.util.concurrent.TimeoutException")("undeclared checked: 5 s")
    if what == "python":
        raise ValueError("plain python error")
    return "ok " + what


@pytest.mark.parametrize("service", [RawService, BridgedService], ids=["raw", "bridged"])
def test_checked_exception_declared_arrives_as_its_type(jvm: Jvm, service: type) -> None:
    impl = service()
    out = str(drivers(jvm).callChecked(impl, "declared"))
    assert out == "IOException java.io.FileNotFoundException: declared checked: kv.bin"
    exc = drivers(jvm).callCheckedThrowable(impl, "declared")
    assert_java(exc, "java.io.FileNotFoundException", "declared checked: kv.bin")
    assert str(drivers(jvm).callChecked(impl, "fine")) == "returned ok fine"


@pytest.mark.parametrize("service", [RawService, BridgedService], ids=["raw", "bridged"])
def test_checked_exception_undeclared_arrives_as_undeclared_throwable(jvm: Jvm, service: type) -> None:
    out = str(drivers(jvm).callChecked(service(), "undeclared"))
    assert out == ("UndeclaredThrowableException caused by java.util.concurrent.TimeoutException: "
                   "undeclared checked: 5 s")


def test_python_error_in_checked_interface_is_mapped_only_when_bridged(jvm: Jvm) -> None:
    out = str(drivers(jvm).callChecked(BridgedService(), "python"))
    assert out == "RuntimeException java.lang.IllegalArgumentException: plain python error"
    # without the decorator JPype's own proxy exception carries no message
    exc = drivers(jvm).callCheckedThrowable(RawService(), "python")
    assert str(exc.getClass().getName()) == "org.jpype.PyExceptionProxy"
