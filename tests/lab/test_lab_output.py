"""What ``smile-llm spec-lab`` shows while and after it runs: a progress line per timed run from the start, a
one-line hint when matplotlib is missing, plots whose lines can be told apart and whose k axis has integer ticks,
one-line errors naming a bad ``--model``, and the recorded-results table (``benchmarks/tables.py``) in step with
the recorded runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from smile_llm import cli
from smile_llm.lab import load_workload, plots

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "benchmarks" / "results" / "spec_lab"


@pytest.fixture(scope="module")
def two_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("workload") / "two.jsonl"
    path.write_text("".join(json.dumps(p.__dict__) + "\n" for p in load_workload("code")[:2]))
    return path


def lab(two_prompts: Path, out: Path, *extra: str) -> int:
    return cli.main(["spec-lab", "--drafters", "mtp,ngram", "--k", "1,2", "--workload", str(two_prompts), "--new",
                     "6", "--repeats", "1", "--threads", "1", "--out", str(out), *extra])


def test_progress_is_a_line_per_timed_run_from_the_start(two_prompts: Path, tmp_path: Path, capsys) -> None:
    assert lab(two_prompts, tmp_path) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("loading the plain model and one per drafter (mtp, ngram); 2 prompts, 4 "
                             "configurations, 1 torch thread(s)")
    assert err[1] == "warming up: one short call per configuration (4)"
    runs = [line for line in err if re.match(r"\[\s*\d+/12\] ", line)]
    # per prompt: plain then each configuration of a drafter, drafter after drafter (2 plain + 4 per prompt)
    assert len(runs) == 12 and runs[0].startswith("[ 1/12] repeat 1/1, prompt 1/2 (imports), plain: ")
    labels = [re.match(r"\[\s*\d+/\d+\] [^,]+, [^,]+, ([^:]+):", line).group(1) for line in runs[:6]]
    assert labels == ["plain", "mtp k=1", "mtp k=2", "plain", "ngram k=1", "ngram k=2"]
    assert runs[0].endswith(" left") and runs[-1].endswith("timed runs done")
    assert err.index(runs[0]) < err.index("repeat 1/1 done")


def test_without_matplotlib_the_plots_are_skipped_with_an_install_hint(two_prompts: Path, tmp_path: Path,
                                                                       monkeypatch, capsys) -> None:
    monkeypatch.setattr(plots, "_pyplot", lambda: None)
    assert lab(two_prompts, tmp_path) == 0
    captured = capsys.readouterr()
    assert "smile-llm spec-lab: plots skipped: matplotlib is not installed (pip install matplotlib" in captured.err
    assert not (tmp_path / "speedup_by_k.png").exists() and (tmp_path / "results.md").exists()


def eighteen() -> plots.PlotData:
    """Three drafters at k = 1..6, as the recorded ``default_code`` run."""
    from smile_llm.lab.plots import PlotData, PlotRow

    rows = [PlotRow(f"{d} k={k}", d, k, tuple(0.9 - 0.01 * j for j in range(k)), 1 + k / 10, 1 + k * 0.8)
            for d in ("mtp", "mtp-per-round", "ngram") for k in range(1, 7)]
    return PlotData("qwen3, code", tuple(rows))


def styles(ax) -> list[tuple[str, str, str]]:
    from matplotlib.colors import to_hex

    return [(to_hex(line.get_color()), line.get_marker(), line.get_linestyle()) for line in ax.get_lines()]


def test_acceptance_lines_can_be_told_apart() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from smile_llm.lab.plots import PlotData, PlotRow, acceptance_figure

    fig = acceptance_figure(eighteen())
    try:
        panels = [ax for ax in fig.axes if ax.get_visible() and ax.get_lines()]
        assert [ax.get_title() for ax in panels] == ["mtp", "mtp-per-round", "ngram"]  # a panel per drafter
        for ax in panels:
            seen = styles(ax)
            assert len(seen) == 6
            assert len({c for c, _, _ in seen}) == 6 and len({m for _, m, _ in seen}) == 6  # colours and markers
        many = PlotData("t", tuple(PlotRow(f"mtp k={i}", "mtp", i % 7 + 1, (0.5,), 1.0, 1.0) for i in range(20)))
        big = acceptance_figure(many)
        assert len(set(styles(big.axes[0]))) == 20  # past ten lines the marker still tells them apart
        plt.close(big)
    finally:
        plt.close(fig)


def test_speedup_by_k_has_integer_ticks_only() -> None:
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from smile_llm.lab.plots import PlotData, PlotRow, speedup_figure

    for ks in ((1, 2, 3, 4, 5, 6), (2, 4), (6, 7), (3,)):
        rows = tuple(PlotRow(f"mtp k={k}", "mtp", k, (0.9,) * k, 1 + k / 10, 2.0) for k in ks)
        fig = speedup_figure(PlotData("t", rows + (PlotRow("mtp tree=2,1", "mtp", None, (0.9, 0.8), 1.5, 2.0),)))
        try:
            assert list(fig.axes[0].get_xticks()) == list(ks)
        finally:
            plt.close(fig)


def test_recorded_results_draw_again_from_their_json(tmp_path: Path) -> None:
    """The recorded runs' plots are drawn from their results.json (``benchmarks/tables.py --plots``)."""
    pytest.importorskip("matplotlib")
    from smile_llm.lab.plots import plot_data_from_json

    data = plot_data_from_json(json.loads((RECORDED / "default_code" / "results.json").read_text()))
    assert len(data.rows) == 18 and data.title == "qwen3, code"
    assert [r.k for r in data.rows[:6]] == [1, 2, 3, 4, 5, 6]
    trees = plot_data_from_json(json.loads((RECORDED / "default_code_trees" / "results.json").read_text()))
    assert {r.label: r.k for r in trees.rows}["mtp tree=3,2,2"] is None
    copy = tmp_path / "default_code"
    copy.mkdir()
    (copy / "results.json").write_text((RECORDED / "default_code" / "results.json").read_text())
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tables.py"), "--plots", "--root",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert all((copy / name).stat().st_size > 0 for name in plots.PLOT_FILES)
    assert "| `default_code` | dense | code | " in (tmp_path / "summary.md").read_text()


def test_a_bad_model_is_one_line_naming_it(tmp_path: Path, capsys) -> None:
    readme = REPO / "README.md"
    assert cli.main(["spec-lab", "--model", str(readme), "--out", str(tmp_path)]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"smile-llm spec-lab: --model {readme} is a file, not a model folder")


def test_the_recorded_results_table_is_current() -> None:
    """``benchmarks/tables.py --check``: the committed table equals the one rendered from the recorded runs."""
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "tables.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
