"""``smile-llm`` command line (also ``python -m smile_llm``).

Contracts shared by the sub-commands:

- Bad input (a ``--model`` that is not a loadable model folder, a value ``generate`` refuses) is one
  line on stderr, ``smile-llm COMMAND: ...`` naming the path or the field and what is wrong, and
  exit code 2; never a traceback.
- Ctrl-C ends a command quietly with exit code 130. In ``chat`` it stops the reply being generated
  (the request is cancelled at its next forward and its KV released) and the chat goes on; Ctrl-C at
  the ``>`` prompt ends it.
- ``--threads N`` (every command but ``bench``, which runs its own scripts) sets torch's intra-op
  threads; the default is ``env.default_threads()``: the cores this process may use (its CPU
  affinity), shared among the ranks of a ``torchrun`` job on the machine. The stats lines print the
  count.
- Under ``torchrun`` (``WORLD_SIZE`` set), ``generate``, ``demo`` and ``chat`` split the model over
  the job's ranks (``--tensor-parallel`` defaults to the world size, divided by
  ``--pipeline-parallel`` stages when given): rank 0 prints, the other ranks follow it silently.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from . import env
from .models.checkpoint.folder import MODEL_FOLDER, load_error, model_folder_problem
from .server.flags import positive_int as _positive_int

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command ended by Ctrl-C


class CommandError(Exception):
    """Bad input to a sub-command: ``main`` prints ``smile-llm COMMAND: <message>`` on stderr and
    returns 2."""


def version() -> str:
    """The installed distribution's version (``importlib.metadata``), or the package's
    ``__version__`` when it runs from a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("smile-llm")
    except PackageNotFoundError:
        from . import __version__

        return __version__


class StopOnInterrupt:
    """A context for one request's generation: while it is entered on the main thread, the first
    SIGINT (Ctrl-C) only sets ``requested``. Pass the object as ``generate(cancel=...)``, which
    polls it before every forward: the request then ends at its next forward with
    ``GenerationCancelled`` and its KV released, and the process carries on. A second SIGINT while
    still inside raises ``KeyboardInterrupt`` as usual (a way out of a stuck forward). Leaving the
    context restores the previous handler. On another thread it installs nothing (Python delivers
    signals to the main thread only) and ``requested`` stays False."""

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        self._installed = False

    def __call__(self) -> bool:
        return self.requested

    def __enter__(self) -> StopOnInterrupt:
        self.requested = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
            self._installed = True
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:  # the second Ctrl-C: give up on a clean stop
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False


class _Printer:
    """Streams generated text to stdout as it comes, and keeps it (``text``)."""

    def __init__(self) -> None:
        self.text = ""

    def on_text(self, chunk: str) -> None:
        self.text += chunk
        sys.stdout.write(chunk)
        sys.stdout.flush()


