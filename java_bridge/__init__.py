"""The JVM bridge: Smile's Java API (``smile.llm``, ``smile.llm.cache``) backed by ``smile_llm``
through JPype.

Python owns the process (JPype 1.7 cannot start Python from a Java ``main``): ``python -m
java_bridge --classpath app.jar --main com.example.App -- args`` starts the JVM, registers the
Python implementations with ``smile.llm.python.Bridge`` and runs the application's ``main`` on the
Python main thread.

- ``build``: compiles the Java sources under ``java_bridge/java`` into a jar, cached by source hash.
- ``jdks``: finds the installed JDKs and picks the newest one that can load the application.
- ``jvm``: starts the JVM once per process with that jar on the class path.
- ``errors``: one decorator that maps Python errors to Java exceptions at the boundary.
- ``adapters``: the Java interfaces implemented over ``smile_llm`` objects (one module per
  interface).
- ``launch``: the launcher. ``threads``: the pinned-thread-state option for fixed Java worker pools.

Importing this package does not import JPype or start a JVM.
"""

from typing import Any


# ``java_bridge.bridge_jar`` / ``compile_java`` without importing build eagerly
def __getattr__(name: str) -> Any:
    if name in ("bridge_jar", "compile_java"):
        from . import build

        return getattr(build, name)
    raise AttributeError(f"module 'java_bridge' has no attribute {name!r}")
