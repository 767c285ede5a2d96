#!/usr/bin/env python
"""Pipeline parallelism on the CPU: PP=2 (two processes joined by gloo, one torch thread each, each holding half of
the layers) against PP=1 in its own process on one thread and on two threads, in one run, on a random Qwen3.

The model: hidden ``--hidden`` (1024), ``--layers`` (8) layers, 16 query / 8 KV heads of 64, MLP 2816, vocabulary
8192, an untied LM head and a one-layer MTP head, seeded random weights saved as safetensors. Every process sizes its
pools for ``max_batch_size`` 4 rows of prompt + new + 16 tokens. Reported per rank: the KV bytes of its pools (the
model's pool and the MTP head's), its parameters' bytes and the process's resident memory (``VmRSS`` after loading
and after generating, and its peak ``VmHWM``). Measured on rank 0 (medians of ``--repeats``): the prefill of a
``--prompt``-token prompt and greedy decode tokens/s over ``--new`` tokens, plain and with MTP speculation (the random
head's drafts are mostly rejected: this measures what a round costs, not what speculation gains), and what crosses
the pipeline per generated token. The tokens of PP=2 and PP=1 are checked identical. A CPU figure: both ranks share
the machine's cores and memory bus, and the stages run one after the other (one forward in flight), so PP splits
memory, not time.

    .venv/bin/python benchmarks/pipeline_parallel.py [--hidden 1024] [--layers 8] [--prompt 256] [--new 64] [--quick]
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

VOCAB = 8192


def build(folder: Path, hidden: int, layers: int) -> None:
    from safetensors.torch import save_file

    from smile_llm.models.checkpoint.config import ModelConfig
    from smile_llm.models.transformer import Transformer

    cfg = {"model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": hidden, "num_hidden_layers": layers,
           "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2816,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": False,
           "bos_token_id": None, "eos_token_id": None, "mtp_num_hidden_layers": 1,
           "speculative_config": {"num_speculative_tokens": 3}}
    torch.manual_seed(0)
    model = Transformer(ModelConfig.from_dict(cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape) / (p.shape[-1] ** 0.5) if p.dim() > 1 else 1 + 0.1 * torch.randn(p.shape))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))


def process_memory() -> dict[str, int]:
    """This process's resident memory now and at its peak, in bytes (``/proc/self/status``)."""
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def holdings(lm: Any) -> dict[str, Any]:
    """What this process's model holds: KV bytes per pool, parameter bytes, layers."""
    pools = lm._tp_pools()
    kv = {k: sum(t.numel() * t.element_size() for t in (p.key_cache, p.value_cache)) if p.num_layers else 0
          for k, p in pools.items()}
    stage = lm.transformer.stage
    layers = [stage.layers.start, stage.layers.stop] if stage is not None else [0, lm.config.num_hidden_layers]
    return {"kv_bytes": kv, "param_bytes": sum(p.numel() * p.element_size() for p in lm.transformer.parameters()),
            "layers": layers, "slots": lm.pool.num_slots}


def measure(lm: Any, prompt: list[int], new: int, repeats: int, speculative: int) -> dict[str, Any]:
    lm.pool.prefix_reuse_enabled = False
    lm.generate(prompt[:32], 4, speculative_tokens=speculative)  # warm-up
    prefill, decode, tokens = [], [], None
    for _ in range(repeats):
        c = lm.generate(prompt, new, speculative_tokens=speculative)
        prefill.append(c.stats["prefill_s"])
        decode.append(c.stats["tokens_per_s"])
        tokens = c.tokens
    return {"prefill_s": statistics.median(prefill), "tok_s": statistics.median(decode), "tokens": tokens}


def prompt_of(args: argparse.Namespace) -> list[int]:
    return [(37 * i + 11) % VOCAB for i in range(args.prompt)]


def options_of(args: argparse.Namespace) -> dict[str, Any]:
    return {"max_seq_len": args.prompt + args.new + 16, "max_batch_size": 4}


def single_main(folder: str, args: argparse.Namespace, out: str) -> None:
    """PP=1 in its own process: memory and holdings on one thread, then decode on one and on two threads."""
    from smile_llm.language_model import LanguageModel

    torch.set_num_threads(1)
    result: dict[str, Any] = {"memory_before_load": process_memory()}
    lm = LanguageModel.from_pretrained(folder, **options_of(args))
    result["memory_loaded"], result["holds"] = process_memory(), holdings(lm)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        for spec in (0, 3):
            result[f"{threads}t_spec{spec}"] = measure(lm, prompt_of(args), args.new, args.repeats, spec)
    result["memory_after"] = process_memory()
    lm.close()
    Path(out).write_text(json.dumps(result))
    os._exit(0)