def _tensor_parallel(args: argparse.Namespace) -> int:
    """``--tensor-parallel``, or under torchrun (``WORLD_SIZE`` set) the job's world size over the
    ``--pipeline-parallel`` stages, else 1."""
    given = getattr(args, "tensor_parallel", None)
    stages = getattr(args, "pipeline_parallel", 1)
    return given if given is not None else max(1, (env.world_size() or 1) // stages)


def _load(args: argparse.Namespace) -> Any:
    """The model of ``args``: ``--model DIR`` if given, else the shipped model of ``--kind``, split
    over ``_tensor_parallel(args)`` ranks. CommandError (one line naming the folder and the problem)
    when the folder is not a model folder or the model does not load."""
    from .language_model import LanguageModel

    tensor_parallel = _tensor_parallel(args)
    stages = getattr(args, "pipeline_parallel", 1)
    if args.model is not None:
        problem = model_folder_problem(args.model)
        if problem is not None:
            raise CommandError(problem)
    try:
        compile = getattr(args, "compile", None)  # None: SMILE_COMPILE, else eager
        if args.model is None:
            return LanguageModel.default(kind=args.kind, tensor_parallel=tensor_parallel,
                                         pipeline_parallel=stages, compile=compile)
        return LanguageModel.from_pretrained(args.model, tensor_parallel=tensor_parallel,
                                             pipeline_parallel=stages, compile=compile)
    except Exception as exc:  # whatever the checkpoint's files provoke: one line, no traceback
        raise CommandError(load_error(args.model, exc, args.kind)) from None


def _with_model(args: argparse.Namespace, body: Callable[[Any], int]) -> int:
    """Load the model of ``args`` and return ``body(model)``; a rank > 0 of a tensor-parallel model
    follows rank 0 instead (printing nothing) and returns 0. The model is closed (and its process
    group left) however ``body`` ends."""
    lm = _load(args)
    try:
        if lm.is_follower:
            lm.follow()
            return 0
        return body(lm)
    finally:
        lm.close()  # a tensor-parallel model also leaves the process group it joined


def _threads() -> int:
    """torch's intra-op threads now (what ``--threads`` set)."""
    import torch

    return int(torch.get_num_threads())


def _plural(n: int, word: str) -> str:
    """``"1 thread"``, ``"2 threads"``."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _print_stats(completion: Any) -> None:
    """The stats lines after a completion: tokens, speed, torch threads and finish reason, then the
    speculative rounds when there were any."""
    s = completion.stats
    print(f"\n[{s['prompt_tokens']} prompt tokens, {s['cached_tokens']} cached, "
          f"{s['generated_tokens']} generated, {s['tokens_per_s']:.1f} tokens/s, "
          f"{_plural(_threads(), 'thread')}, finish: {completion.finish_reason}]")
    if s["speculative_rounds"]:
        print(f"[speculative: {s['speculative_rounds']} rounds, "
              f"{s['accepted_drafts']}/{s['proposed_drafts']} drafts accepted, "
              f"{s['mean_accepted_length']:.2f} tokens per round, "
              f"{s['target_forwards_per_token']:.2f} target forwards per token]")


def _generate_stoppable(lm: Any, prompt: Any, max_new_tokens: int, printer: _Printer, *,
                        chat: bool = False, **kwargs: Any) -> Any:
    """``lm.generate`` (``lm.chat`` with ``chat``) streaming to ``printer``; Ctrl-C stops it at the
    next forward (``StopOnInterrupt``). Returns the Completion, or None when Ctrl-C stopped it (the
    request is cancelled and its KV released by then). CommandError for input ``generate`` refuses
    (ValueError)."""
    from .errors import GenerationCancelled

    call = lm.chat if chat else lm.generate
    with StopOnInterrupt() as stop:
        try:
            return call(prompt, max_new_tokens, listener=printer, cancel=stop, **kwargs)
        except GenerationCancelled:
            if stop.requested:
                return None
            raise
        except ValueError as exc:
            raise CommandError(str(exc)) from None


def _unescape(text: str) -> str:
    """``\\n`` and ``\\t`` escapes expanded (the shell passes them literally)."""
    return text.replace("\\n", "\n").replace("\\t", "\t")


def cmd_generate(args: argparse.Namespace) -> int:
    """``smile-llm generate``: stream a completion of ``--prompt`` (``\\n`` and ``\\t`` escapes
    expanded) to stdout and print its finish reason and stats. Returns 0, or 130 when Ctrl-C stopped
    it; CommandError for bad input."""
    prompt = _unescape(args.prompt)

    def run(lm: Any) -> int:
        printer = _Printer()
        completion = _generate_stoppable(lm, prompt, args.max_new_tokens, printer,
                                         temperature=args.temperature, top_p=args.top_p,
                                         seed=args.seed, speculative_tokens=args.speculative_tokens)
        if completion is None:
            print(flush=True)
            return EXIT_INTERRUPTED
        _print_stats(completion)
        return 0

    return _with_model(args, run)


def cmd_demo(args: argparse.Namespace) -> int:
    """generate() on the embedded model twice with a shared prefix: the second call reuses the
    cached KV (and, on the hybrid model, the DeltaNet state snapshot at the shared prefix).
    Returns 0, or 130 when Ctrl-C stopped it."""

    def run(lm: Any) -> int:
        print(f"model: {lm.config.model_type}, {lm.config.num_hidden_layers} layers, hidden "
              f"{lm.config.hidden_size}, vocab {lm.config.vocab_size}; KV pool {lm.pool.num_slots} "
              f"slots, page {lm.pool.page_size}\n")
        prompt = "import os\nimport sys\n\n\ndef main(argv):\n    "
        for turn, text in enumerate((prompt, prompt + "\"\"\"Run the command line.\"\"\"\n    ")):
            print(f"--- call {turn + 1}: {len(text)}-byte prompt ---")
            sys.stdout.write(text)
            completion = _generate_stoppable(lm, text, args.max_new_tokens, _Printer(),
                                             temperature=args.temperature, top_p=0.9,
                                             seed=args.seed)
            if completion is None:
                print(flush=True)
                return EXIT_INTERRUPTED
            _print_stats(completion)
            lm.pool.check_invariants()
        stats = lm.pool.stats()
        snapshots = (f", {stats['state_snapshots']} DeltaNet state snapshots held"
                     if "state_snapshots" in stats
                     else "")
        print(f"\nprefix cache: {stats['prefix_match_tokens']} of {stats['prefix_prompt_tokens']} "
              f"prompt tokens reused, {stats['cached_tokens']} tokens cached{snapshots}; "
              "invariants hold")
        return 0

    return _with_model(args, run)


def cmd_chat(args: argparse.Namespace) -> int:
    """``smile-llm chat``: an interactive chat on a checkpoint with a chat template. Each line read
    from stdin is a user turn; the assistant's reply streams to stdout; the conversation (and its
    KV, through the prefix cache) carries over from turn to turn. Ctrl-C during a reply stops it
    (what was shown stays the assistant's turn) and the chat goes on. An empty line or end of input
    ends it (0); Ctrl-C at the prompt too (130). CommandError for a model without a chat
    template."""

    def run(lm: Any) -> int:
        messages: list[dict[str, str]] = ([{"role": "system", "content": args.system}]
                                          if args.system else [])
        try:
            lm.encode_chat(messages + [{"role": "user", "content": "hi"}])
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        kwargs = {"enable_thinking": False} if args.no_thinking else {}
        while True:
            print("> ", end="", flush=True)
            line = sys.stdin.readline()
            if not line:  # end of input (a pipe): end the prompt's line
                print(flush=True)
                return 0
            if not line.strip():
                return 0
            messages.append({"role": "user", "content": line.rstrip("\n")})
            printer = _Printer()
            try:
                completion = _generate_stoppable(lm, messages, args.max_new_tokens, printer,
                                                 chat=True, temperature=args.temperature,
                                                 seed=args.seed, chat_template_kwargs=kwargs)
            except CommandError as exc:
                print(f"smile-llm chat: {exc}", file=sys.stderr)
                messages.pop()
                continue
            if completion is None:
                print("\n[reply stopped]", flush=True)
                if printer.text:
                    messages.append({"role": "assistant", "content": printer.text})
                else:
                    messages.pop()
                continue
            messages.append({"role": "assistant", "content": completion.text})
            print(f"\n[{completion.stats['cached_tokens']} of {completion.stats['prompt_tokens']} "
                  f"prompt tokens cached]")

    return _with_model(args, run)


def cmd_cache_demo(args: argparse.Namespace) -> int:
    """``smile-llm cache-demo``: run ``demo.run_demo`` (a multi-turn chat through the KV pool
    alone). Returns 0."""
    from .demo import run_demo

    run_demo(turns=args.turns, seed=args.seed)
    return 0


def cmd_kv_diff(args: argparse.Namespace) -> int:
    """``smile-llm kv-diff``: run ``--prompt`` warm (``--prefix``, default the prompt, cached by a
    request before it) and cold, compare their KV fingerprints (``serving.kv_diff``) and print
    where they first differ or that they agree. Returns 0 when they agree, 1 when they differ;
    CommandError for bad input (a prefix the warm request does not reuse included)."""
    from .serving.kv_diff import kv_diff

    def run(lm: Any) -> int:
        try:
            prefix = None if args.prefix is None else _unescape(args.prefix)
            report = kv_diff(lm, _unescape(args.prompt), prefix,
                             slack=args.slack)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        print(report.describe())
        return 0 if report.agree else 1

    return _with_model(args, run)


def cmd_spec_lab(args: argparse.Namespace) -> int:
    """``smile-llm spec-lab``: compare drafters and draft counts on a workload against plain
    decoding (``smile_llm.lab``). Returns 0, 1 when a configuration is not lossless, 2 for bad input
    (the lab compares several models in one process, so a torchrun job of more than one rank is bad
    input)."""
    from .lab.command import run_command

    if (env.world_size() or 1) > 1:
        raise CommandError("the lab compares several models in one process: run it without "
                           "torchrun")
    return run_command(args, args.argv)


def cmd_bench(args: list[str]) -> int:
    """``python -m benchmarks ARGS`` in the source checkout this package was installed from (the
    benchmarks are scripts beside the package, not part of it); exit code 2 with a hint when there
    is none."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__main__.py").is_file():
        print(f"smile-llm bench: no benchmarks/ beside the package in {root}; the benchmarks ship "
              f"with the source checkout (pip install -e . from it)", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "benchmarks", *args], cwd=root)


