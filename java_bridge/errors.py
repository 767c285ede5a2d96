"""Python errors to Java exceptions at the boundary: one class decorator, ``bridged``, wraps every public method.

| Python | Java |
|---|---|
| a Java exception (raised by a Java callback) | passes through unchanged |
| ``KvCacheExhaustedError`` | ``smile.llm.cache.KvCacheExhaustedException`` (an ``IllegalStateException``) |
| ``GenerationCancelled`` | ``java.util.concurrent.CancellationException`` |
| ``ValueError``, ``TypeError`` | ``IllegalArgumentException`` |
| other ``RuntimeError`` (closed pool, no active step, corruption) | ``IllegalStateException`` |
| anything else | ``smile.llm.python.PythonException`` with the Python type and traceback |

The message is the Python message (JPype's own proxy exception would carry none). The mapped exceptions are
unchecked, so no interface method needs a ``throws`` clause.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from smile_llm.cache import KvCacheExhaustedError
from smile_llm.model import GenerationCancelled

T = TypeVar("T")


def to_java(exc: BaseException) -> BaseException:
    """The Java exception ``exc`` becomes in Java."""
    import jpype

    if isinstance(exc, jpype.JException):
        return exc
    msg = str(exc) or type(exc).__name__
    if isinstance(exc, KvCacheExhaustedError):
        return jpype.JClass("smile.llm.cache.KvCacheExhaustedException")(msg)
    if isinstance(exc, GenerationCancelled):
        return jpype.JClass("java.util.concurrent.CancellationException")(msg)
    if isinstance(exc, (ValueError, TypeError)):
        return jpype.JClass("java.lang.IllegalArgumentException")(msg)
    if isinstance(exc, RuntimeError):
        return jpype.JClass("java.lang.IllegalStateException")(msg)
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return jpype.JClass("smile.llm.python.PythonException")(msg, name, "".join(traceback.format_exception(exc)))


def translated(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` with its errors raised as the Java exceptions of ``to_java``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - everything crosses as a Java exception
            mapped = to_java(exc)
            if mapped is exc:
                raise  # a Java exception from a callback: unchanged, cause and all
            raise mapped from exc

    return wrapper


def bridged(cls: type) -> type:
    """Wrap every public method of ``cls`` with ``translated`` and mark it ``@JOverride`` (apply under
    ``@JImplements``)."""
    from jpype import JOverride

    for name, value in list(vars(cls).items()):
        if callable(value) and not name.startswith("_"):
            setattr(cls, name, JOverride(translated(value)))
    return cls
