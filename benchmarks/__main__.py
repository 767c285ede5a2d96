"""Run the benchmark scripts: ``python -m benchmarks [all|quick|NAME ...] [--skip NAME ...]`` (also
``smile-llm bench ...``).

Each script runs as its own subprocess (``quick`` passes ``--quick``, or shorter options to scripts without it);
its stdout goes to ``benchmarks/results/<name>.txt`` and its final ``headline:`` line, dated, to its row of
``benchmarks/results/summary.md`` (rows of scripts not run keep their earlier figures; ``benchmarks/results/quick/``
for ``quick``, plots included, so a quick run
never overwrites the recorded figures). On a terminal a progress bar shows the scripts done, the running one's
elapsed time and its latest output line; otherwise one line per script. Names may omit ``.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SCRIPTS = ["cache_trace", "put_get_throughput", "step_bookkeeping", "reference_attention", "generate_vs_hf",
           "speculative", "shared_prefix", "chat_reuse", "memory", "java_bridge", "realistic_size",
           "concurrent_generate", "decode_step", "java_serving", "deltanet_ops", "hybrid_generate",
           "hybrid_chat_ttft", "tensor_parallel", "sampling_cost", "kv_dtype", "n_samples", "draft_model",
           "structured", "segment_splice"]
OUT_ARG = {"speculative", "shared_prefix", "chat_reuse"}  # scripts that save files under --out
QUICK_ARGS = {"speculative": ["--prompts", "2", "--new", "60", "--repeats", "1", "--ks", "3", "--draft-kv", "history"]}


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("what", nargs="*", default=["all"], help="all, quick, or script names")
    p.add_argument("--skip", nargs="*", default=[], help="script names to leave out")
    args = p.parse_args()
    quick = "quick" in args.what
    names = [w.removesuffix(".py") for w in args.what if w not in ("all", "quick")] or list(SCRIPTS)
    unknown = [n for n in names if n not in SCRIPTS]
    if unknown:
        p.error(f"unknown scripts {unknown}; choose from {SCRIPTS}")
    names = [n for n in names if n not in {s.removesuffix(".py") for s in args.skip}]
    results = RESULTS / "quick" if quick else RESULTS
    results.mkdir(parents=True, exist_ok=True)
    rows = []
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for i, name in enumerate(names, 1):
        extra = (QUICK_ARGS.get(name, ["--quick"])) if quick else []
        if quick and name in OUT_ARG:
            extra = extra + ["--out", str(results)]
        cmd = [sys.executable, str(HERE / f"{name}.py"), *extra]
        label = f"[{i}/{len(names)}] {name}.py {' '.join(a for a in extra if not a.startswith('/'))}".rstrip()
        r, took = run_with_progress(cmd, env, label, done=i - 1, total=len(names))
        (results / f"{name}.txt").write_text(r.stdout + (f"\n--- stderr ---\n{r.stderr}" if r.returncode else ""))
        heads = [ln.removeprefix("headline:").strip() for ln in r.stdout.splitlines() if ln.startswith("headline:")]
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            headline = f"FAILED (exit {r.returncode}): {last[:160]}"
        else:
            headline = heads[-1] if heads else "(no headline line)"
        print(f"{label} ... {took:.0f} s" + ("" if r.returncode == 0 else f"  FAILED (see results/{name}.txt)"),
              flush=True)
        args_shown = " ".join(a for a in extra if a != "--out" and not a.startswith("/")) or "defaults"
        rows.append((name, args_shown, f"{took:.0f} s", headline))
    stamp = time.strftime("%Y-%m-%d %H:%M")
    table = earlier_rows(results / "summary.md")  # scripts not run this time keep their recorded row
    table.update({n: f"| `{n}.py` | {a} | {t} | {h.replace('|', '/')} ({stamp}) |" for n, a, t, h in rows})
    lines = [f"# Benchmark summary ({'quick' if quick else 'defaults'}; each row dated)", "",
             "| script | args | time | headline |", "|---|---|---|---|"]
    lines += [table[n] for n in SCRIPTS if n in table]
    (results / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {results / 'summary.md'}")
    print("\n".join(lines))
    return 1 if any(r[3].startswith("FAILED") for r in rows) else 0


def earlier_rows(summary: Path) -> dict[str, str]:
    """The table rows of an existing ``summary.md`` by script name (empty when there is none)."""
    if not summary.is_file():
        return {}
    rows = {}
    for line in summary.read_text().splitlines():
        if line.startswith("| `") and ".py` |" in line:
            rows[line[3 : line.index(".py`")]] = line
    return rows


def run_with_progress(cmd: list[str], env: dict[str, str], label: str, done: int,
                      total: int) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``cmd``, collecting its output; on a terminal, redraw one status line twice a second: a bar of the
    scripts done, the running script's elapsed seconds and its latest output line (stdout or stderr)."""
    live = sys.stdout.isatty()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    out: list[str] = []
    err: list[str] = []
    latest = [""]

    def pump(stream, sink: list[str]) -> None:  # type: ignore[no-untyped-def]
        for line in stream:
            sink.append(line)
            if line.strip():
                latest[0] = line.strip()

    readers = [threading.Thread(target=pump, args=(proc.stdout, out), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err), daemon=True)]
    for t in readers:
        t.start()
    while proc.poll() is None:
        if live:
            bar = "#" * done + "-" * (total - done)
            status = f"[{bar}] {label} {time.perf_counter() - t0:4.0f} s | {latest[0]}"
            width = os.get_terminal_size().columns if sys.stdout.isatty() else 120
            sys.stdout.write("\r" + status[: width - 1].ljust(width - 1))
            sys.stdout.flush()
        time.sleep(0.5)
    for t in readers:
        t.join()
    if live:
        sys.stdout.write("\r" + " " * (os.get_terminal_size().columns - 1) + "\r")
    took = time.perf_counter() - t0
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(out), "".join(err)), took


if __name__ == "__main__":
    sys.exit(main())
