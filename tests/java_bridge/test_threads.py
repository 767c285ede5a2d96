"""Java threads hammering one Python pool: no corruption, no deadlock, with and without pinned thread states.

The Java driver (``bridgetest.Hammer``) joins its workers with a timeout and fails naming the stuck threads; the
pytest timeout (thread method: a test blocked inside Java cannot take a signal) backs it up, so a hang fails.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from .conftest import Jvm, require_java

require_java()

from java_bridge.adapters import KvCachePoolAdapter  # noqa: E402 - after the skip
from smile_llm.cache import KvCachePool  # noqa: E402

CI = os.environ.get("SMILE_TEST_SCALE", "full") == "ci"
THREADS = 8
MILLIS = 1500 if CI else 2000
JOIN_TIMEOUT_MS = 30_000
PAGES = 20


def counters(lines: list[str]) -> dict[str, int]:
    return {k: int(v) for k, v in (str(line).split("=") for line in lines)}


@pytest.mark.timeout(90, method="thread")
@pytest.mark.parametrize("pin", [False, True], ids=["unpinned", "pinned"])
def test_java_threads_hammer_one_pool(jvm: Jvm, pin: bool) -> None:
    # 1 layer, 2 KV heads x 8 dims, page 4: 80 slots are 20 pages, too few for 8 requests of up to 32 tokens
    # at once, so binds also hit exhaustion and evict prefixes other threads left in the tree
    with KvCachePool(1, PAGES * 4, 2, 8, 4) as pool:
        adapter = KvCachePoolAdapter(pool)
        hammer = jvm.cls("bridgetest.Hammer")
        try:
            out = counters(hammer.run(adapter, THREADS, MILLIS, pin, JOIN_TIMEOUT_MS))
        except jvm.jpype.JException as exc:
            pytest.fail(f"hammer failed in Java:\n{exc.stacktrace()}", pytrace=False)
        pool.check_invariants()  # and from Python
        stats = pool.stats()
        assert pool.bound_request_count == 0
        assert pool.free_pages == out["freePages"]
        assert pool.radix.total_size() == out["tree"]
        assert pool.free_pages + pool.radix.total_size() // 4 == PAGES, json.dumps(stats, default=str)
        assert out["binds"] == out["finishes"] + out["unbinds"]
        assert out["binds"] > THREADS and out["hits"] > 0 and out["puts"] > 0 and out["exhausted"] > 0, out
        print(f"pin={pin}: {out}")


@pytest.mark.timeout(90, method="thread")
def test_python_thread_while_java_threads_hammer(jvm: Jvm) -> None:
    """A Python thread using the same pool directly while Java threads hammer it (GIL hand-offs both ways)."""
    with KvCachePool(1, 256, 2, 8, 4) as pool:
        adapter = KvCachePoolAdapter(pool)
        stop = threading.Event()
        errors: list[BaseException] = []

        def python_worker() -> None:
            try:
                while not stop.is_set():
                    try:
                        rid = pool.bind_request([5, 5, 5, 5, 5], 8)
                    except RuntimeError:  # exhausted while the Java threads hold the pages
                        continue
                    pool.unbind_request(rid)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        t = threading.Thread(target=python_worker, daemon=True)
        t.start()
        try:
            out = counters(jvm.cls("bridgetest.Hammer").run(adapter, 4, MILLIS // 2, True, JOIN_TIMEOUT_MS,
                                                                  False))
        finally:
            stop.set()
            t.join(30)
        assert not t.is_alive(), "the Python worker is stuck"
        assert not errors, errors
        pool.check_invariants()
        assert pool.bound_request_count == 0 and out["binds"] > 0


@pytest.mark.timeout(60, method="thread")
def test_stuck_worker_fails_the_run_instead_of_hanging(jvm: Jvm, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's join timeout turns a worker stuck inside Python into an AssertionError naming it."""
    with KvCachePool(1, 64, 2, 8, 4) as pool:
        adapter = KvCachePoolAdapter(pool)
        release = threading.Event()
        real_bind = pool.bind_request

        def stuck_bind(prompt: object, capacity: int) -> int:
            release.wait(30)  # releases the GIL while it waits, like a lock held elsewhere
            return real_bind(prompt, capacity)

        monkeypatch.setattr(pool, "bind_request", stuck_bind)
        try:
            with pytest.raises(jvm.jpype.JClass("java.lang.AssertionError"), match="deadlock\\? 2 workers"):
                jvm.cls("bridgetest.Hammer").run(adapter, 2, 100, False, 500)
        finally:
            release.set()
