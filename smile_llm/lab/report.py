"""The lab's results folder: ``results.md`` (the table), ``results.json`` (every number),
``command.txt`` (how to reproduce it) and the plots (``plots.py``)."""

from __future__ import annotations

import json
from pathlib import Path

from .plots import write_plots
from .result import ConfigResult, LabResult


def _acceptance(r: ConfigResult) -> str:
    rates = r.tally.acceptance_by_position()
    return " ".join("-" if a is None else f"{a:.2f}" for a in rates) or "-"


def table(result: LabResult) -> str:
    """The markdown table: one row per configuration."""
    lines = ["| configuration | tokens per round | acceptance by position (1..k) | target forwards "
             "/ token | wall speedup | decode speedup | draft cost share | lossless check |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result.results:
        lines.append(f"| {r.configuration.label} | {r.tally.tokens_per_round:.2f} | "
                     f"{_acceptance(r)} | {r.target_forwards_per_token:.3f} | "
                     f"{r.speedup(result.plain):.2f}x | {r.decode_speedup(result.plain):.2f}x | "
                     f"{100 * r.timings.draft_cost_share:.1f}% | "
                     f"{r.check.describe() if r.check else 'not run'} |")
    return "\n".join(lines)


def headline(result: LabResult) -> str:
    """One line: the best lossless configuration and its speedup, or the failures."""
    if not result.passed:
        return "LOSSLESS CHECK FAILED: " + "; ".join(
            f"{r.configuration.label}: {r.check.describe() if r.check else 'not run'}"
            for r in result.failures)
    best = result.best()
    return (f"best: {best.configuration.label}, {best.speedup(result.plain):.2f}x plain decoding's "
            f"wall time, {best.tally.tokens_per_round:.2f} tokens per round; every configuration "
            "lossless")


def markdown(result: LabResult, command: str) -> str:
    """``results.md``: what ran, the table, the headline."""
    c, env = result.config, result.environment
    mode = "greedy (outputs compared token for token)" if c.temperature == 0 else (
        f"temperature {c.temperature} (distribution test: {c.samples} samples of the first "
        f"{c.sample_tokens} tokens of {min(c.sample_prompts, len(result.prompts))} prompts)")
    lines = [f"# Speculative-decoding lab: {env['model']}", "",
             f"`{command}`", "",
             f"- model: {env['model_description']}",
             f"- workload: {c.workload} ({len(result.prompts)} prompts, {c.new_tokens} new tokens "
             f"unless the workload says otherwise), {mode}",
             f"- {c.repeats} repeats (medians), {env['torch_threads']} torch thread(s), prefix "
             f"reuse {'on' if c.prefix_reuse else 'off'}, device {env['device']}",
             f"- code {env['code_version']}, torch {env['torch']}, python {env['python']}, "
             f"{env['date']}",
             f"- plain decoding: {result.plain.wall_total_s:.3f} s wall for the workload "
             f"(decode {result.plain.decode_total_s:.3f} s)", "",
             table(result), "", headline(result), "",
             *(f"- {note}" for note in result.notes), *([""] if result.notes else []),
             "Tokens per round: accepted drafts + the bonus token. Acceptance by position j: "
             "P(draft j accepted | drafts 1..j-1 accepted). Target forwards per token: decode "
             "forwards per generated token after the first (plain: 1.0). Wall speedup: plain "
             "decoding's workload wall time (sum over prompts of the median generate() time) over "
             "the configuration's; decode speedup the same without prefills. Draft cost share: "
             "time in the drafter's propose() over decode time."]
    return "\n".join(lines) + "\n"


def command_text(result: LabResult, command: str) -> str:
    """``command.txt``: the command line and the environment it ran in."""
    env = result.environment
    return "\n".join([command, "", *(f"{k}: {v}" for k, v in env.items())]) + "\n"


def write_results(result: LabResult, out: str | Path, command: str) -> list[Path]:
    """Write the results folder ``out`` (created if needed); returns the files written. ``command``
    is the command line (or the Python call) that produced ``result``."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    files = {"results.md": markdown(result, command), "command.txt": command_text(result, command),
             "results.json": json.dumps({"command": command, **result.to_json()}, indent=1) + "\n"}
    written = []
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
        written.append(folder / name)
    return written + write_plots(result, folder)
