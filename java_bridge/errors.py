"""Python errors to Java exceptions at the boundary: one class decorator, ``bridged``, wraps every
public method.

| Python | Java |
|---|---|
| a Java exception (raised by a Java callback) | passes through unchanged |
| ``KvCacheExhaustedError`` | ``smile.llm.cache.KvCacheExhaustedException`` (an
  ``IllegalStateException``) |
| ``GenerationCancelled`` | ``java.util.concurrent.CancellationException`` |
| ``ValueError``, ``TypeError``, ``LayerNotHeldError`` | ``IllegalArgumentException`` |
| other ``RuntimeError`` (closed pool, no active step, corruption) | ``IllegalStateException`` |
| anything else | ``smile.llm.python.PythonException`` with the Python type and traceback |

The message is the Python message (JPype's own proxy exception would carry none). The mapped
exceptions are unchecked, so no interface method needs a ``throws`` clause.

Every way Java reaches Python, and what an error on it becomes:

* **A method of a bridged class** (the adapters in ``adapters/``, ``PinThread``, the launcher's
  cleanup hook): the table above. Internal errors (``IndexError``, ``KeyError``, ``AssertionError``,
  ``OverflowError``, ...) and ``BaseException`` subclasses (``KeyboardInterrupt``, ``SystemExit``)
  are "anything else": ``PythonException``. If building the Java exception fails itself (a message
  whose ``str()`` raises, a traceback that cannot be formatted), the message or traceback says so
  and the type is still the one of the table.
* **JPype's argument binding** (Java calls a method with more or fewer arguments than the Python
  method takes, for example an interface overload the adapter does not accept): the ``TypeError`` is
  raised inside the wrapper, so Java gets ``IllegalArgumentException``. Java values themselves
  always convert (primitives, arrays and objects arrive as JPype wrappers, ``null`` as ``None``); a
  value the method cannot use is the method's ``TypeError`` or ``ValueError``:
  ``IllegalArgumentException``.
* **An exception from a Java callback** (a ``GenerationListener``, a ``cancelRequested`` supplier)
  raised while Python runs: it reaches Python as that Java exception and goes back to the Java
  caller unchanged (the same object). A listener or supplier of a request fails that request alone,
  on whichever thread runs the step.
* **Return values** are converted by JPype after the method returned, outside any wrapper: a value
  JPype cannot convert would arrive as JPype's ``org.jpype.PyExceptionProxy``. The adapters
  therefore return only values that convert by construction (``convert.checked_int`` for integers,
  ``int32`` arrays, ``str``, Java objects).
* A plain ``@JImplements`` class without ``bridged`` gets JPype's own mapping
  (``org.jpype.PyExceptionProxy``, no message): every class in ``java_bridge`` that Java calls is
  bridged.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from smile_llm import KvCacheExhaustedError, LayerNotHeldError
from smile_llm import GenerationCancelled

T = TypeVar("T")


def _text(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception as err:  # noqa: BLE001 - a broken __str__ must not hide the error
        return f"{type(exc).__name__} (its message could not be formatted: {type(err).__name__})"


def _traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except Exception as err:  # noqa: BLE001
        return f"(the Python traceback could not be formatted: {type(err).__name__})"


def to_java(exc: BaseException) -> BaseException:
    """The Java exception ``exc`` becomes in Java (the module's table)."""
    import jpype

    if isinstance(exc, jpype.JException):
        return exc
    msg = _text(exc)
    if isinstance(exc, KvCacheExhaustedError):
        return jpype.JClass("smile.llm.cache.KvCacheExhaustedException")(msg)
    if isinstance(exc, GenerationCancelled):
        return jpype.JClass("java.util.concurrent.CancellationException")(msg)
    if isinstance(exc, (ValueError, TypeError, LayerNotHeldError)):
        return jpype.JClass("java.lang.IllegalArgumentException")(msg)
    if isinstance(exc, RuntimeError):
        return jpype.JClass("java.lang.IllegalStateException")(msg)
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return jpype.JClass("smile.llm.python.PythonException")(msg, name, _traceback(exc))


_MISSING: Any = object()  # a parameter the caller did not pass


def _call_rest(fn: Callable[..., T], names: tuple[str, ...], values: tuple[Any, ...],
               rest: tuple[Any, ...]) -> T:
    """``fn`` called with what the caller passed: the leading given values by position, the given
    ones after the first missing one by name (a keyword call), then ``rest``; ``fn`` raises any
    binding ``TypeError`` itself."""
    n = 0
    while n < len(values) and values[n] is not _MISSING:
        n += 1
    kwargs = {k: v for k, v in zip(names[n:], values[n:]) if v is not _MISSING}
    return fn(*values[:n], *rest, **kwargs)


_TEMPLATE = """\
def {name}({params}*_bridged_rest):
    try:
        if _bridged_rest or {last} is _bridged_missing:
            return _bridged_call_rest(_bridged_fn, {names}, ({values}), _bridged_rest)
        return _bridged_fn({values})
    except BaseException as _bridged_exc:
        _bridged_mapped = _bridged_to_java(_bridged_exc)
        if _bridged_mapped is _bridged_exc:
            raise  # a Java exception from a callback: unchanged, cause and all
        raise _bridged_mapped from _bridged_exc
"""


def translated(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` with its errors raised as the Java exceptions of ``to_java``, binding errors included.

    The wrapper takes ``fn``'s positional parameters by name, each defaulting to a marker, so a call
    with all of them costs one plain call (no ``*args``/``**kwargs`` packing: about 60 ns instead
    of 260 ns on the 2-core test machine). A call that passes fewer, more or keyword arguments takes
    the slow path, where ``fn`` itself binds them, so a wrong number of arguments is ``fn``'s
    ``TypeError`` inside the ``try``. Functions with keyword-only parameters or ``**kwargs`` get the
    general ``*args, **kwargs`` wrapper."""
    params = list(inspect.signature(fn).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = tuple(p.name for p in params if p.kind in positional)
    simple = (names and all(p.kind in positional or p.kind is inspect.Parameter.VAR_POSITIONAL
                            for p in params)
              and not any(n.startswith("_bridged_") for n in names)
              and not any(p.kind is inspect.Parameter.POSITIONAL_ONLY for p in params))
    if not simple:
        return _general(fn)
    filename = f"<bridged {fn.__module__}.{fn.__qualname__}>"
    source = _TEMPLATE.format(name=fn.__name__,
                              params="".join(f"{n}=_bridged_missing, " for n in names),
                              last=names[-1], names=repr(names),
                              values="".join(f"{n}, " for n in names))
    namespace: dict[str, Any] = {"_bridged_fn": fn, "_bridged_missing": _MISSING,
                                 "_bridged_call_rest": _call_rest, "_bridged_to_java": to_java}
    # our own template, names checked above
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102
    # tracebacks show the lines
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    return functools.update_wrapper(namespace[fn.__name__], fn)  # type: ignore[no-any-return]


def _general(fn: Callable[..., T]) -> Callable[..., T]:
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
    """Wrap every public method of ``cls`` with ``translated`` and mark it ``@JOverride`` (apply
    under ``@JImplements``)."""
    from jpype import JOverride

    for name, value in list(vars(cls).items()):
        if callable(value) and not name.startswith("_"):
            setattr(cls, name, JOverride(translated(value)))
    return cls
