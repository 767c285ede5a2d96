"""The launcher:
``python -m java_bridge --classpath app.jar --main com.example.App [--model DIR] -- args...``

1. Checks the class path entries exist (exit 2 otherwise) and chooses the JDK (``jdks``): the one
   of ``--java-home``, else the newest installed JDK that can load the application's classes (exit
   2 with one line if there is none, or ``--java-home``'s is not a JDK or too old).
2. Loads the model (``--model``, or the embedded default; ``--no-model`` skips it) before the JVM
   starts, so torch initialises first, then starts that JDK's JVM once with the bridge jar and the
   application's class path.
3. Registers the Python implementations with ``smile.llm.python.Bridge``: the model as "model", a
   factory of pools, and "pinCurrentThread".
4. Registers cleanup (closing the model and every pool the application made) as a Java shutdown hook
   from Python, which also runs when the application calls ``System.exit``, unlike Python's
   ``atexit``.
5. Runs ``main(String[])`` on the Python main thread (calls from that thread into Python cost
   about 1 us).

Exit codes: 0 when ``main`` returns, 1 when it throws (the Java stack trace goes to stderr), 2 for
launcher errors (bad class path, no JDK that can load the application, a model that cannot be
loaded, no such class or no ``main``), or whatever the application passes to ``System.exit``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

# torch threads under the JVM: on a loaded 2-core machine generate() called from Java ran at 7.6
# tokens/s with 2 threads and 341 with 1 (jvm.start_jvm), so the launcher keeps 1 unless told
# otherwise
DEFAULT_THREADS = 1
JPYPE_HINT = ("JPype is not installed: pip install JPype1 (or the package's java extra: "
              "pip install -e '.[java]' in the smile-llm checkout)")


def parse(argv: list[str], prog: str = "python -m java_bridge") -> argparse.Namespace:
    """The launcher's options from ``argv`` (argparse: exits with 2 on bad arguments); ``prog`` is
    the command name that usage and errors show."""
    p = argparse.ArgumentParser(prog=prog, description="Run a JVM application's main with "
                                "smile_llm's Java API "
                                f"registered: {prog} --classpath app.jar --main com.example.App "
                                "[--model DIR] -- args")
    p.add_argument("--classpath", "--cp", default="",
                   help=f"the application's class path ({os.pathsep}-separated)")
    p.add_argument("--main", required=True, help="the class whose main(String[]) to run")
    p.add_argument("--model", help="a model folder for Bridge.languageModel() (default: the "
                                   "embedded model)")
    p.add_argument("--no-model", action="store_true",
                   help="register no model (pool-only applications)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--drafter", choices=("mtp", "ngram", "none"), default="mtp",
                   help="speculative decoding: the MTP head (when the model has one), n-gram "
                        "lookup, or none")
    p.add_argument("--speculative-max-batch", type=int, default=None, metavar="N",
                   help="decode plainly in steps of more than N requests (speculation costs "
                        "throughput at large batches on small CPUs; default: no limit)")
    p.add_argument("--tensor-parallel", type=int, default=None, metavar="N",
                   help="split the model over N ranks (run under torchrun --nproc-per-node N): "
                        "rank 0 runs the JVM, the other ranks follow it (default: torchrun's world "
                        "size under torchrun, else 1)")
    p.add_argument("--java-home", metavar="DIR",
                   help="the JDK to run (default: the newest installed JDK that can load the "
                        "application's classes, among JAVA_HOME, java on PATH and /usr/lib/jvm/*)")
    p.add_argument("--jvm-arg", action="append", default=[],
                   help="a JVM option, e.g. -Xmx4g (repeatable)")
    p.add_argument("--threads", "--torch-threads", dest="threads", type=int,
                   default=DEFAULT_THREADS, metavar="N",
                   help="torch intra-op threads, as every smile-llm command's --threads (default "
                        f"{DEFAULT_THREADS}: more contend with the JVM's own threads on small "
                        f"CPUs; --torch-threads is an old spelling)")
    p.add_argument("args", nargs="*", help="arguments for main (after --)")
    return p.parse_args(argv)


def run(argv: list[str], prog: str = "python -m java_bridge") -> int:
    """Run the launcher (see the module docstring) and return its exit code: 0 when ``main``
    returns, 1 when it throws, 2 for a missing class path entry, no usable JDK, a missing class or
    ``main``. ``prog`` names the command in usage and errors."""
    args = parse(argv, prog)
    entries = [e for e in args.classpath.split(os.pathsep) if e]
    missing = [e for e in entries if not Path(e).exists()]
    if missing:
        print(f"java_bridge: class path entries not found: {missing}", file=sys.stderr)
        return 2
    # before the model loads: a missing JPype is a one-line hint, not a traceback after a long load
    try:
        import jpype  # noqa: F401
    except ImportError:
        print(f"java_bridge: {JPYPE_HINT}", file=sys.stderr)
        return 2
    from .jdks import JdkError, choose, required_java

    try:  # before the model loads, as above
        jdk = choose(required_java(entries, args.main), args.java_home)
    except JdkError as exc:
        print(f"java_bridge: {exc}", file=sys.stderr)
        return 2
    model: Any = None
    if not args.no_model:
        from smile_llm import LanguageModel, env
        from smile_llm.models.checkpoint.folder import load_error, model_folder_problem

        problem = None if args.model is None else model_folder_problem(args.model)
        if problem is not None:
            print(f"java_bridge: {problem}", file=sys.stderr)
            return 2
        tensor_parallel = (args.tensor_parallel if args.tensor_parallel is not None
                           else (env.world_size() or 1))
        options = {"device": args.device, "drafter": args.drafter,
                   "speculative_max_batch": args.speculative_max_batch,
                   "tensor_parallel": tensor_parallel}
        try:
            model = LanguageModel.default(**options) if args.model is None else \
                LanguageModel.from_pretrained(args.model, **options)
        except Exception as exc:  # a bad option or model folder: say so, no traceback
            print(f"java_bridge: {load_error(args.model, exc)}", file=sys.stderr)
            return 2
        # a rank > 0: no JVM here, it replays rank 0's plan until rank 0's model closes
        if model.is_follower:
            model.follow()  # closes this rank's pools and leaves the process group however it ends
            return 0

    from .jvm import start_jvm

    jpype = start_jvm(entries, args.jvm_arg, args.threads, jdk=jdk)
    from .adapters import FactoryAdapter, LanguageModelAdapter, PinThread
    from .errors import bridged

    bridge = jpype.JClass("smile.llm.python.Bridge")
    factory = FactoryAdapter()
    bridge.registerFactory(factory)
    bridge.register("pinCurrentThread", PinThread())
    if model is not None:
        bridge.register("model", LanguageModelAdapter(model))

    @jpype.JImplements("java.lang.Runnable")
    @bridged
    class Cleanup:
        # on JPype's shutdown thread: an error there is a mapped Java exception
        def run(self) -> None:
            try:
                factory._close_all()
            finally:
                if model is not None:
                    model.close()

    jpype.java.lang.Runtime.getRuntime().addShutdownHook(jpype.java.lang.Thread(Cleanup()))
    try:
        main_class = jpype.JClass(args.main)
    except (TypeError, AttributeError, ImportError, jpype.JException) as exc:
        print(f"java_bridge: class {args.main} not found on the class path {entries}: {exc}",
              file=sys.stderr)
        return 2
    if not hasattr(main_class, "main"):
        print(f"java_bridge: {args.main} has no main(String[]) method", file=sys.stderr)
        return 2
    try:
        main_class.main(jpype.JArray(jpype.JString)(args.args))
    except jpype.JException as exc:
        print(exc.stacktrace(), file=sys.stderr)
        return 1
    return 0


def main() -> None:
    """``python -m java_bridge``: ``run(sys.argv[1:])`` and exit with its code."""
    sys.exit(run(sys.argv[1:]))
