"""Starting the JVM (once per process: JPype cannot restart it) with the bridge jar on the class path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .build import bridge_jar


def start_jvm(classpath: list[str | Path] | None = None, jvm_args: list[str] | None = None) -> Any:
    """Start the JVM with the bridge jar plus ``classpath`` (idempotent: a running JVM is kept, and then the extra
    class path cannot be added). Returns the ``jpype`` module. ImportError if JPype is not installed."""
    import jpype

    if not jpype.isJVMStarted():
        cp = [str(bridge_jar()), *(str(p) for p in classpath or [])]
        jpype.startJVM(*(jvm_args or []), classpath=cp, convertStrings=False)
    return jpype
