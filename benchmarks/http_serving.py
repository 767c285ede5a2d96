#!/usr/bin/env python
"""``smile-llm serve`` against ``transformers serve --continuous-batching`` (the peer's own OpenAI server) on the same
weights, in the same run, both driven by ``guidellm`` (an established serving load generator), and the server's own
overhead against in-process threads calling ``generate``.

The weights are the shipped dense model (byte-level, with its ``tokenizer.json`` and ChatML template, so both servers
and guidellm read the same folder), or with ``--realistic`` the random 133M-parameter Qwen3 of ``realistic_size.py``
(its word-level ``tokenizer.json`` of 32,000 entries, the same ChatML template; guidellm's English words are unknown
to it, so every prompt word is one ``<unk>`` token: the lengths, not the text, are what is served). The workload is a chat with a shared system prompt: guidellm's synthetic text,
``--prompt-tokens`` per request after a ``--prefix-tokens`` prefix shared by every request (one prefix bucket),
``--output-tokens`` per reply (``max_tokens``; both servers may stop earlier at EOS, and the output tokens per second
count what was generated), greedy, streamed, at each concurrency of ``--concurrency`` (guidellm's ``concurrent``
profile), ``--requests`` requests per stream. Each server runs alone on the machine with ``--threads`` torch threads
(``OMP_NUM_THREADS`` for the peer, ``--threads`` for ours). Reported per concurrency: request throughput, output
tokens/s, TTFT and inter-token latency at p50 and p99, and the ratios ours / peer.

Overhead: 16 threads in one process call ``LanguageModel.chat`` on prompts of the same shape (the shared prefix
plus distinct text, ``--output-tokens`` each, greedy) on a model loaded as ``serve`` loads it, its main thread
driving the model as ``serve``'s does; output tokens/s against the HTTP run at concurrency 16 (goal: HTTP at least
0.9 of in-process).

    .venv/bin/python benchmarks/http_serving.py
    .venv/bin/python benchmarks/http_serving.py --quick
    .venv/bin/python benchmarks/http_serving.py --realistic --concurrency 1,16
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version, popen_server, stderr_tail  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAME = "smile-bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(kind: str, folder: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    if kind == "smile":
        cmd = [sys.executable, "-m", "smile_llm", "serve", "--model", str(folder), "--port", str(port),
               "--served-model-name", NAME, "--threads", str(threads), "--max-batch-size", "16",
               "--max-seq-len", "2048", "--log-level", "warning"]
    else:
        cmd = [str(Path(sys.executable).parent / "transformers"), "serve", str(folder), "--continuous-batching",
               "--port", str(port), "--device", "cpu", "--log-level", "warning"]
    return popen_server(cmd, env)


def wait_ready(url: str, model: str, proc: subprocess.Popen[bytes], timeout: float = 300) -> None:
    """Until a one-token chat completion succeeds (the peer loads its model on the first request)."""
    deadline = time.monotonic() + timeout
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {stderr_tail(proc)}")
        try:
            if httpx.post(url + "/v1/chat/completions", json=body, timeout=120).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready within {timeout} s")


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def guidellm(url: str, model: str, folder: Path, streams: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One guidellm run at ``streams`` concurrent streams; the figures of its benchmark."""
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": model, "request_format": "/v1/chat/completions",
                    "max_tokens": args.output_tokens, "extras": {"body": {"temperature": 0}}},
        "profile": {"kind": "concurrent", "streams": streams},
        "data": [{"kind": "synthetic_text", "prompt_tokens": args.prompt_tokens,
                  "prefix_buckets": [{"prefix_tokens": args.prefix_tokens, "prefix_count": 1, "bucket_weight": 100}]}],
        "tokenizer": {"kind": "huggingface_auto", "model": str(folder)},
        "constraints": [{"kind": "max_requests", "count": streams * args.requests},
                        {"kind": "max_duration", "seconds": args.max_seconds}],
        "outputs": [{"kind": "json", "path": str(out)}],
        "seed": {"kind": "static", "value": 42}}}
    path = out.with_suffix(".scenario.json")
    path.write_text(json.dumps(scenario))
    run = subprocess.run([str(Path(sys.executable).parent / "guidellm"), "run", "--scenario", str(path),
                          "--disable-console-interactive"], capture_output=True, text=True, timeout=1800,
                         cwd=tempfile.gettempdir(), env={**os.environ, "OMP_NUM_THREADS": "1"})
    if run.returncode != 0 or not out.is_file():
        raise RuntimeError(f"guidellm failed: {run.stdout[-2000:]} {run.stderr[-2000:]}")
    bench = json.loads(out.read_text())["benchmarks"][0]
    m = bench["metrics"]

    def stat(name: str, key: str) -> float:
        s = m[name]["successful"]
        return float(s["percentiles"][key] if key.startswith("p") else s[key])

    done = len(bench["requests"]["successful"])
    errors = len(bench["requests"]["errored"])
    return {"requests": done, "errors": errors, "req_s": stat("requests_per_second", "mean"),
            "out_tok_s": stat("output_tokens_per_second", "mean"),
            "ttft_p50": stat("time_to_first_token_ms", "p50"), "ttft_p99": stat("time_to_first_token_ms", "p99"),
            "itl_p50": stat("inter_token_latency_ms", "p50"), "itl_p99": stat("inter_token_latency_ms", "p99"),
            "output_tokens": stat("output_token_count", "total_sum")}


