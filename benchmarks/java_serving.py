#!/usr/bin/env python
"""The JVM as a serving client of the default model, timed in Java (``benchmarks/java/ServingBench.java``) in the
same process as its Python peer:

    (a) ``--callers`` Java threads (JVM-created, unpinned) each calling ``LanguageModel.generate`` at once (greedy,
        ``--new`` tokens, a different prompt each) against the same requests one after another from one Java
        thread. The concurrent calls are batched on the model's one scheduler. Goal: >= 4x the throughput. Three
        variants: the default model (MTP speculative decoding), the same weights decoding plainly
        (``--drafter none``), and speculation only in steps of at most 4 requests (``--speculative-max-batch 4``).
    (b) The asynchronous API: ``--in-flight`` requests ``submit``ted from one Java thread and joined, against the
        same requests submitted to a Python ``InferenceEngine`` (batch size ``--in-flight``, the same prefill budget)
        and waited on from Python. Goal: within 10% of Python.

Every output is checked equal to its solo (sequential) greedy output. Prefix reuse is off, so every run prefills
its prompts. Medians of ``--repeats``, the variants interleaved.

    .venv/bin/python benchmarks/java_serving.py [--callers 8] [--new 64] [--in-flight 64] [--repeats 3] [--quick]
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # the java_bridge package, not benchmarks/java_bridge.py
from java_bridge.build import bridge_jar, compile_java  # noqa: E402

sys.path.insert(1, str(HERE))
from bench_env import code_version  # noqa: E402
from speculative import stdlib_prompts  # noqa: E402


def start(lm: Any, torch_threads: int) -> tuple[Any, Any, Any]:
    """Compile the driver, start the JVM, register the model; returns (jpype, ServingBench, the Java model)."""
    classes = Path(tempfile.mkdtemp(prefix="servingbench-"))
    atexit.register(shutil.rmtree, classes, True)
    compile_java([HERE / "java" / "ServingBench.java"], classes, classpath=[bridge_jar()])
    from java_bridge.jvm import start_jvm

    jpype = start_jvm([classes], torch_threads=torch_threads)
    from java_bridge.adapters import LanguageModelAdapter, PinThread

    bridge = jpype.JClass("smile.llm.python.Bridge")
    bridge.register("pinCurrentThread", PinThread())
    bridge.register("model", LanguageModelAdapter(lm))
    return jpype, jpype.JClass("ServingBench"), bridge.languageModel()


def java_rows(jpype: Any, prompts: list[list[int]]) -> Any:
    return jpype.JArray(jpype.JInt, 2)([jpype.JArray(jpype.JInt)(p) for p in prompts])


def python_engine(lm: Any, prompts: list[list[int]], new: int, batch: int) -> tuple[float, list[list[int]]]:
    from smile_llm.engine import InferenceEngine, SamplingParams

    with InferenceEngine(lm, batch) as engine:
        t0 = time.perf_counter()
        handles = [engine.submit(p, SamplingParams(new)) for p in prompts]
        out = [h.result().tokens for h in handles]
        return time.perf_counter() - t0, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--callers", type=int, default=8)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--in-flight", type=int, default=64)
    p.add_argument("--prompt-bytes", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (the launcher's default)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    if args.quick:
        args.new, args.in_flight, args.repeats = 32, 16, 1
    from smile_llm import LanguageModel

    lm = LanguageModel.default(max_batch_size=args.in_flight, max_seq_len=512)  # a pool sized for every request
    lm.pool.prefix_reuse_enabled = False
    jpype, bench, jlm = start(lm, args.torch_threads)
    print(f"java_serving: smile_llm {code_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"{os.cpu_count()} cpus (load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}); greedy, "
          f"{args.new} new tokens, prompts of {args.prompt_bytes} bytes; medians of {args.repeats}\n")
    texts = stdlib_prompts(max(args.callers, args.in_flight), args.prompt_bytes)
    prompts = [lm.encode(t) for t in texts]
    solo = [lm.generate(q, args.new).tokens for q in prompts]  # also the warm-up

    # (a) concurrent generate from Java threads vs one Java thread, speculative (the default model) and plain
    few = prompts[: args.callers]
    rows = java_rows(jpype, few)
    plain = LanguageModel.default(max_batch_size=args.in_flight, max_seq_len=512, drafter="none")
    plain.pool.prefix_reuse_enabled = False
    from java_bridge.adapters import LanguageModelAdapter

    jplain = jpype.JObject(LanguageModelAdapter(plain),
                           jpype.JClass("smile.llm.python.PythonLanguageModel"))
    plain.generate(prompts[0], 8)  # warm-up
    tokens = args.callers * args.new
    print(f"(a) {args.callers} Java threads calling generate() at once vs one after another from one Java thread")
    ratios = {}
    variants = (("speculative (default)", jlm, None), ("plain decoding", jplain, None),
                ("speculative, max batch 4", jlm, 4))  # the launcher's --speculative-max-batch 4
    for label, model, max_batch in variants:
        lm.speculative_max_batch = max_batch
        seq_t, conc_t = [], []
        for rep in range(args.repeats):
            for which in (("seq", "conc") if rep % 2 == 0 else ("conc", "seq")):
                out = jpype.JArray(jpype.JInt, 2)(len(few))
                if which == "seq":
                    seq_t.append(bench.sequential(model, rows, args.new, out) / 1e9)
                else:
                    conc_t.append(bench.concurrent(model, rows, args.new, out, False) / 1e9)
                assert [list(map(int, r)) for r in out] == solo[: args.callers], f"{which}: output differs from solo"
        s, c = statistics.median(seq_t), statistics.median(conc_t)
        ratios[label] = (s, c)
        print(f"    {label:25s} sequential {s:6.2f} s ({tokens / s:6.1f} tok/s)   concurrent {c:6.2f} s "
              f"({tokens / c:6.1f} tok/s)   ratio {s / c:5.2f}x (goal >= 4x)")
    lm.speculative_max_batch = None
    print("    outputs identical to solo (greedy) in every variant")
    plain.close()
    s, c = ratios["speculative (default)"]

    # (b) submit() futures from one Java thread vs the Python engine
    many = prompts[: args.in_flight]
    rows = java_rows(jpype, many)
    java_t, py_t = [], []
    for rep in range(args.repeats):
        for which in (("java", "py") if rep % 2 == 0 else ("py", "java")):
            if which == "java":
                out = jpype.JArray(jpype.JInt, 2)(len(many))
                java_t.append(bench.submitted(jlm, rows, args.new, out) / 1e9)
                got = [list(map(int, r)) for r in out]
            else:
                t, got = python_engine(lm, many, args.new, args.in_flight)
                py_t.append(t)
            assert got == solo[: args.in_flight], f"{which}: output differs from solo"
    j, q = statistics.median(java_t), statistics.median(py_t)
    tokens = args.in_flight * args.new
    print(f"(b) {args.in_flight} requests in flight: Java submit() futures from one thread vs the Python engine")
    print(f"    Java {j:6.2f} s ({tokens / j:6.1f} tok/s)   Python engine {q:6.2f} s ({tokens / q:6.1f} tok/s)   "
          f"Java/Python throughput {q / j:5.2f} (goal >= 0.90); outputs identical to solo")
    print(f"\nheadline: {args.callers} Java threads {s / c:.2f}x sequential; async API {q / j:.2f}x the Python engine")
    lm.close()


if __name__ == "__main__":
    main()
