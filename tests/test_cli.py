"""The main job (``make demo``) runs end to end and reuses the conversation prefix turn after turn."""

from __future__ import annotations

import subprocess
import sys

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