def add_threads_option(parser: argparse.ArgumentParser, default: int | None = None) -> None:
    """``--threads N``, the same option on every command: torch's intra-op threads (``default``, or
    ``env.default_threads()`` when None)."""
    n = env.default_threads() if default is None else default
    parser.add_argument("--threads", type=_positive_int, default=n, metavar="N",
                        help=f"torch intra-op threads (default {n}: the cores this process may "
                             f"use, or OMP_NUM_THREADS when set)")


def _model_options(parser: argparse.ArgumentParser, model_help: str,
                   tensor_parallel: bool = True, pipeline_parallel: bool = False) -> None:
    """``--model``, ``--kind``, ``--tensor-parallel`` (when the command can split its model),
    ``--pipeline-parallel`` (when it can split it in stages) and ``--threads``."""
    parser.add_argument("--model", metavar="DIR", help=model_help)
    parser.add_argument("--kind", choices=("dense", "hybrid"), default="dense",
                        help="which shipped model, without --model")
    if tensor_parallel:
        parser.add_argument("--tensor-parallel", type=_positive_int, default=None, metavar="N",
                            help="split the model over N ranks, one process each (default: "
                                 "torchrun's world size under torchrun, else 1)")
    if pipeline_parallel:
        parser.add_argument("--pipeline-parallel", type=_positive_int, default=1, metavar="N",
                            help="split the model's layers into N stages of --tensor-parallel "
                                 "ranks each (docs/pipeline_parallel.md; default 1)")
    add_threads_option(parser)


