"""Starting the JVM (once per process: JPype cannot restart it) with the bridge jar on the class path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .build import bridge_jar


def start_jvm(classpath: list[str | Path] | None = None, jvm_args: list[str] | None = None,
              torch_threads: int | None = 1) -> Any:
    """Start the JVM with the bridge jar plus ``classpath`` (idempotent: a running JVM is kept, and then the extra
    class path cannot be added). Returns the ``jpype`` module. ImportError if JPype is not installed.

    ``torch_threads`` (default 1; None leaves torch alone) sets torch's intra-op threads. On a small CPU the OpenMP
    workers of torch's default spin against every other busy thread (the JVM's included): on a loaded 2-core
    machine ``generate()`` called from Java ran at 7.6 tokens/s with 2 threads and 341 with 1; on an idle one the
    two were equal. One thread is the safe default for the small models a CPU serves."""
    import jpype

    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)
    if not jpype.isJVMStarted():
        cp = [str(bridge_jar()), *(str(p) for p in classpath or [])]
        jpype.startJVM(*(jvm_args or []), classpath=cp, convertStrings=False)
    return jpype
