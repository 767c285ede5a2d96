"""The lab's PNG plots (matplotlib, Agg backend): acceptance by position, speedup by k, best per
drafter.

The plots are drawn from ``PlotData``, which comes from a fresh ``LabResult`` (``plot_data``) or
from a results folder's ``results.json`` (``plot_data_from_json``), so a recorded run's plots can be
drawn again without running it (``benchmarks/tables.py --plots`` does that for the recorded runs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .result import LabResult

PLOT_FILES = ("acceptance_by_position.png", "speedup_by_k.png", "drafters.png")
MATPLOTLIB_HINT = ("pip install matplotlib (or the package's bench extra: "
                   "pip install -e '.[bench]' in the smile-llm checkout)")
# a qualitative palette (matplotlib's tab10) and markers: within one panel every line differs in
# colour and, past ten lines, in marker too
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
          "#bcbd22", "#17becf")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h")


@dataclass(frozen=True)
class PlotRow:
    """One configuration as the plots need it. ``k``: the fixed draft count of a linear
    configuration (no extra ``generate`` arguments), else None (a tree, a policy, an extra
    configuration). ``acceptance``: P(draft j accepted | drafts before it accepted) for j = 1..
    (None where no round reached j)."""

    label: str
    drafter: str
    k: int | None
    acceptance: tuple[float | None, ...]
    speedup: float
    tokens_per_round: float


@dataclass(frozen=True)
class PlotData:
    """What the plots show: a ``title`` (model and workload) and the rows in the lab's configuration
    order."""

    title: str
    rows: tuple[PlotRow, ...]

    def by_drafter(self) -> dict[str, list[PlotRow]]:
        """The rows grouped by drafter, drafters in order of first appearance."""
        out: dict[str, list[PlotRow]] = {}
        for r in self.rows:
            out.setdefault(r.drafter, []).append(r)
        return out


def plot_data(result: LabResult) -> PlotData:
    """The plot data of a lab result."""
    rows = []
    for r in result.results:
        c = r.configuration
        rows.append(PlotRow(c.label, c.drafter, c.k if not c.generate_kwargs else None,
                            tuple(r.tally.acceptance_by_position()), r.speedup(result.plain),
                            r.tally.tokens_per_round))
    title = f"{result.environment['model_description'].split(',')[0]}, {result.config.workload}"
    return PlotData(title, tuple(rows))


def plot_data_from_json(data: Mapping[str, Any]) -> PlotData:
    """The plot data of a parsed ``results.json`` (as ``write_results`` writes it). KeyError for
    another JSON."""
    rows = []
    for c in data["configurations"]:
        k = c["speculative_tokens"]
        linear = isinstance(k, int) and not isinstance(k, bool) and not c["generate_kwargs"]
        rows.append(PlotRow(c["label"], c["drafter"], k if linear else None,
                            tuple(c["rounds"]["acceptance_by_position"]), float(c["wall_speedup"]),
                            float(c["tokens_per_round"])))
    title = (f"{data['environment']['model_description'].split(',')[0]}, "
             f"{data['config']['workload']}")
    return PlotData(title, tuple(rows))


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plots_available() -> bool:
    """Whether matplotlib is installed (without it ``write_plots`` writes nothing;
    ``MATPLOTLIB_HINT`` says how to install it)."""
    return _pyplot() is not None


def line_style(index: int, linear: bool) -> dict[str, Any]:
    """The style of the ``index``-th line of a panel: its own colour (ten) and marker (nine), so no
    two of the first 90 lines look alike; solid for a linear configuration, dashed for a tree or a
    policy."""
    return {"color": COLORS[index % len(COLORS)], "marker": MARKERS[index % len(MARKERS)],
            "linestyle": "-" if linear else "--"}


def acceptance_figure(data: PlotData) -> Any:
    """One panel per drafter (shared y axis), one line per configuration with ``line_style``:
    acceptance by draft position (depth, for trees). Needs matplotlib (ImportError otherwise)."""
    plt = _pyplot()
    if plt is None:
        raise ImportError(f"matplotlib is not installed: {MATPLOTLIB_HINT}")
    groups = data.by_drafter()
    cols = min(3, max(1, len(groups)))
    nrows = max(1, math.ceil(len(groups) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(6.4 if cols == 1 else 4.6 * cols, 3.9 * nrows),
                             sharey=True, squeeze=False)
    depth = max((len(r.acceptance) for r in data.rows), default=1)
    flat = [ax for row in axes for ax in row]
    for ax, (drafter, rows) in zip(flat, groups.items()):
        for i, r in enumerate(rows):
            xs = [j + 1 for j, a in enumerate(r.acceptance) if a is not None]
            ax.plot(xs, [a for a in r.acceptance if a is not None],
                    label=r.label.removeprefix(drafter).strip(), markersize=4, linewidth=1.3,
                    **line_style(i, r.k is not None))
        ax.set_xticks(range(1, depth + 1))
        ax.set_ylim(0, 1.02)
        ax.set_title(drafter, fontsize=10)
        ax.set_xlabel("draft position j (depth, for trees)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if len(rows) > 6 else 1, loc="lower left")
    for ax in flat[len(groups):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("P(draft j accepted | drafts before it)")
    fig.suptitle(f"acceptance by position ({data.title})")
    fig.tight_layout()
    return fig


def speedup_figure(data: PlotData) -> Any:
    """Wall speedup over plain decoding against k, one line per drafter over its linear
    configurations, with a tick at every k measured (integers only). Needs matplotlib."""
    plt = _pyplot()
    if plt is None:
        raise ImportError(f"matplotlib is not installed: {MATPLOTLIB_HINT}")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ks: set[int] = set()
    for i, (drafter, rows) in enumerate(data.by_drafter().items()):
        fixed = sorted((r for r in rows if r.k is not None), key=lambda r: r.k or 0)
        if fixed:
            ks.update(r.k for r in fixed if r.k is not None)
            ax.plot([r.k for r in fixed], [r.speedup for r in fixed], label=drafter,
                    **line_style(i, True))
    ax.set_xticks(sorted(ks) or [1])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("drafts per round (k)")
    ax.set_ylabel("wall speedup over plain decoding")
    ax.set_title(f"speedup by k ({data.title})")
    ax.grid(alpha=0.3)
    if ks:
        ax.legend()
    fig.tight_layout()
    return fig


def drafters_figure(data: PlotData) -> Any:
    """Per drafter, its best configuration's wall speedup and tokens per round (bars). Needs
    matplotlib."""
    plt = _pyplot()
    if plt is None:
        raise ImportError(f"matplotlib is not installed: {MATPLOTLIB_HINT}")
    groups = data.by_drafter()
    names = list(groups)
    colors = [COLORS[i % len(COLORS)] for i in range(len(names))]
    best = [max(groups[d], key=lambda r: r.speedup) for d in names]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    left.bar(names, [r.speedup for r in best], color=colors)
    left.axhline(1.0, color="grey", lw=0.8)
    left.set_ylabel("best wall speedup over plain")
    for x, r in enumerate(best):
        left.annotate(r.label.removeprefix(names[x]).strip(), (x, r.speedup), ha="center",
                      va="bottom", fontsize=8)
    right.bar(names, [r.tokens_per_round for r in best], color=colors)
    right.set_ylabel("tokens per round (at the best configuration)")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"per drafter ({data.title})")
    fig.tight_layout()
    return fig


def save_plots(data: PlotData, folder: Path) -> list[Path]:
    """The three plots of ``data`` written into ``folder`` as ``PLOT_FILES``; returns their paths,
    or an empty list when matplotlib is not installed (see ``plots_available``)."""
    plt = _pyplot()
    if plt is None:
        return []
    paths = [folder / name for name in PLOT_FILES]
    for path, draw in zip(paths, (acceptance_figure, speedup_figure, drafters_figure)):
        fig = draw(data)
        fig.savefig(path, dpi=110)
        plt.close(fig)
    return paths


def write_plots(result: LabResult, folder: Path) -> list[Path]:
    """``acceptance_by_position.png``, ``speedup_by_k.png`` and ``drafters.png`` of ``result`` in
    ``folder``; returns them, or an empty list when matplotlib is not installed
    (``MATPLOTLIB_HINT``)."""
    return save_plots(plot_data(result), folder)
