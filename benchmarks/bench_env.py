"""What the benchmark scripts print about the code they measured."""

from __future__ import annotations

import os
import subprocess


def code_version() -> str:
    """``git`` commit of the checkout (``+dirty`` when smile_llm/ has uncommitted changes), or ``unknown``."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "smile_llm"], capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")
