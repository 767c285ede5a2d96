"""The recorded ``smile-llm spec-lab`` runs as one table, rendered from their results.

Every folder of ``benchmarks/results/spec_lab/`` holds one run's ``results.json`` (as ``write_results`` writes it).
This script renders ``benchmarks/results/spec_lab/summary.md``: one row per run with its MTP wall speedup at each k
and each drafter's best configuration. The docs cite that table instead of copying figures from it.

    .venv/bin/python benchmarks/tables.py            # write benchmarks/results/spec_lab/summary.md
    .venv/bin/python benchmarks/tables.py --check    # exit 1 when summary.md is not what the recorded runs give
    .venv/bin/python benchmarks/tables.py --plots    # also draw every run's plots again from its results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "spec_lab"
SUMMARY = "summary.md"
MAX_K = 7


def load_runs(root: Path = RESULTS) -> list[tuple[str, dict[str, Any]]]:
    """``(folder name, parsed results.json)`` of every recorded run under ``root``, oldest first (by the date the
    run recorded, then by name)."""
    runs = [(p.parent.name, json.loads(p.read_text(encoding="utf-8"))) for p in root.glob("*/results.json")]
    return sorted(runs, key=lambda run: (run[1]["environment"]["date"], run[0]))


def _speedups(data: Mapping[str, Any], drafter: str) -> dict[int, float]:
    """The wall speedup of each linear configuration (a fixed k, no extra arguments) of ``drafter``."""
    out = {}
    for c in data["configurations"]:
        k = c["speculative_tokens"]
        if c["drafter"] == drafter and isinstance(k, int) and not c["generate_kwargs"]:
            out[k] = float(c["wall_speedup"])
    return out


def row(name: str, data: Mapping[str, Any]) -> str:
    """One run's row: folder, model, workload, when and which code, the MTP wall speedup at each k (the run's best
    in bold, "-" where not measured) and each drafter's best configuration."""
    env, config = data["environment"], data["config"]
    mtp = _speedups(data, "mtp")
    top = max(mtp.values(), default=None)
    cells = ["-" if k not in mtp else (f"**{mtp[k]:.2f}x**" if mtp[k] == top else f"{mtp[k]:.2f}x")
             for k in range(1, MAX_K + 1)]
    when = env["date"][:16].replace("T", " ")
    return (f"| `{name}` | {config['kind']} | {config['workload']} | {when}, {env['code_version']} | "
            f"{config['repeats']} | " + " | ".join(cells) + f" | {best_per_drafter(data)} |")


def best_per_drafter(data: Mapping[str, Any]) -> str:
    """Each drafter's fastest configuration (any kind: k, tree, policy) as "label speedup (tokens per round)", the
    run's best first and in bold, then the others in the run's drafter order."""
    best: dict[str, Mapping[str, Any]] = {}
    for c in data["configurations"]:
        if c["drafter"] not in best or c["wall_speedup"] > best[c["drafter"]]["wall_speedup"]:
            best[c["drafter"]] = c
    ordered = sorted(best.values(), key=lambda c: -c["wall_speedup"])
    cells = [f"{c['label']} {c['wall_speedup']:.2f}x ({c['tokens_per_round']:.2f})" for c in ordered]
    return "; ".join([f"**{cells[0]}**", *cells[1:]]) if cells else "-"


def render(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """``summary.md``: the table of ``runs`` with what its numbers mean."""
    ks = " | ".join(f"mtp k={k}" for k in range(1, MAX_K + 1))
    lines = ["# Recorded `smile-llm spec-lab` runs", "",
             "Rendered by `benchmarks/tables.py` from each folder's `results.json`; do not edit by hand. Each cell is",
             "a wall speedup over plain decoding measured in the same run (medians over `repeats` timed runs per",
             "prompt, greedy, every output identical to plain decoding). Runs were recorded at different times and",
             "under different machine load, so the same configuration differs between rows by several percent:",
             "compare configurations within a row. Each folder also holds the run's command line (`command.txt`),",
             "its full table (`results.md`) and plots.", "",
             f"| run | model | workload | recorded (UTC), code | repeats | {ks} | best of each drafter: wall "
             f"speedup (tokens per round) |",
             "|" + "---|" * (6 + MAX_K)]
    lines += [row(name, data) for name, data in runs]
    return "\n".join(lines) + "\n"


def redraw_plots(runs: Sequence[tuple[str, Mapping[str, Any]]], root: Path = RESULTS) -> list[Path]:
    """Draw every run's plots again into its folder from its results.json; returns the files written."""
    from smile_llm.lab.plots import MATPLOTLIB_HINT, plot_data_from_json, plots_available, save_plots

    if not plots_available():
        raise SystemExit(f"tables.py: matplotlib is not installed: {MATPLOTLIB_HINT}")
    written: list[Path] = []
    for name, data in runs:
        written += save_plots(plot_data_from_json(data), root / name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or ``--check``) the summary of the recorded runs; ``--plots`` also redraws their plots. Returns 0, or
    1 when ``--check`` finds the committed summary out of date."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--check", action="store_true", help="compare with the committed summary.md instead of writing")
    p.add_argument("--plots", action="store_true", help="also draw every recorded run's plots again")
    p.add_argument("--root", type=Path, default=RESULTS, help="the folder of recorded runs")
    args = p.parse_args(argv)
    runs = load_runs(args.root)
    text = render(runs)
    target = args.root / SUMMARY
    if args.check:
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            print(f"{target} is out of date: run .venv/bin/python benchmarks/tables.py", file=sys.stderr)
            return 1
        print(f"{target} matches the {len(runs)} recorded runs")
    else:
        target.write_text(text, encoding="utf-8")
        print(f"wrote {target}")
    if args.plots:
        for path in redraw_plots(runs, args.root):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
