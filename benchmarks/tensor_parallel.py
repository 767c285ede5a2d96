#!/usr/bin/env python
"""Tensor parallelism on the CPU: TP=2 (two processes joined by gloo, one torch thread each) against TP=1 on one
thread and on two threads, on a random Qwen3 wide enough for the split to matter.

The model: hidden ``--hidden`` (1024), ``--layers`` (4) layers, 16 query / 8 KV heads of 64, MLP 2816, vocabulary
8192, seeded random weights saved as safetensors. Measured on rank 0 (medians of ``--repeats``): the prefill of a
``--prompt``-token prompt, greedy decode tokens/s over ``--new`` tokens (plain decoding), and what rank 0 sends per
generated token (the plans to the other rank, and its share of the all-reduces and the logits' all-gather). The
tokens of TP=2 and TP=1 are checked identical. ``--device cuda`` runs the same on two GPUs with NCCL
(``scripts/gpu_check.sh`` does when the machine has two). Not a GPU figure: on the CPU both ranks share the machine's memory
bandwidth, which is what a decode step is bound by.

    .venv/bin/python benchmarks/tensor_parallel.py [--hidden 1024] [--layers 4] [--prompt 256] [--new 64] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_env import code_version  # noqa: E402


def build(folder: Path, hidden: int, layers: int) -> None:
    from safetensors.torch import save_file

    from smile_llm.models.checkpoint.config import ModelConfig
    from smile_llm.models.transformer import Transformer

    cfg = {"model_type": "qwen3", "vocab_size": 8192, "hidden_size": hidden, "num_hidden_layers": layers,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2816,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "bos_token_id": None, "eos_token_id": None}
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_dict(cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) / (p.shape[-1] ** 0.5) if p.dim() > 1 else 1 + 0.1 * torch.randn(p.shape))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))


def measure(lm: Any, prompt: list[int], new: int, repeats: int) -> dict[str, Any]:
    lm.pool.prefix_reuse_enabled = False
    lm.generate(prompt[:32], 4)  # warm-up
    prefill, decode, tokens = [], [], None
    for _ in range(repeats):
        c = lm.generate(prompt, new, speculative_tokens=0)
        prefill.append(c.stats["prefill_s"])
        decode.append(c.stats["tokens_per_s"])
        tokens = c.tokens
    return {"prefill_s": statistics.median(prefill), "tok_s": statistics.median(decode), "tokens": tokens}


def rank_main(rank: int, port: int, folder: str, args: argparse.Namespace, out: str) -> None:
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "LOCAL_RANK": str(rank)})
    import torch.distributed as dist

    from smile_llm.language_model import LanguageModel

    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(seconds=300))
    options = {"max_seq_len": args.prompt + args.new + 16, "max_batch_size": 1, "device": args.device}
    lm = LanguageModel.from_pretrained(folder, tensor_parallel=2, **options)
    if lm.is_follower:
        lm.follow()
        os._exit(0)
    prompt = [(37 * i + 11) % 8192 for i in range(args.prompt)]
    results = {}
    tp = lm.tp
    before = (lm.transformer.leader.bytes_sent, dict(tp.sent))
    results["tp2"] = measure(lm, prompt, args.new, args.repeats)
    generated = (args.repeats * args.new)
    leader = lm.transformer.leader
    results["plan_bytes_per_token"] = (leader.bytes_sent - before[0]) / generated
    results["collective_bytes_per_token"] = {k: (tp.sent[k] - before[1][k]) / generated for k in tp.sent}
    for threads in (1, 2):
        torch.set_num_threads(threads)
        one = LanguageModel.from_pretrained(folder, **options)
        results[f"tp1_{threads}t"] = measure(one, prompt, args.new, args.repeats)
        one.close()
    lm.close()
    Path(out).write_text(json.dumps(results))
    os._exit(0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: NCCL over two GPUs")
    p.add_argument("--quick", action="store_true", help="64-token prompt, 16 new tokens, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.prompt, args.new, args.repeats = 64, 16, 1
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        build(folder, args.hidden, args.layers)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = Path(tmp) / "result.json"
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=rank_main, args=(r, port, str(folder), args, str(out))) for r in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        r = json.loads(out.read_text())
    same = r["tp2"]["tokens"] == r["tp1_1t"]["tokens"] == r["tp1_2t"]["tokens"]
    assert same, "TP=2 and TP=1 generated different tokens"
    print(f"tensor_parallel: random Qwen3, hidden {args.hidden}, {args.layers} layers, 16/8 heads of 64, MLP 2816, "
          f"vocab 8192; {args.prompt}-token prompt, {args.new} greedy tokens, medians of {args.repeats}; torch "
          f"{torch.__version__}, {'NCCL on two GPUs' if args.device == 'cuda' else 'gloo on the CPU'}; code "
          f"{code_version()}")
    print(f"{'':24} {'prefill ms':>11} {'decode tok/s':>13}")
    for key, label in (("tp1_1t", "TP=1, 1 thread"), ("tp1_2t", "TP=1, 2 threads"), ("tp2", "TP=2, 1 thread/rank")):
        print(f"{label:24} {r[key]['prefill_s'] * 1e3:>11.1f} {r[key]['tok_s']:>13.1f}")
    coll = r["collective_bytes_per_token"]
    print(f"rank 0 sends per generated token: plans {r['plan_bytes_per_token']:,.0f} B, all-reduce "
          f"{coll['all_reduce']:,.0f} B, all-gather {coll['all_gather']:,.0f} B; identical tokens: yes")
    d1, d2, dt = r["tp1_1t"]["tok_s"], r["tp1_2t"]["tok_s"], r["tp2"]["tok_s"]
    print(f"headline: TP=2 decode {dt / d1:.2f}x TP=1 on one thread, {dt / d2:.2f}x TP=1 on two threads; prefill "
          f"{r['tp1_1t']['prefill_s'] / r['tp2']['prefill_s']:.2f}x / "
          f"{r['tp1_2t']['prefill_s'] / r['tp2']['prefill_s']:.2f}x")


if __name__ == "__main__":
    main()
