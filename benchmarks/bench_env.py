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


def popen_server(cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``cmd`` started as a server process in the temporary folder, its stdout discarded and its stderr kept in a
    file (a pipe nobody reads until the end would block a server that logs more than the pipe's buffer)."""
    import tempfile

    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, cwd=tempfile.gettempdir())
    proc.stderr_log = log  # type: ignore[attr-defined]
    return proc


def stderr_tail(proc: subprocess.Popen[bytes]) -> str:
    """The end of what a server started by ``popen_server`` wrote to stderr."""
    log = getattr(proc, "stderr_log", None)
    if log is None:
        return ""
    log.seek(0)
    return log.read().decode(errors="replace")[-2000:]
