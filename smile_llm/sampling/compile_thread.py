"""The grammar engine's recursive work on threads with a large stack.

llguidance builds a grammar by recursion in native code: each ``$ref`` of a JSON schema resolved
inside another, and each Lark rule referenced from the one before, takes a native stack frame of
about 3.2 KB (more under nested parentheses or subschemas). Past the stack's end the process dies
(a segfault, not an exception): on the 8 MiB main-thread stack a chain of ~2,480 ``$ref``s or
~2,660 Lark rules crashes it; a 64 MiB thread holds ~20,000 of either. ``on_compile_thread`` runs
such work on one of ``COMPILE_THREADS`` threads created with a ``COMPILE_STACK_BYTES`` (256 MiB)
stack; the limits of ``schema_limits`` and ``grammar_limits`` keep the deepest grammar they admit
at 16-24 MiB, a tenth of it. Safe from any thread; a call made on a compile thread runs inline.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# the stack of each compile thread: 256 MiB of address space, of which only what a grammar uses is
# ever touched
COMPILE_STACK_BYTES = 256 << 20
# compiles that may run at once (llguidance drops the GIL while it builds a grammar)
COMPILE_THREADS = 2


class _Job:
    """One call waiting for a compile thread: ``done`` is set when ``result`` or ``error`` is."""

    __slots__ = ("fn", "args", "done", "result", "error")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


_lock = threading.Lock()  # the worker list, and threading.stack_size while a worker starts
_jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
_workers: list[threading.Thread] = []
_local = threading.local()  # ``compile_thread`` is True on a compile thread


def on_compile_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` run on a compile thread (the caller waits); its result, or its exception
    re-raised here. Inline when the caller is a compile thread itself."""
    if getattr(_local, "compile_thread", False):
        return fn(*args)
    _start_workers()
    job = _Job(fn, args)
    _jobs.put(job)
    job.done.wait()
    if job.error is not None:
        raise job.error
    return job.result  # type: ignore[no-any-return]


def _start_workers() -> None:
    if len(_workers) >= COMPILE_THREADS:
        return
    with _lock:
        while len(_workers) < COMPILE_THREADS:
            # stack_size applies to threads started after it: set it around this start only
            previous = threading.stack_size(COMPILE_STACK_BYTES)
            try:
                worker = threading.Thread(target=_work, name=f"grammar-compile-{len(_workers)}",
                                          daemon=True)
                worker.start()
            finally:
                threading.stack_size(previous)
            _workers.append(worker)


def _work() -> None:
    _local.compile_thread = True
    while True:
        job = _jobs.get()
        try:
            job.result = job.fn(*job.args)
        except BaseException as exc:  # handed to the caller, whatever it is
            job.error = exc
        finally:
            job.done.set()
        del job


def _after_fork() -> None:
    """A forked child has none of its parent's threads: it starts its own on first use."""
    global _lock, _jobs
    _lock = threading.Lock()
    _jobs = queue.SimpleQueue()
    _workers.clear()


os.register_at_fork(after_in_child=_after_fork)
