"""Whether the cyclic garbage collector is running now.

The collector runs finalizers and weakref callbacks inside whatever code happened to allocate, on
any thread, and swallows what they raise. Code that reacts to such callbacks (a dropped stream's
finalizer) or that raises into arbitrary code (a render's deadline) asks ``collecting()`` first.

The flag covers a collection from the first of ``gc.callbacks`` at its start to the last at its
stop: ``_Start`` keeps itself first and ``_Stop`` last, reordering only from the last callback of a
stop phase, where no callback of the current collection is left to skip. A callback inserted in
front after this module loads runs outside the flag at the start of at most one collection. The
flag is process-wide: another thread that runs while a finalizer releases the GIL sees it too (the
answer errs towards "running")."""

from __future__ import annotations

import gc
from typing import Any

_running = False


class _Start:
    """The first callback: a collection starts."""

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        global _running
        if phase == "start":
            _running = True


class _Stop:
    """The last callback: a collection's stop phase is over. One called while callbacks follow it
    (appended after it) hands over to a fresh instance appended behind them; the last one clears
    the flag and puts ``_START`` first and itself alone at the end."""

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        global _running
        if phase != "stop":
            return
        callbacks = gc.callbacks
        if callbacks[-1] is not self:
            callbacks.append(_Stop())  # called after those that follow this one
            return
        callbacks[:] = [_START] + [c for c in callbacks if c is not _START
                                   and not isinstance(c, _Stop)] + [self]
        _running = False


_START = _Start()
gc.callbacks.insert(0, _START)
gc.callbacks.append(_Stop())


def collecting() -> bool:
    """True from the start of a garbage collection (before any other callback) to its stop (after
    every other)."""
    return _running
