"""Whether the cyclic garbage collector is running now.

The collector runs finalizers and weakref callbacks inside whatever code happened to allocate, on
any thread, and swallows what they raise. Code that reacts to such callbacks (a dropped stream's
finalizer) or that raises into arbitrary code (a render's deadline) asks ``collecting()`` first.

The flag covers a collection from the first of ``gc.callbacks`` at its start to the last at its
stop: ``_Start`` keeps itself first and ``_Stop`` last, reordering only from the last callback of a
stop phase, where no callback of the current collection is left to skip. A callback inserted in
front after this module loads runs outside the flag at the start of at most one collection. The
pair is registered once per process: a second copy of this module (a reload) finds it in
``gc.callbacks`` and shares its flag. The flag is process-wide: another thread that runs while a
finalizer releases the GIL sees it too (the answer errs towards "running")."""

from __future__ import annotations

import gc
from typing import Any

MARK = "smile_llm_collector"  # the attribute that marks this module's callbacks (their flag)


class _Flag:
    """Whether a collection runs; ``start``: the first callback."""

    def __init__(self) -> None:
        self.running = False
        self.start: _Start | None = None


class _Start:
    """The first callback: a collection starts."""

    def __init__(self, flag: _Flag) -> None:
        setattr(self, MARK, flag)
        self.flag = flag

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.flag.running = True


class _Stop:
    """The last callback: a collection's stop phase is over. One called while callbacks follow it
    (appended after it) hands over to a fresh marker appended behind them; the last one clears the
    flag and puts the start first and itself alone at the end."""

    def __init__(self, flag: _Flag) -> None:
        setattr(self, MARK, flag)
        self.flag = flag

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase != "stop":
            return
        callbacks = gc.callbacks
        if callbacks[-1] is not self:
            callbacks.append(_Stop(self.flag))  # called after those that follow this one
            return
        others = [c for c in callbacks if getattr(c, MARK, None) is not self.flag]
        start = self.flag.start
        callbacks[:] = ([start] if start is not None else []) + others + [self]
        self.flag.running = False


def _registered() -> _Flag:
    """The process's flag: the one a loaded copy of this module registered, else a new pair."""
    for callback in gc.callbacks:
        flag: Any = getattr(callback, MARK, None)
        if flag is not None:
            return flag  # duck-typed: the class of another copy of this module
    flag = _Flag()
    flag.start = _Start(flag)
    gc.callbacks.insert(0, flag.start)
    gc.callbacks.append(_Stop(flag))
    return flag


_FLAG = _registered()


def collecting() -> bool:
    """True from the start of a garbage collection (before any other callback) to its stop (after
    every other)."""
    return bool(_FLAG.running)
