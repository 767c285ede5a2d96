"""How a KvCachePool verb runs: under the pool's lock, refused once the pool is closed, and, for a
state-changing verb, recorded in the pool's journal.

``locked`` and ``journaled`` decorate the pool's own methods; ``delegate`` makes a pool method of a
part's method (the pool is composed of parts that are not locked themselves). Each needs only the
four attributes of :class:`Guarded`, read at call time (a test may swap ``_lock``).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from .errors import PoolClosedError

Journal = Callable[[str, tuple[Any, ...], dict[str, Any]], None]
"""``journal(verb_name, args, kwargs)``: receives every state-changing verb that succeeded."""

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


class Guarded(Protocol):
    """What the decorators read on the pool: its lock, whether it is closed, and its journal."""

    _lock: threading.RLock
    _closed: bool
    _journal: Journal | None  # set by KvCachePool.record_calls
    _journal_depth: int  # journaled verbs running (a nested one is part of its caller's record)


G = TypeVar("G", bound=Guarded)


def locked(method: Callable[Concatenate[G, P], R]) -> Callable[Concatenate[G, P], R]:
    """``method`` run under the pool's (re-entrant) lock; PoolClosedError, naming the verb, once the
    pool is closed."""

    @functools.wraps(method)
    def wrapper(self: G, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            if self._closed:
                raise PoolClosedError(f"KvCachePool.{method.__name__}: the pool is closed; "
                                      f"create a new pool")
            return method(self, *args, **kwargs)

    return wrapper


def journaled(method: Callable[Concatenate[G, P], R]) -> Callable[Concatenate[G, P], R]:
    """A state-changing verb: once it has returned (a verb that raises changes nothing, so it is not
    recorded), the pool's journal, if any, receives ``(name, args, kwargs)``
    (``KvCachePool.record_calls``). Inside ``locked``, so calls are recorded in the order they took
    effect. A verb another journaled verb calls is part of its caller's record, not one of its
    own."""

    @functools.wraps(method)
    def wrapper(self: G, *args: P.args, **kwargs: P.kwargs) -> R:
        self._journal_depth += 1
        try:
            result = method(self, *args, **kwargs)
        finally:
            self._journal_depth -= 1
        if self._journal is not None and self._journal_depth == 0:
            self._journal(method.__name__, args, kwargs)
        return result

    return wrapper


def delegate(part: Callable[[G], S], method: Callable[Concatenate[S, P], R], *,
             journal: bool = False) -> Callable[Concatenate[G, P], R]:
    """A pool method that runs ``method`` on the pool's part ``part(pool)``, ``locked`` (and
    ``journaled`` when ``journal``): same name, signature and docstring as ``method``, so the
    journal records the part's method name, which must be the pool verb's."""

    @functools.wraps(method)
    def verb(self: G, *args: P.args, **kwargs: P.kwargs) -> R:
        return method(part(self), *args, **kwargs)

    return locked(journaled(verb) if journal else verb)