def _serve_options(p: argparse.ArgumentParser) -> None:
    """The flags of ``smile-llm serve`` beyond the model's: the server's (``server.flags``), the
    model's serving options and the replicas'."""
    from .server.flags import add_server_flags

    add_server_flags(p)
    p.add_argument("--drafter", default="mtp", help='"mtp", "ngram", "draft:DIR" or "none"')
    p.add_argument("--kv-dtype", default=None, help="the KV cache's dtype (e.g. fp8_e4m3)")
    p.add_argument("--max-batch-size", type=_positive_int, default=8)
    p.add_argument("--max-seq-len", type=_positive_int, default=None)
    p.add_argument("--speculative-max-batch", type=_positive_int, default=None,
                   help="steps with more rows decode plainly (default: speculate at any batch)")
    p.add_argument("--no-compile", dest="compile", action="store_const", const=False,
                   default=None, help="run the model eagerly (default: compiled with torch.compile "
                   "and warmed up before serving, hybrid models eager; SMILE_COMPILE=0/1 sets "
                   "it; docs/compile.md)")
    p.add_argument("--replicas", type=_positive_int, default=None,
                   help="serve N copies of the model on a local Ray instance (needs the ray extra; "
                        "docs/scale_out.md)")
    p.add_argument("--router", default="cache", choices=["cache", "pow2", "prefix"],
                   help="with --replicas: route by cached prefix (cache), Ray Serve's default "
                        "(pow2) or its PrefixCacheAffinityRouter (prefix)")
    p.add_argument("--replica-cpus", type=float, default=1.0,
                   help="with --replicas: CPUs per replica (per tensor-parallel rank)")
    p.add_argument("--replica-gpus", type=float, default=0.0,
                   help="with --replicas: GPUs per replica (per tensor-parallel rank)")
    p.add_argument("--ray-metrics-port", type=_positive_int, default=None,
                   help="with --replicas: where Ray exports every replica's metrics (/metrics)")