def realistic_folder(folder: Path) -> None:
    """The 133M-parameter Qwen3 of ``realistic_size.py`` in ``folder``, with what a chat server and guidellm read
    besides: a ``tokenizer_config.json`` for ``AutoTokenizer`` and the shipped model's ChatML template."""
    from realistic_size import VOCAB, build_checkpoint

    folder.mkdir(parents=True)
    build_checkpoint(folder)
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "eos_token": "<eos>",
        "pad_token": "<eos>", "model_max_length": 4096, "clean_up_tokenization_spaces": False}))
    shutil.copy(ROOT / "smile_llm" / "models" / "default" / "chat_template.jinja", folder)
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == VOCAB


def in_process(folder: Path, args: argparse.Namespace) -> float:
    """Output tokens/s of 16 threads calling ``chat`` (2 rounds each) on a model loaded as ``serve`` loads it
    (compiled and warmed up where ``serve`` compiles it), the main thread driving the model as ``serve``'s does
    (``ServingLoop.drive_here``)."""
    import torch

    from smile_llm import LanguageModel
    from smile_llm.server.model_options import ModelOptions

    torch.set_num_threads(args.threads)
    compiled = ModelOptions(model=str(folder)).compiles
    lm = LanguageModel.from_pretrained(folder, max_batch_size=16, max_seq_len=2048, compile=compiled)
    if compiled:
        lm.warm_up()
    prefix = "You are a helpful assistant who answers briefly. " * (args.prefix_tokens // 50 + 1)
    messages = [[{"role": "system", "content": prefix[: args.prefix_tokens]},
                 {"role": "user",
                  "content": f"Question {i}: " + "tell me about the weather " * (args.prompt_tokens // 26)}]
                for i in range(32)]
    lm.chat(messages[0], 4)  # warm-up
    tokens = [0] * 16

    def worker(i: int) -> None:
        for r in range(2):
            tokens[i] += len(lm.chat(messages[2 * i + r], args.output_tokens, temperature=0).tokens)

    def clients() -> None:
        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        lm.serving_loop.stop_thread(wait=False)

    t = time.perf_counter()
    threading.Thread(target=clients).start()
    lm.serving_loop.drive_here()
    rate = sum(tokens) / (time.perf_counter() - t)
    lm.close()
    return rate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--prefix-tokens", type=int, default=256)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=4, help="requests per stream at each concurrency")
    p.add_argument("--max-seconds", type=int, default=300, help="a bound on each guidellm run")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--quick", action="store_true", help="concurrency 1 and 4, 2 requests per stream, 32 tokens")
    p.add_argument("--realistic", action="store_true", help="the 133M Qwen3 of realistic_size.py")
    args = p.parse_args()
    if args.quick:
        args.concurrency, args.requests, args.output_tokens = "1,4", 2, 32
    levels = [int(c) for c in args.concurrency.split(",")]
    work = Path(tempfile.mkdtemp(prefix="http_bench_"))
    folder = work / "model"
    if args.realistic:
        realistic_folder(folder)
    else:
        shutil.copytree(ROOT / "smile_llm" / "models" / "default", folder)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"http_serving: {'the 133M Qwen3 (random weights)' if args.realistic else 'the shipped dense model'}, "
          f"smile_llm {code_version()}, {os.cpu_count()} cpus (load average {load}), {args.threads} "
          f"torch threads per server; shared prefix {args.prefix_tokens} + prompt {args.prompt_tokens} tokens, "
          f"max_tokens {args.output_tokens}, greedy, streamed; {args.requests} requests per stream", flush=True)
    results: dict[str, dict[int, dict[str, Any]]] = {}
    try:
        for kind in (["smile", "transformers"] if args.peer else ["smile"]):
            port = free_port()
            proc = start(kind, folder, port, args.threads)
            url = f"http://127.0.0.1:{port}"
            model = NAME if kind == "smile" else str(folder)
            try:
                wait_ready(url, model, proc)
                results[kind] = {}
                for c in levels:
                    r = guidellm(url, model, folder, c, args, work / f"{kind}_{c}.json")
                    results[kind][c] = r
                    print(f"  {kind:<12} c={c:<3} {r['requests']:>3} ok {r['errors']} errors  {r['req_s']:6.2f} req/s  "
                          f"{r['out_tok_s']:8.1f} out tok/s  TTFT p50 {r['ttft_p50']:8.1f} "
                          f"p99 {r['ttft_p99']:8.1f} ms  "
                          f"ITL p50 {r['itl_p50']:6.1f} p99 {r['itl_p99']:6.1f} ms", flush=True)
            finally:
                stop(proc)
        if "transformers" in results:
            print("\n  ours / transformers serve:")
            for c in levels:
                a, b = results["smile"][c], results["transformers"][c]
                print(f"    c={c:<3} output tokens/s {a['out_tok_s'] / max(b['out_tok_s'], 1e-9):6.2f}x  requests/s "
                      f"{a['req_s'] / max(b['req_s'], 1e-9):6.2f}x  TTFT p99 {a['ttft_p99']:.0f} vs "
                      f"{b['ttft_p99']:.0f} ms ({'lower' if a['ttft_p99'] < b['ttft_p99'] else 'HIGHER'})")
        top = max(levels)
        inproc = in_process(folder, args)
        http = results["smile"][top]["out_tok_s"]
        print(f"\n  in-process, 16 threads calling chat() (the main thread driving): {inproc:.1f} out tok/s; "
              f"HTTP at c={top}: {http:.1f} ({http / inproc:.2f} of in-process)")
        head = (f"headline: http serving c={top}: ours {http:.0f} out tok/s"
                + (f", {http / max(results['transformers'][top]['out_tok_s'], 1e-9):.1f}x transformers serve"
                   if "transformers" in results else "") + f"; HTTP/in-process {http / inproc:.2f}")
        print(head)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
