"""The lab's PNG plots (matplotlib, Agg backend): acceptance by position, speedup by k, best per drafter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .result import ConfigResult, LabResult


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _by_drafter(result: LabResult) -> dict[str, list[ConfigResult]]:
    out: dict[str, list[ConfigResult]] = {}
    for r in result.results:
        out.setdefault(r.configuration.drafter, []).append(r)
    return out


def write_plots(result: LabResult, folder: Path) -> list[Path]:
    """``acceptance_by_position.png``, ``speedup_by_k.png`` and ``drafters.png`` in ``folder``; returns them, or
    an empty list when matplotlib is not installed (``pip install matplotlib``)."""
    plt = _pyplot()
    if plt is None:
        return []
    title = f"{result.environment['model_description'].split(',')[0]}, {result.config.workload}"
    groups = _by_drafter(result)
    colors = {d: f"C{i}" for i, d in enumerate(groups)}
    paths = [folder / "acceptance_by_position.png", folder / "speedup_by_k.png", folder / "drafters.png"]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for drafter, rows in groups.items():
        for i, r in enumerate(rows):
            rates = r.tally.acceptance_by_position()
            xs = [j + 1 for j, a in enumerate(rates) if a is not None]
            style = "o--" if r.configuration.generate_kwargs or r.configuration.k is None else "o-"
            ax.plot(xs, [a for a in rates if a is not None], style, color=colors[drafter],
                    alpha=0.35 + 0.65 * (i + 1) / len(rows), label=r.configuration.label, markersize=4)
    ax.set_xticks(range(1, max((r.tally.max_k for r in result.results), default=1) + 1))
    ax.set_xlabel("draft position j (depth, for trees)")
    ax.set_ylabel("P(draft j accepted | drafts before it accepted)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"acceptance by position ({title})")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for drafter, rows in groups.items():
        fixed = [r for r in rows if r.configuration.k is not None and not r.configuration.generate_kwargs]
        if fixed:
            ax.plot([r.configuration.k for r in fixed], [r.speedup(result.plain) for r in fixed], "o-",
                    color=colors[drafter], label=drafter)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xlabel("drafts per round (k)")
    ax.set_ylabel("wall speedup over plain decoding")
    ax.set_title(f"speedup by k ({title})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[1], dpi=110)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    names = list(groups)
    best = [max(groups[d], key=lambda r: r.speedup(result.plain)) for d in names]
    left.bar(names, [r.speedup(result.plain) for r in best], color=[colors[d] for d in names])
    left.axhline(1.0, color="grey", lw=0.8)
    left.set_ylabel("best wall speedup over plain")
    for x, r in enumerate(best):
        left.annotate(r.configuration.label.removeprefix(names[x]).strip(), (x, r.speedup(result.plain)),
                      ha="center", va="bottom", fontsize=8)
    right.bar(names, [r.tally.tokens_per_round for r in best], color=[colors[d] for d in names])
    right.set_ylabel("tokens per round (at the best configuration)")
    for ax in (left, right):
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle(f"per drafter ({title})")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    return paths