def cmd_serve(args: argparse.Namespace) -> int:
    """``smile-llm serve``: the model's OpenAI-compatible API until SIGTERM or Ctrl-C (rank > 0
    of a tensor-parallel model follows rank 0). Returns 0 after a clean drain."""
    from . import env
    from .server import serve
    from .server.flags import settings_from
    from .server.model_options import ModelOptions

    try:
        settings = settings_from(args, env.api_key())
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    if args.model is not None:
        problem = model_folder_problem(args.model)
        if problem is not None:
            raise CommandError(problem)
    options = ModelOptions(args.model, args.kind, None if args.drafter == "none" else args.drafter,
                           args.kv_dtype, args.max_batch_size, args.max_seq_len,
                           args.speculative_max_batch, _tensor_parallel(args),
                           compile=args.compile)
    args.compile = options.compiles  # every rank alike
    if args.replicas is not None:
        return _serve_replicas(args, options, settings)
    if env.distributed_launch() and env.local_rank() > 0:
        return _with_model(args, lambda lm: 0)
    try:
        return serve(options.load, settings, args.host, args.port, args.log_level)
    except OSError as exc:  # the address: taken, or not this machine's
        raise CommandError(f"cannot listen on {args.host}:{args.port}: "
                           f"{exc.strerror or exc}") from None


