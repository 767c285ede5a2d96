"""Run the benchmark scripts: ``python -m benchmarks [all|quick|NAME ...] [--skip NAME ...]``.

Each script runs as its own subprocess (``quick`` passes ``--quick``, or shorter options to scripts without it);
its stdout goes to ``benchmarks/results/<name>.txt`` and its final ``headline:`` line to one row of
``benchmarks/results/summary.md`` (``benchmarks/results/quick/`` for ``quick``, plots included, so a quick run
never overwrites the recorded figures). One progress line per script. Names may omit ``.py``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
SCRIPTS = ["cache_trace", "put_get_throughput", "step_bookkeeping", "reference_attention", "generate_vs_hf",
           "speculative", "shared_prefix", "chat_reuse", "memory", "java_bridge"]
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
        print(f"[{i}/{len(names)}] {name}.py {' '.join(extra)} ...", end=" ", flush=True)
        t0 = time.perf_counter()
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
        took = time.perf_counter() - t0
        (results / f"{name}.txt").write_text(r.stdout + (f"\n--- stderr ---\n{r.stderr}" if r.returncode else ""))
        heads = [ln.removeprefix("headline:").strip() for ln in r.stdout.splitlines() if ln.startswith("headline:")]
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            headline = f"FAILED (exit {r.returncode}): {last[:160]}"
        else:
            headline = heads[-1] if heads else "(no headline line)"
        print(f"{took:.0f} s" + ("" if r.returncode == 0 else f"  FAILED (see results/{name}.txt)"), flush=True)
        rows.append((name, " ".join(a for a in extra if a != "--out" and not a.startswith("/")) or "defaults", f"{took:.0f} s", headline))
    lines = [f"# Benchmark summary ({'quick' if quick else 'defaults'}, {time.strftime('%Y-%m-%d %H:%M')})", "",
             "| script | args | time | headline |", "|---|---|---|---|"]
    lines += [f"| `{n}.py` | {a} | {t} | {h.replace('|', '/')} |" for n, a, t, h in rows]
    (results / "summary.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {results / 'summary.md'}")
    print("\n".join(lines))
    return 1 if any(r[3].startswith("FAILED") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
