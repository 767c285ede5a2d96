#!/usr/bin/env python
"""Cost of calling the Python KV pool and ``generate()`` from Java through the JPype bridge (``java_bridge``).

The script compiles ``benchmarks/java/BridgeBench.java`` against the bridge's interfaces jar (``compile_java``
against ``bridge_jar()``), starts the JVM in this process (``java_bridge.jvm.start_jvm``, which also sets torch to
``--threads`` intra-op threads) and registers the adapters the way the launcher does (factory, "pinCurrentThread",
the default model as "model"). The Java driver runs timing loops with ``System.nanoTime`` around ``n`` calls of a
proxy, so what is measured is Java calling Python, not the one Python -> Java call that starts each loop:

    (a) from the Python main thread running a Java loop (what an app's ``main`` under the launcher does):
        ``freePages()`` and ``bindRequest(32 tokens, 64) + unbindRequest``, against the same calls made directly in
        Python on the same pool (``pool.free_pages``; ``pool.bind_request`` + ``pool.unbind_request``), and the
        adapter's method called from Python (the Python half of a Java call, without the crossing).
    (b) the call-overhead table: ``freePages()`` from the launcher (Python main) thread, from a JVM-created worker
        thread unpinned (JPype makes a Python thread state per call) and after ``Bridge.pinCurrentThread()``,
        each against ``pool.free_pages`` called in Python (goal: <= 2 us from the launcher and pinned threads).
    (c) ``put``/``get`` of one 64 KiB K block plus one 64 KiB V block (float32 ``[1, 16, 8, 128]``, page size 16)
        through native-order direct ``ByteBuffer``s, against ``pool.put``/``pool.get`` with torch tensors on the
        same pool, and the adapter's ``put``/``get`` called from Python with the same Java buffers. Java's ``get``
        also copies the result into the caller's buffers; Python's returns new tensors. Both directions are
        checked to move the same values first.
    (d) ``generate()`` of the default model (greedy, 100 new tokens, speculative decoding as configured) called
        from Java (timed in Java; with and without a listener receiving the text) against the same call from
        Python; the tokens are checked identical.

Each figure is the median of ``--repeats`` blocks of about ``--block-ms``, the Java and Python variants interleaved
(alternating which runs first); call counts are calibrated per variant. Generation uses ``--gen-repeats`` runs of
each caller, interleaved the same way.

    .venv/bin/python benchmarks/java_bridge.py            # defaults (~25 s on 2 cores)
    .venv/bin/python benchmarks/java_bridge.py --quick    # ~7 s
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench_env import code_version  # noqa: E402
from java_bridge.build import bridge_jar, compile_java  # noqa: E402
from smile_llm.cache import KvCachePool  # noqa: E402

Timer = Callable[[int], float]  # n calls -> seconds for all n
KEEP: list[Any] = []
GOAL_US = 2.0  # the call-overhead goal for the launcher thread and pinned threads
CALLS: dict[str, float] = {}  # (b)'s medians, seconds per call, for the closing summary


# ---------------------------------------------------------------------------------------------------- timing
def python_timer(fn: Callable[[], object]) -> Timer:
    def run(n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t0

    return run


def java_timer(loop: Callable[[int], int]) -> Timer:
    """``loop(n)`` is a Java method returning the nanoseconds its ``n`` calls took."""
    return lambda n: int(loop(n)) / 1e9


def calibrate(run: Timer, block_s: float) -> int:
    """A call count so that one block of ``run`` takes about ``block_s`` (after a warm-up, which also lets the
    JIT compile the Java loop)."""
    run(2)
    n = 2
    while True:
        t = run(n)
        if t >= block_s / 4 or n >= 1 << 22:
            break
        n *= 4
    return max(2, round(n * block_s / max(t, 1e-9)))


def medians(timers: dict[str, Timer], repeats: int, block_s: float) -> dict[str, float]:
    """Median seconds per call of each timer; blocks interleaved, the order rotated every repeat."""
    counts = {name: calibrate(run, block_s) for name, run in timers.items()}
    samples: dict[str, list[float]] = {name: [] for name in timers}
    names = list(timers)
    gc.disable()
    try:
        for rep in range(repeats):
            order = names[rep % len(names):] + names[: rep % len(names)]
            for name in order if rep % 2 == 0 else order[::-1]:
                samples[name].append(timers[name](counts[name]) / counts[name])
    finally:
        gc.enable()
    return {name: statistics.median(s) for name, s in samples.items()}


# ---------------------------------------------------------------------------------------------------- setup
def start(threads: int) -> tuple[Any, Any, Any]:
    """Compile the driver, start the JVM with it, register the adapters; returns (jpype, BridgeBench, model)."""
    from smile_llm import LanguageModel

    model = LanguageModel.default()  # before the JVM, as the launcher does (torch initialises first)
    classes = Path(tempfile.mkdtemp(prefix="bridgebench-"))
    atexit.register(shutil.rmtree, classes, True)
    compile_java([HERE / "java" / "BridgeBench.java"], classes, classpath=[bridge_jar()])
    from java_bridge.jvm import start_jvm

    jpype = start_jvm([classes], torch_threads=threads)
    from java_bridge.adapters import FactoryAdapter, LanguageModelAdapter, PinThread

    bridge = jpype.JClass("smile.llm.python.Bridge")
    factory = FactoryAdapter()
    bridge.registerFactory(factory)
    bridge.register("pinCurrentThread", PinThread())
    bridge.register("model", LanguageModelAdapter(model))
    KEEP.append(factory)  # Java holds the proxies; keep the Python side alive too
    return jpype, jpype.JClass("BridgeBench"), model


def header(jpype: Any, repeats: int, block_ms: float) -> None:
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    system = jpype.JClass("java.lang.System")
    print(f"java_bridge: smile_llm {code_version()}, python {platform.python_version()}, "
          f"jpype {jpype.__version__}, java {system.getProperty('java.version')}, "
          f"torch {torch.__version__}, {os.cpu_count()} cpus (load average {load}), "
          f"{torch.get_num_threads()} torch threads")
    print(f"medians of {repeats} blocks of ~{block_ms:g} ms per variant, Java and Python interleaved; "
          f"Java loops timed in Java (System.nanoTime)\n")


def us(s: float) -> str:
    return f"{s * 1e6:9.2f}"


# ---------------------------------------------------------------------------------------------------- (a) + (b)
def calls(jpype: Any, bench: Any, repeats: int, block_s: float) -> None:
    from java_bridge.adapters import KvCachePoolAdapter

    pool = KvCachePool(1, 4096, 1, 8, 16, "cpu", torch.float32)
    adapter = KvCachePoolAdapter(pool)
    prompt = np.arange(1, 33, dtype=np.int64)
    jprompt = jpype.JArray(jpype.JInt)(prompt.tolist())
    cap = 64

    def py_bind() -> None:
        pool.unbind_request(pool.bind_request(prompt, cap))

    def adapter_bind() -> None:
        adapter.unbindRequest(adapter.bindRequest(jprompt, cap))

    m = medians({
        "py free": python_timer(lambda: pool.free_pages),
        "adapter free": python_timer(adapter.freePages),
        "java free": java_timer(lambda n: bench.freePages(adapter, n)),
        "py bind": python_timer(py_bind),
        "adapter bind": python_timer(adapter_bind),
        "java bind": java_timer(lambda n: bench.bindUnbind(adapter, jprompt, cap, n)),
    }, repeats, block_s)
    assert pool.bound_request_count == 0, "bind/unbind loops left bindings behind"
    pool.check_invariants()

    print("(a) Java loop on the Python main thread calling the pool proxy, vs the same call made in Python")
    print(f"{'call':34} {'python us':>9} {'adapter us':>10} {'java us':>9} {'java/python':>11} "
          f"{'crossing us':>11}")
    for label, key in (("freePages()", "free"), ("bindRequest(32 tok)+unbindRequest", "bind")):
        py, ad, jv = m[f"py {key}"], m[f"adapter {key}"], m[f"java {key}"]
        print(f"{label:34} {us(py)} {us(ad):>10} {us(jv)} {jv / py:10.2f}x {us(jv - ad):>11}")
    print("  python = pool.free_pages / pool.bind_request+unbind_request; adapter = the proxy's Python method "
          "called from Python;\n  crossing = java - adapter (JPype's Java -> Python dispatch)\n")

    thread_names = (str(bench.workerThreadName(False)), str(bench.workerThreadName(True)))
    # the unpinned worker is timed on its own: the thread states it creates and destroys on every call slow the
    # blocks that follow it (interleaved with it, the launcher thread measured 2.0-3.4 us instead of 1.9-2.0 us)
    t = medians({
        "python": python_timer(lambda: pool.free_pages),
        "main": java_timer(lambda n: bench.freePages(adapter, n)),
        "pinned": java_timer(lambda n: bench.freePagesOnJavaThread(adapter, n, True)),
    }, repeats, block_s)
    t.update(medians({"unpinned": java_timer(lambda n: bench.freePagesOnJavaThread(adapter, n, False))},
                     repeats, block_s))
    print(f"(b) call overhead: one trivial bridged call, freePages(), by the thread that calls (goal <= {GOAL_US:g} us "
          f"from the launcher thread and a pinned thread)")
    print(f"{'caller':46} {'us/call':>9} {'python us':>9} {'ratio':>8} {'calls/s':>11}  goal")
    rows = (("launcher (Python main) thread", "main", True),
            (f"JVM-created thread '{thread_names[0]}', unpinned", "unpinned", False),
            (f"JVM-created thread '{thread_names[1]}', pinned", "pinned", True))
    for label, key, goal in rows:
        verdict = ("met" if t[key] * 1e6 <= GOAL_US else "MISSED") if goal else "none"
        print(f"{label:46} {us(t[key])} {us(t['python'])} {t[key] / t['python']:7.1f}x {1 / t[key]:11,.0f}  "
              f"{verdict}")
    print("  python = pool.free_pages called in Python on the same pool (the peer); ratio = us/call / python us;\n"
          f"  pinning makes a JVM-created thread {t['unpinned'] / t['pinned']:.1f}x cheaper to call from\n")
    CALLS.update(t)
    pool.close()


# ---------------------------------------------------------------------------------------------------- (c)
def buffers(jpype: Any, bench: Any, repeats: int, block_s: float) -> None:
    from java_bridge.adapters import KvCachePoolAdapter

    heads, dim, seq = 8, 128, 16
    pool = KvCachePool(1, 1024, heads, dim, 16, "cpu", torch.float32)
    adapter = KvCachePoolAdapter(pool)
    pool.bind_requests(1, 64)  # one active row
    shape = (1, seq, heads, dim)
    nbytes = int(np.prod(shape)) * 4
    k_buf, v_buf, k_out, v_out = (bench.direct(nbytes) for _ in range(4))
    k_j, v_j, k_oj, v_oj = (torch.frombuffer(b, dtype=torch.float32).view(shape) for b in (k_buf, v_buf, k_out, v_out))
    gen = torch.Generator().manual_seed(0)
    k_py, v_py = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)

    # the same values either way: Java puts, Python reads; Python puts, Java reads
    k_j.copy_(torch.randn(shape, generator=gen))
    v_j.copy_(torch.randn(shape, generator=gen))
    bench.put(adapter, 0, 0, seq, k_buf, v_buf, 1)
    k_r, v_r = pool.get(0, seq)
    assert torch.equal(k_r, k_j) and torch.equal(v_r, v_j), "Java put and Python get disagree"
    pool.put(0, 0, k_py, v_py)
    bench.get(adapter, 0, seq, k_out, v_out, 1)
    assert torch.equal(k_oj, k_py) and torch.equal(v_oj, v_py), "Python put and Java get disagree"

    m = medians({
        "py put": python_timer(lambda: pool.put(0, 0, k_py, v_py)),
        "adapter put": python_timer(lambda: adapter.put(0, 0, seq, k_buf, v_buf)),
        "java put": java_timer(lambda n: bench.put(adapter, 0, 0, seq, k_buf, v_buf, n)),
        "py get": python_timer(lambda: pool.get(0, seq)),
        "adapter get": python_timer(lambda: adapter.get(0, seq, k_out, v_out)),
        "java get": java_timer(lambda n: bench.get(adapter, 0, seq, k_out, v_out, n)),
    }, repeats, block_s)
    pool.check_invariants()
    print(f"(c) K and V of {nbytes // 1024} KiB each (float32 {list(shape)}), direct ByteBuffers from Java vs torch "
          f"tensors in Python, same pool (values checked)")
    print(f"{'op':6} {'python us':>9} {'adapter us':>10} {'java us':>9} {'java/python':>11} {'crossing us':>11} "
          f"{'java GB/s':>10}")
    for op in ("put", "get"):
        py, ad, jv = m[f"py {op}"], m[f"adapter {op}"], m[f"java {op}"]
        print(f"{op:6} {us(py)} {us(ad):>10} {us(jv)} {jv / py:10.2f}x {us(jv - ad):>11} "
              f"{2 * nbytes / jv / 1e9:10.2f}")
    print("  adapter = the proxy's put/get called from Python with the same Java buffers (views made per call);\n"
          "  Java's get also copies into the caller's buffers, Python's returns the gathered tensors\n")
    pool.close()


# ---------------------------------------------------------------------------------------------------- (d)
def generation(jpype: Any, bench: Any, model: Any, repeats: int, new: int, prompt: str) -> float:
    ids = model.encode(prompt)
    jids = jpype.JArray(jpype.JInt)(ids)
    times: dict[str, list[float]] = {"python": [], "java": [], "java+listener": []}
    tokens: dict[str, list[int]] = {}
    streamed: list[int] = []

    def py() -> float:
        t0 = time.perf_counter()
        c = model.generate(ids, new)
        dt = time.perf_counter() - t0
        tokens["python"] = list(c.tokens)
        return dt

    def java(listener: bool) -> Callable[[], float]:
        def run() -> float:
            c = bench.generate(jids, new, listener)
            key = "java+listener" if listener else "java"
            tokens[key] = [int(t) for t in c.completionTokens()]
            if listener:
                streamed.append(int(bench.lastStreamedChars()) - len(str(c.content())))
            return int(bench.lastGenerateNanos()) / 1e9
        return run

    runs = {"python": py, "java": java(False), "java+listener": java(True)}
    for fn in runs.values():  # warm-up: also fills the prefix cache, so every timed run starts the same way
        fn()
    names = list(runs)
    for rep in range(repeats):
        order = names[rep % len(names):] + names[: rep % len(names)]
        for name in order if rep % 2 == 0 else order[::-1]:
            times[name].append(runs[name]())
    same = tokens["python"] == tokens["java"] == tokens["java+listener"]
    py_t = statistics.median(times["python"])
    print(f"(d) generate(): default model, greedy, {new} new tokens after a {len(ids)}-token prompt, medians of "
          f"{repeats} runs per caller")
    print(f"{'caller':34} {'ms':>9} {'tokens/s':>9} {'java/python speed':>18}")
    for name in names:
        t = statistics.median(times[name])
        label = {"python": "Python: model.generate", "java": "Java: LanguageModel.generate",
                 "java+listener": "Java, listener streaming onText"}[name]
        print(f"{label:34} {t * 1e3:9.1f} {len(tokens[name]) / t:9.1f} {py_t / t:17.2f}x")
    print(f"  outputs identical: {'yes' if same else 'NO'} ({len(tokens['python'])} tokens); listener received "
          f"{'all' if all(d == 0 for d in streamed) else 'NOT all'} of the text")
    if not same:
        raise SystemExit("generate() from Java and from Python produced different tokens")
    return py_t / statistics.median(times["java"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer and shorter blocks, fewer generations")
    p.add_argument("--repeats", type=int, default=None, help="blocks per call variant (default 9, quick 3)")
    p.add_argument("--block-ms", type=float, default=None, help="length of one block (default 100, quick 20)")
    p.add_argument("--gen-repeats", type=int, default=None, help="generations per caller (default 5, quick 2)")
    p.add_argument("--new", type=int, default=100, help="tokens per generation")
    p.add_argument("--prompt", default="def fibonacci(n):\n")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (start_jvm's default is 1)")
    args = p.parse_args()
    repeats = args.repeats or (3 if args.quick else 9)
    block_ms = args.block_ms or (20.0 if args.quick else 100.0)
    gen_repeats = args.gen_repeats or (2 if args.quick else 5)

    t0 = time.perf_counter()
    jpype, bench, model = start(args.threads)
    header(jpype, repeats, block_ms)
    calls(jpype, bench, repeats, block_ms / 1e3)
    buffers(jpype, bench, repeats, block_ms / 1e3)
    speed = generation(jpype, bench, model, gen_repeats, args.new, args.prompt)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"\ntotal {time.perf_counter() - t0:.0f} s (load average at the end {load})")
    print(f"headline: java bridge generate() from Java at {speed:.2f}x the Python speed (outputs identical)")
    print("call overhead, freePages(): " + ", ".join(
        f"{name} {CALLS[key] * 1e6:.2f} us" for name, key in (("launcher thread", "main"),
                                                              ("JVM thread unpinned", "unpinned"),
                                                              ("pinned", "pinned"), ("Python peer", "python"))))


if __name__ == "__main__":
    main()