def _serve_replicas(args: argparse.Namespace, options: Any, settings: Any) -> int:
    """``serve --replicas N``: the Ray Serve application on a local Ray instance."""
    from dataclasses import replace

    from .server.replicas.ray_app import application, serve_replicas

    try:
        # (threads: one per CPU a replica asks for, set by application)
        app = application(replace(options, tensor_parallel=args.tensor_parallel or 1),
                          settings, args.replicas, args.router, args.replica_cpus,
                          args.replica_gpus)
    except (ImportError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    return serve_replicas(app, args.host, args.port, metrics_port=args.ray_metrics_port)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every sub-command but ``serve-jvm`` and ``bench`` (they parse their own
    arguments)."""
    parser = argparse.ArgumentParser(prog="smile-llm", description="smile-llm: LLM serving core")
    parser.add_argument("--version", action="version", version=f"smile-llm {version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text (the embedded default model unless "
                                          "--model)")
    gen.add_argument("--prompt", required=True, help="prompt text (\\n escapes allowed)")
    _model_options(gen, MODEL_FOLDER, pipeline_parallel=True)
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--speculative-tokens", type=int, default=None,
                     help="MTP drafts per round (default: the model's; 0: plain decoding)")
    gen.set_defaults(run=cmd_generate)
    demo = sub.add_parser("demo", help="generate() twice on the default model, the second reusing "
                                       "the prefix")
    _model_options(demo, MODEL_FOLDER, pipeline_parallel=True)
    demo.add_argument("--max-new-tokens", type=int, default=120)
    demo.add_argument("--temperature", type=float, default=0.7,
                      help="0 for greedy (a tiny model loops greedily)")
    demo.add_argument("--seed", type=int, default=2)
    demo.set_defaults(run=cmd_demo)
    chat = sub.add_parser("chat", help="an interactive chat on a checkpoint's chat template (stdin "
                                       "lines are turns; Ctrl-C stops a reply)")
    _model_options(chat, "a Hugging Face model folder with a chat template", pipeline_parallel=True)
    chat.add_argument("--system", default="", help="a system message")
    chat.add_argument("--max-new-tokens", type=int, default=256)
    chat.add_argument("--temperature", type=float, default=0.7)
    chat.add_argument("--seed", type=int, default=0)
    chat.add_argument("--no-thinking", action="store_true",
                      help="render with enable_thinking=False")
    chat.set_defaults(run=cmd_chat)
    cache = sub.add_parser("cache-demo",
                           help="a multi-turn chat through the KV pool alone, showing prefix reuse")
    cache.add_argument("--turns", type=int, default=6)
    cache.add_argument("--seed", type=int, default=7)
    add_threads_option(cache)
    cache.set_defaults(run=cmd_cache_demo)
    kv = sub.add_parser("kv-diff", help="compare a prompt's KV with its prefix reused from the "
                                        "cache and computed cold (docs/kv_fingerprints.md)")
    kv.add_argument("--prompt", required=True, help="prompt text (\\n escapes allowed)")
    kv.add_argument("--prefix", help="text cached by a first request (default: the prompt)")
    kv.add_argument("--slack", type=float, default=1.0, help="scale the tolerance (default 1)")
    _model_options(kv, MODEL_FOLDER, tensor_parallel=False)
    kv.set_defaults(run=cmd_kv_diff)
    lab = sub.add_parser("spec-lab", help="compare speculative drafters and draft counts on a "
                                          "workload against plain decoding: table, plots, lossless "
                                          "checks (docs/speculative.md)")
    _model_options(lab, "a checkpoint folder (default: the shipped model of --kind)",
                   tensor_parallel=False)
    lab.add_argument("--drafters", default="mtp,ngram",
                     help="comma list of drafter= values (mtp, mtp-per-round, ngram, draft:PATH, a "
                          "registered name, package.module:callable); default mtp,ngram")
    lab.add_argument("--k", default="1-4",
                     help="draft counts: a range or list, e.g. 1-6 or 1,3,5 (default 1-4)")
    lab.add_argument("--trees", action="append", metavar="SHAPE",
                     help="token-tree shapes, branching factors per depth (3,2,1); ';' between "
                          "shapes; repeatable")
    lab.add_argument("--policy", help="an adaptive speculative_tokens value, e.g. auto")
    lab.add_argument("--workload", default="code",
                     help="a JSONL file of prompts, or a shipped one: code, prose")
    lab.add_argument("--new", type=int, default=128,
                     help="new tokens per prompt unless the workload says otherwise")
    lab.add_argument("--repeats", type=int, default=3,
                     help="timed runs per prompt and configuration (medians)")
    lab.add_argument("--temperature", type=float, default=0.0,
                     help="0: greedy, outputs checked token for token; > 0: a distribution test")
    lab.add_argument("--samples", type=int, default=200,
                     help="draws per prompt for the distribution test")
    lab.add_argument("--sample-prompts", type=int, default=3,
                     help="prompts in the distribution test")
    lab.add_argument("--sample-tokens", type=int, default=3,
                     help="tokens per draw in the distribution test")
    lab.add_argument("--seed", type=int, default=1234, help="base seed of sampled runs")
    lab.add_argument("--prefix-reuse", action="store_true",
                     help="keep prefix caching on (default off: every run prefills its whole "
                          "prompt)")
    lab.add_argument("--out", default="spec_lab_results",
                     help="the results folder (default spec_lab_results)")
    lab.set_defaults(run=cmd_spec_lab)
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (the embedded default "
                                         "model unless --model; docs/server.md)")
    _model_options(serve, MODEL_FOLDER)
    _serve_options(serve)
    serve.set_defaults(run=cmd_serve)
    sub.add_parser("bench", help="run the benchmark scripts of a source checkout: bench "
                                 "[all|quick|NAME ...] [--skip NAME ...] (see python -m benchmarks "
                                 "-h)")
    sub.add_parser("serve-jvm",
                   help="run a JVM application on the Python bridge: serve-jvm --classpath app.jar "
                        "--main com.example.App [--model DIR] [--threads N] -- args (see python -m "
                        "java_bridge -h)")
    return parser


def _run(argv: list[str]) -> int:
    """Parse ``argv`` and run its sub-command with torch at ``--threads`` (restored afterwards, for
    in-process callers). CommandError for bad input."""
    if argv[:1] == ["serve-jvm"]:  # the JVM launcher parses its own arguments (java_bridge.launch)
        from java_bridge.launch import run

        return run(argv[1:], prog="smile-llm serve-jvm")
    # the benchmark runner parses its own arguments (benchmarks/__main__.py)
    if argv[:1] == ["bench"]:
        return cmd_bench(argv[1:])
    args = build_parser().parse_args(argv)
    args.argv = list(argv)  # spec-lab records its command line
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return int(args.run(args))
    finally:
        torch.set_num_threads(before)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``smile-llm`` (and ``python -m smile_llm``): parse ``argv`` (default
    ``sys.argv[1:]``) and run the sub-command; ``serve-jvm`` hands its arguments to
    ``java_bridge.launch.run``. Returns the exit code: the command's, 2 with one line on stderr for
    bad input, 130 after Ctrl-C (quietly); argparse exits with 2 on bad arguments."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _run(argv)
    except CommandError as exc:
        command = " ".join(["smile-llm", *argv[:1]])
        print(f"{command}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
