"""``collecting()`` covers every other garbage-collector callback, in both phases, and skips none."""

from __future__ import annotations

import gc
import subprocess
import sys
from typing import Any

from smile_llm.collector import collecting


def test_every_callback_sees_the_collector_running_and_each_is_called_once_per_phase() -> None:
    seen: dict[str, list[tuple[str, bool]]] = {"front": [], "back": []}

    def front(phase: str, info: dict[str, Any]) -> None:
        seen["front"].append((phase, collecting()))

    def back(phase: str, info: dict[str, Any]) -> None:
        seen["back"].append((phase, collecting()))

    enabled = gc.isenabled()
    gc.disable()  # only the collections below, none another thread's allocations would start
    gc.callbacks.insert(0, front)  # in front of the flag's own first callback
    gc.callbacks.append(back)  # behind its last
    try:
        assert not collecting()
        gc.collect()
        # the first collection: the callback in front ran before the flag was set; the one behind is covered
        assert seen["front"] == [("start", False), ("stop", True)]
        assert seen["back"] == [("start", True), ("stop", True)]
        assert not collecting()
        for _ in range(3):
            gc.collect()
            assert not collecting()
        # reordered at the first collection's end: from then on both are covered, each called once per phase
        assert seen["front"][2:] == seen["back"][2:] == [("start", True), ("stop", True)] * 3
        assert sum(type(c).__name__ == "_Stop" for c in gc.callbacks) == 1
        assert type(gc.callbacks[0]).__name__ == "_Start" and type(gc.callbacks[-1]).__name__ == "_Stop"
    finally:
        gc.callbacks.remove(front)
        gc.callbacks.remove(back)
        if enabled:
            gc.enable()


def test_a_second_copy_of_the_module_shares_the_flag_and_collections_end() -> None:
    """A reloaded module (or one loaded under another name) finds the callbacks already registered and shares their
    flag: one start and one stop marker stay, and a collection ends (two pairs would hand over to each other for
    ever). In a subprocess, bounded, so a regression cannot hang the suite."""
    script = ("import gc, importlib, smile_llm.collector as c\n"
              "importlib.reload(c)\n"
              "for _ in range(3): gc.collect()\n"
              "marked = [x for x in gc.callbacks if hasattr(x, c.MARK)]\n"
              "print(len(marked), c.collecting())\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "False"]
