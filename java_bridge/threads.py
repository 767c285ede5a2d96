"""Thread states for Java-created threads that call into Python.

JPype gives a thread the JVM created a fresh Python thread state on every call into Python and drops
it after (about 10 us per call, against about 1 us on a thread Python created).
``pin_current_thread`` keeps one thread state alive for the calling thread, which brings such calls
back to about 1 us. It leaks one thread state per pinned thread, so use it for fixed worker pools
only (each worker calls ``smile.llm.python.Bridge .pinCurrentThread()`` once when it starts), never
for threads created per task.
"""

from __future__ import annotations

import ctypes
import threading

_pinned = threading.local()


def pin_current_thread() -> bool:
    """Keep a Python thread state for the calling thread for the rest of its life; True the first
    time."""
    if getattr(_pinned, "done", False):
        return False
    ctypes.pythonapi.PyGILState_Ensure.restype = ctypes.c_int
    ctypes.pythonapi.PyGILState_Ensure()  # never released: the thread state outlives each call
    _pinned.done = True
    return True
