"""The main job (``make demo``) runs end to end and reuses the conversation prefix turn after turn."""

from __future__ import annotations

import subprocess
import sys

import pytest

from smile_llm.demo import run_demo


def test_demo_reuses_prefixes_deterministically() -> None:
    stats = run_demo(turns=6, seed=7)
    assert stats["prefix_match_tokens"] == 1536 and stats["prefix_prompt_tokens"] == 1964
    assert stats["bound_requests"] == 0 and stats["private_pages"] == 0
    assert stats["cached_tokens"] == stats["tree_pages"] * 16 == 736


def test_cli_entry_point_runs_the_demo() -> None:
    out = subprocess.run([sys.executable, "-m", "smile_llm", "cache-demo", "--turns", "2"], capture_output=True,
                         text=True, check=True).stdout
    assert "invariants hold" in out and "alice" in out and "bob" in out


def test_bench_runs_the_benchmark_runner(tmp_path, monkeypatch, capsys) -> None:
    """``smile-llm bench`` hands its arguments to ``python -m benchmarks`` in the checkout; an unknown script name
    is the runner's own usage error (2), and an install without the checkout's benchmarks/ gets a hint (2)."""
    from smile_llm import cli

    out = subprocess.run([sys.executable, "-m", "smile_llm", "bench", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "python -m benchmarks" in out.stdout and "--skip" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "smile_llm", "bench", "no_such_script"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "unknown scripts ['no_such_script']" in bad.stderr
    monkeypatch.setattr(cli, "__file__", str(tmp_path / "smile_llm" / "cli.py"))
    assert cli.main(["bench", "all"]) == 2
    assert "no benchmarks/ beside the package" in capsys.readouterr().err


def test_serve_jvm_help_names_itself(capsys) -> None:
    from smile_llm.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["serve-jvm", "--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: smile-llm serve-jvm ")
