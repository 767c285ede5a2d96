"""``collecting()`` covers every other garbage-collector callback, in both phases, and skips none."""

from __future__ import annotations

import gc
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