def rank_main(rank: int, port: int, folder: str, args: argparse.Namespace, out: str) -> None:
    """One rank of PP=2: its holdings and memory; rank 0 also measures decode and the pipeline's traffic."""
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "LOCAL_RANK": str(rank)})
    import torch.distributed as dist

    from smile_llm.language_model import LanguageModel

    torch.set_num_threads(1)
    before = process_memory()
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    lm = LanguageModel.from_pretrained(folder, pipeline_parallel=2, **options_of(args))
    result: dict[str, Any] = {"memory_before_load": before, "memory_loaded": process_memory(),
                              "holds": holdings(lm)}
    if lm.is_follower:
        lm.follow()
    else:
        pipe, leader = lm.transformer.stage.pipe, lm.transformer.leader
        for spec in (0, 3):
            sent, plans = dict(pipe.sent), leader.bytes_sent
            result[f"1t_spec{spec}"] = measure(lm, prompt_of(args), args.new, args.repeats, spec)
            generated = (args.repeats + 1) * args.new  # the warm-up's tokens counted as generated
            result[f"sent_per_token_spec{spec}"] = {
                "activations": (pipe.sent["activations"] - sent["activations"]) / generated,
                "plans": (leader.bytes_sent - plans) / generated}
        lm.close()
    result["memory_after"] = process_memory()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    os._exit(0)


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="64-token prompt, 16 new tokens, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.prompt, args.new, args.repeats = 64, 16, 1
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        build(folder, args.hidden, args.layers)
        single = ctx.Process(target=single_main, args=(str(folder), args, str(Path(tmp) / "pp1.json")))
        single.start()
        single.join()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [ctx.Process(target=rank_main, args=(r, port, str(folder), args, tmp)) for r in range(2)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join()
        one = json.loads((Path(tmp) / "pp1.json").read_text())
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(2)]
    pp = ranks[0]
    for spec in (0, 3):
        assert pp[f"1t_spec{spec}"]["tokens"] == one[f"1t_spec{spec}"]["tokens"] == one[f"2t_spec{spec}"]["tokens"], \
            "PP=2 and PP=1 generated different tokens"
    print(f"pipeline_parallel: random Qwen3, hidden {args.hidden}, {args.layers} layers + a 1-layer MTP head, 16/8 "
          f"heads of 64, MLP 2816, vocab {VOCAB}, untied; pools of 4 rows x {options_of(args)['max_seq_len']} "
          f"tokens; {args.prompt}-token prompt, {args.new} greedy tokens, medians of {args.repeats}; torch "
          f"{torch.__version__}, gloo on the CPU; code {code_version()}")
    print(f"{'process':22} {'layers':>7} {'params MiB':>11} {'KV MiB':>8} {'MTP KV MiB':>11} {'RSS loaded':>11} "
          f"{'RSS after':>10} {'peak RSS':>9}")
    for label, r in (("PP=1", one), ("PP=2 rank 0", ranks[0]), ("PP=2 rank 1", ranks[1])):
        h, m = r["holds"], r["memory_after"]
        print(f"{label:22} {'%d-%d' % (h['layers'][0], h['layers'][1] - 1):>7} {mib(h['param_bytes']):>11} "
              f"{mib(h['kv_bytes']['main']):>8} {mib(h['kv_bytes'].get('draft', 0)):>11} "
              f"{mib(r['memory_loaded']['VmRSS']):>11} {mib(m['VmRSS']):>10} {mib(m['VmHWM']):>9}")
    print(f"{'decode':22} {'prefill ms':>11} {'plain tok/s':>12} {'MTP tok/s':>10}")
    for key, label in (("1t", "PP=1, 1 thread"), ("2t", "PP=1, 2 threads")):
        print(f"{label:22} {one[f'{key}_spec0']['prefill_s'] * 1e3:>11.1f} {one[f'{key}_spec0']['tok_s']:>12.1f} "
              f"{one[f'{key}_spec3']['tok_s']:>10.1f}")
    print(f"{'PP=2, 1 thread/rank':22} {pp['1t_spec0']['prefill_s'] * 1e3:>11.1f} {pp['1t_spec0']['tok_s']:>12.1f} "
          f"{pp['1t_spec3']['tok_s']:>10.1f}")
    for spec, label in ((0, "plain"), (3, "MTP")):
        sent = pp[f"sent_per_token_spec{spec}"]
        print(f"rank 0 sends per generated token ({label}): activations {sent['activations']:,.0f} B, plans "
              f"{sent['plans']:,.0f} B")
    kv_one = one["holds"]["kv_bytes"]["main"]
    print(f"headline: each PP=2 rank holds {ranks[0]['holds']['kv_bytes']['main'] / kv_one:.2f} / "
          f"{ranks[1]['holds']['kv_bytes']['main'] / kv_one:.2f} of PP=1's KV and "
          f"{ranks[0]['holds']['param_bytes'] / one['holds']['param_bytes']:.2f} / "
          f"{ranks[1]['holds']['param_bytes'] / one['holds']['param_bytes']:.2f} of its parameters; plain decode "
          f"{pp['1t_spec0']['tok_s'] / one['1t_spec0']['tok_s']:.2f}x PP=1 on one thread, "
          f"{pp['1t_spec0']['tok_s'] / one['2t_spec0']['tok_s']:.2f}x on two; identical tokens: yes")


if __name__ == "__main__":
    main()
