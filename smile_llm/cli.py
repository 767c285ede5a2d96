"""``smile-llm`` command line (also ``python -m smile_llm``)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any


class _Printer:
    """Streams generated text to stdout as it comes."""

    def on_text(self, chunk: str) -> None:
        sys.stdout.write(chunk)
        sys.stdout.flush()


def _load(model: str | None, kind: str = "dense", tensor_parallel: int = 1) -> Any:
    """``--model DIR`` if given, else the shipped model of ``--kind`` (dense or hybrid), split over
    ``tensor_parallel`` ranks (under torchrun)."""
    from .model import LanguageModel

    if model is None:
        return LanguageModel.default(kind=kind, tensor_parallel=tensor_parallel)
    return LanguageModel.from_pretrained(model, tensor_parallel=tensor_parallel)


def _print_stats(completion: Any) -> None:
    s = completion.stats
    print(f"\n[{s['prompt_tokens']} prompt tokens, {s['cached_tokens']} cached, {s['generated_tokens']} generated, "
          f"{s['tokens_per_s']:.1f} tokens/s, finish: {completion.finish_reason}]")
    if s["speculative_rounds"]:
        print(f"[speculative: {s['speculative_rounds']} rounds, {s['accepted_drafts']}/{s['proposed_drafts']} drafts "
              f"accepted, {s['mean_accepted_length']:.2f} tokens per round, "
              f"{s['target_forwards_per_token']:.2f} target forwards per token]")


def cmd_generate(args: argparse.Namespace) -> int:
    """``smile-llm generate``: stream a completion of ``--prompt`` (``\\n`` and ``\\t`` escapes expanded) to stdout and
    print its finish reason and stats. Returns the exit code: 0, or 2 with the message on stderr for bad input."""
    try:
        lm = _load(args.model, args.kind, args.tensor_parallel)
    except ValueError as exc:
        print(f"smile-llm generate: {exc}", file=sys.stderr)
        return 2
    if lm.is_follower:  # a rank > 0 under torchrun: replay rank 0's plan, print nothing
        lm.follow()
        return 0
    prompt = args.prompt.replace("\\n", "\n").replace("\\t", "\t")  # the shell passes \n literally
    try:
        completion = lm.generate(prompt, args.max_new_tokens, temperature=args.temperature, top_p=args.top_p,
                                 seed=args.seed, listener=_Printer(), speculative_tokens=args.speculative_tokens)
    except ValueError as exc:
        print(f"smile-llm generate: {exc}", file=sys.stderr)
        return 2
    finally:
        if lm.tp.size > 1:
            lm.close()  # the other ranks stop following
    _print_stats(completion)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """generate() on the embedded model twice with a shared prefix: the second call reuses the cached KV (and, on the
    hybrid model, the DeltaNet state snapshot at the shared prefix)."""
    lm = _load(args.model, args.kind)
    print(f"model: {lm.config.model_type}, {lm.config.num_hidden_layers} layers, hidden {lm.config.hidden_size}, "
          f"vocab {lm.config.vocab_size}; KV pool {lm.pool.num_slots} slots, page {lm.pool.page_size}\n")
    prompt = "import os\nimport sys\n\n\ndef main(argv):\n    "
    for turn, text in enumerate((prompt, prompt + "\"\"\"Run the command line.\"\"\"\n    ")):
        print(f"--- call {turn + 1}: {len(text)}-byte prompt ---")
        sys.stdout.write(text)
        completion = lm.generate(text, args.max_new_tokens, temperature=args.temperature, top_p=0.9, seed=args.seed,
                                 listener=_Printer())
        _print_stats(completion)
        lm.pool.check_invariants()
    stats = lm.pool.stats()
    snapshots = (f", {stats['state_snapshots']} DeltaNet state snapshots held" if "state_snapshots" in stats else "")
    print(f"\nprefix cache: {stats['prefix_match_tokens']} of {stats['prefix_prompt_tokens']} prompt tokens reused, "
          f"{stats['cached_tokens']} tokens cached{snapshots}; invariants hold")
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    """``smile-llm chat``: an interactive chat on a checkpoint with a chat template. Each line read from stdin is a
    user turn; the assistant's reply streams to stdout; the conversation (and its KV, through the prefix cache)
    carries over from turn to turn. An empty line or end of input ends it. Returns 0, or 2 (message on stderr) for a
    model without a chat template."""
    lm = _load(args.model, args.kind)
    messages: list[dict[str, str]] = [{"role": "system", "content": args.system}] if args.system else []
    try:
        lm.encode_chat(messages + [{"role": "user", "content": "hi"}])
    except ValueError as exc:
        print(f"smile-llm chat: {exc}", file=sys.stderr)
        return 2
    kwargs = {"enable_thinking": False} if args.no_thinking else {}
    while True:
        print("> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line.rstrip("\n")})
        try:
            completion = lm.chat(messages, args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                                 listener=_Printer(), chat_template_kwargs=kwargs)
        except ValueError as exc:
            print(f"smile-llm chat: {exc}", file=sys.stderr)
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": completion.text})
        print(f"\n[{completion.stats['cached_tokens']} of {completion.stats['prompt_tokens']} prompt tokens cached]")


def cmd_cache_demo(args: argparse.Namespace) -> int:
    """``smile-llm cache-demo``: run ``demo.run_demo`` (a multi-turn chat through the KV pool alone). Returns 0."""
    from .demo import run_demo

    run_demo(turns=args.turns, seed=args.seed)
    return 0


def cmd_spec_lab(args: argparse.Namespace) -> int:
    """``smile-llm spec-lab``: compare drafters and draft counts on a workload against plain decoding
    (``smile_llm.lab``). Returns 0, 1 when a configuration is not lossless, 2 for bad input."""
    from .lab.command import run_command

    return run_command(args, args.argv)


def cmd_bench(args: list[str]) -> int:
    """``python -m benchmarks ARGS`` in the source checkout this package was installed from (the benchmarks are
    scripts beside the package, not part of it); exit code 2 with a hint when there is none."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__main__.py").is_file():
        print(f"smile-llm bench: no benchmarks/ beside the package in {root}; the benchmarks ship with the source "
              f"checkout (pip install -e . from it)", file=sys.stderr)
        return 2
    return subprocess.call([sys.executable, "-m", "benchmarks", *args], cwd=root)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``smile-llm`` (and ``python -m smile_llm``): parse ``argv`` (default ``sys.argv[1:]``) and run the
    sub-command; ``serve-jvm`` hands its arguments to ``java_bridge.launch.run``. Returns the exit code; argparse exits
    with 2 on bad arguments."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve-jvm"]:  # the JVM launcher parses its own arguments (java_bridge.launch)
        from java_bridge.launch import run

        return run(argv[1:], prog="smile-llm serve-jvm")
    if argv[:1] == ["bench"]:  # the benchmark runner parses its own arguments (benchmarks/__main__.py)
        return cmd_bench(argv[1:])
    parser = argparse.ArgumentParser(prog="smile-llm", description="smile-llm: LLM serving core")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate text (the embedded default model unless --model)")
    gen.add_argument("--prompt", required=True, help="prompt text (\\n escapes allowed)")
    gen.add_argument("--model", help="a Hugging Face model folder (config.json, *.safetensors, tokenizer)")
    gen.add_argument("--kind", choices=("dense", "hybrid"), default="dense", help="which shipped model, without --model")
    gen.add_argument("--tensor-parallel", type=int, default=1, metavar="N",
                     help="split the model over N ranks: run under torchrun --nproc-per-node N")
    gen.add_argument("--max-new-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--speculative-tokens", type=int, default=None,
                     help="MTP drafts per round (default: the model's; 0: plain decoding)")
    gen.set_defaults(run=cmd_generate)
    demo = sub.add_parser("demo", help="generate() twice on the default model, the second reusing the prefix")
    demo.add_argument("--model")
    demo.add_argument("--kind", choices=("dense", "hybrid"), default="dense", help="which shipped model, without --model")
    demo.add_argument("--max-new-tokens", type=int, default=120)
    demo.add_argument("--temperature", type=float, default=0.7, help="0 for greedy (a tiny model loops greedily)")
    demo.add_argument("--seed", type=int, default=2)
    demo.set_defaults(run=cmd_demo)
    chat = sub.add_parser("chat", help="an interactive chat on a checkpoint's chat template (stdin lines are turns)")
    chat.add_argument("--model", help="a Hugging Face model folder with a chat template")
    chat.add_argument("--kind", choices=("dense", "hybrid"), default="dense", help="which shipped model, without --model")
    chat.add_argument("--system", default="", help="a system message")
    chat.add_argument("--max-new-tokens", type=int, default=256)
    chat.add_argument("--temperature", type=float, default=0.7)
    chat.add_argument("--seed", type=int, default=0)
    chat.add_argument("--no-thinking", action="store_true", help="render with enable_thinking=False")
    chat.set_defaults(run=cmd_chat)
    cache = sub.add_parser("cache-demo", help="a multi-turn chat through the KV pool alone, showing prefix reuse")
    cache.add_argument("--turns", type=int, default=6)
    cache.add_argument("--seed", type=int, default=7)
    cache.set_defaults(run=cmd_cache_demo)
    lab = sub.add_parser("spec-lab", help="compare speculative drafters and draft counts on a workload against "
                                          "plain decoding: table, plots, lossless checks (docs/speculative.md)")
    lab.add_argument("--model", help="a checkpoint folder (default: the shipped model of --kind)")
    lab.add_argument("--kind", choices=("dense", "hybrid"), default="dense",
                     help="which shipped model, without --model")
    lab.add_argument("--drafters", default="mtp,ngram",
                     help="comma list of drafter= values (mtp, mtp-per-round, ngram, draft:PATH, a registered "
                          "name, package.module:callable); default mtp,ngram")
    lab.add_argument("--k", default="1-4", help="draft counts: a range or list, e.g. 1-6 or 1,3,5 (default 1-4)")
    lab.add_argument("--trees", action="append", metavar="SHAPE",
                     help="token-tree shapes, branching factors per depth (3,2,1); ';' between shapes; repeatable")
    lab.add_argument("--policy", help="an adaptive speculative_tokens value, e.g. auto")
    lab.add_argument("--workload", default="code", help="a JSONL file of prompts, or a shipped one: code, prose")
    lab.add_argument("--new", type=int, default=128, help="new tokens per prompt unless the workload says otherwise")
    lab.add_argument("--repeats", type=int, default=3, help="timed runs per prompt and configuration (medians)")
    lab.add_argument("--temperature", type=float, default=0.0,
                     help="0: greedy, outputs checked token for token; > 0: a distribution test")
    lab.add_argument("--samples", type=int, default=200, help="draws per prompt for the distribution test")
    lab.add_argument("--sample-prompts", type=int, default=3, help="prompts in the distribution test")
    lab.add_argument("--sample-tokens", type=int, default=3, help="tokens per draw in the distribution test")
    lab.add_argument("--seed", type=int, default=1234, help="base seed of sampled runs")
    lab.add_argument("--threads", type=int, default=1, help="torch threads")
    lab.add_argument("--prefix-reuse", action="store_true",
                     help="keep prefix caching on (default off: every run prefills its whole prompt)")
    lab.add_argument("--out", default="spec_lab_results", help="the results folder (default spec_lab_results)")
    lab.set_defaults(run=cmd_spec_lab)
    sub.add_parser("bench", help="run the benchmark scripts of a source checkout: bench [all|quick|NAME ...] "
                                 "[--skip NAME ...] (see python -m benchmarks -h)")
    sub.add_parser("serve-jvm", help="run a JVM application on the Python bridge: serve-jvm --classpath app.jar "
                                     "--main com.example.App [--model DIR] -- args (see python -m java_bridge -h)")
    args = parser.parse_args(argv)
    args.argv = list(argv)  # spec-lab records its command line
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
