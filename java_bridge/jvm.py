"""Starting the JVM (once per process: JPype cannot restart it) with the bridge jar on the class
path, on the JDK that ``jdks`` chooses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .build import bridge_jar
from .jdks import Jdk, choose, required_java

# JDK 24+ warns on stderr when JPype's jar calls System.load (JEP 472) unless native access is
# enabled; the option exists since JDK 17, start_jvm adds it from this version on
NATIVE_ACCESS_FROM = 24
NATIVE_ACCESS = "--enable-native-access=ALL-UNNAMED"


def start_jvm(classpath: list[str | Path] | None = None, jvm_args: list[str] | None = None,
              torch_threads: int | None = 1, *, jdk: Jdk | None = None,
              main: str | None = None) -> Any:
    """Start the JVM with the bridge jar plus ``classpath`` (idempotent: a running JVM is kept, and
    then the extra class path cannot be added). Returns the ``jpype`` module. ImportError if JPype
    is not installed.

    ``jdk`` is the JDK to start (``jdks.choose``); None chooses the newest installed JDK that can
    load the classes on ``classpath`` (``main``, the main class, is read first when given):
    ``jdks.JdkError`` if none can. On JDK 24 and later ``--enable-native-access=ALL-UNNAMED`` is
    added unless ``jvm_args`` set native access, so JPype's native library loads without a warning.

    ``torch_threads`` (default 1; None leaves torch alone) sets torch's intra-op threads. On a small
    CPU the OpenMP workers of torch's default spin against every other busy thread (the JVM's
    included): on a loaded 2-core machine ``generate()`` called from Java ran at 7.6 tokens/s with 2
    threads and 341 with 1; on an idle one the two were equal. One thread is the safe default for
    the small models a CPU serves."""
    import jpype

    if torch_threads is not None:
        import torch

        torch.set_num_threads(torch_threads)
    if not jpype.isJVMStarted():
        cp = [str(bridge_jar()), *(str(p) for p in classpath or [])]
        if jdk is None:
            jdk = choose(required_java(cp[1:], main))
        args = list(jvm_args or [])
        if jdk.feature >= NATIVE_ACCESS_FROM and not any(
                a.startswith("--enable-native-access") for a in args):
            args.append(NATIVE_ACCESS)
        jpype.startJVM(*args, jvmpath=str(jdk.libjvm), classpath=cp, convertStrings=False)
    return jpype
