#!/usr/bin/env python
"""Memory of the default model: peak RSS per scenario (each in its own subprocess, so peaks do not mix), KV bytes
per token by pool dtype, and the KV a 16-request shared-prefix batch holds in our paged pool against what HF's
``DynamicCache`` holds for the same tokens.

Scenarios (``resource.getrusage(RUSAGE_SELF).ru_maxrss`` at the end of a fresh interpreter):
  torch          ``import torch`` only (the floor)
  load           ``import smile_llm`` + ``LanguageModel.default(max_batch_size=16, max_seq_len=...)``
  batch          load + the 16-request shared-prefix ``generate_batch`` of ``shared_prefix.py`` (cold, then warm)
  hf_batch       ``transformers`` ``Qwen3ForCausalLM`` of the same folder + its batched left-padded ``generate``

KV bytes per token = 2 (K and V) x layers x KV heads x head_dim x element size, read from a small real
``KvCachePool`` in float32, bfloat16 and float8_e4m3fn (checked against its buffers' sizes). HF's
``DynamicCache`` uses the same formula in the model dtype (float32 here) but stores every request's sequence,
the shared prefix included, separately; our pool stores the prefix pages once. The token counts come from the
actual run: our peak pages in use x page size against HF's sum of sequence lengths (prompt + new, no padding; the
left-padded batch really holds batch x the longest, also printed).

    .venv/bin/python benchmarks/memory.py
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_env import code_version


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def child(mode: str, requests: int, new: int) -> dict:
    import torch

    torch.set_num_threads(1)
    out: dict = {}
    if mode == "torch":
        pass
    elif mode == "hf_batch":
        from shared_prefix import SUFFIXES, system_prompt
        from transformers import Qwen3ForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        from smile_llm.models.shipped import DEFAULT_MODEL_DIR

        hf = Qwen3ForCausalLM.from_pretrained(str(DEFAULT_MODEL_DIR), torch_dtype=torch.float32).eval()
        ids = [list((system_prompt(1000) + SUFFIXES[i % len(SUFFIXES)]).encode()) for i in range(requests)]
        width = max(len(x) for x in ids)
        x = torch.tensor([[0] * (width - len(r)) + r for r in ids])
        m = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
        out["after_load_mib"] = rss_mib()
        with torch.inference_mode():
            hf.generate(x, attention_mask=m, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    else:
        from shared_prefix import SUFFIXES, peak_used_pages, system_prompt

        from smile_llm import LanguageModel

        prompts = [system_prompt(1000) + SUFFIXES[i % len(SUFFIXES)] for i in range(requests)]
        lm = LanguageModel.default(max_batch_size=requests, max_seq_len=max(len(p) for p in prompts) + new + 32)
        out["pool_bytes"] = lm.pool.key_cache.nbytes + lm.pool.value_cache.nbytes
        out["pool_slots"] = lm.pool.num_slots
        if mode == "batch":
            out["after_load_mib"] = rss_mib()
            out["cold_pages"] = peak_used_pages(lm, prompts, new)
            out["warm_pages"] = peak_used_pages(lm, prompts, new)
            out["page_size"] = lm.pool.page_size
            out["hf_tokens"] = sum(len(lm.encode(p)) + new for p in prompts)
            out["hf_padded_tokens"] = requests * (max(len(lm.encode(p)) for p in prompts) + new)
            out["prefix_tokens"] = len(lm.encode(system_prompt(1000)))
    out["maxrss_mib"] = rss_mib()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--quick", action="store_true", help="4 requests")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:
        args.requests = 4
    if args.child:
        print(json.dumps(child(args.child, args.requests, args.new)))
        return
    import torch

    from smile_llm.cache import KvCachePool
    from smile_llm.models.checkpoint.config import ModelConfig
    from smile_llm.models.shipped import DEFAULT_MODEL_DIR

    res = {}
    for mode in ("torch", "load", "batch", "hf_batch"):
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "--child", mode, "--requests", str(args.requests),
                            "--new", str(args.new)], capture_output=True, text=True, check=True)
        res[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        res[mode]["s"] = time.perf_counter() - t0
    cfg = ModelConfig.from_pretrained(DEFAULT_MODEL_DIR)
    per_token = {}
    for dtype in (torch.float32, torch.bfloat16, torch.float8_e4m3fn):
        pool = KvCachePool(cfg.num_hidden_layers, 64, cfg.num_key_value_heads, cfg.head_dim, 16, "cpu", dtype)
        formula = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * pool.key_cache.element_size()
        actual = (pool.key_cache.nbytes + pool.value_cache.nbytes) / pool.num_slots
        assert formula == actual, (dtype, formula, actual)
        per_token[str(dtype).replace("torch.", "")] = formula
        pool.close()
    b = res["batch"]
    ps = b["page_size"]
    print(f"memory: default model ({cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} KV heads x head_dim "
          f"{cfg.head_dim}), {args.requests} requests sharing a {b['prefix_tokens']}-token prefix, {args.new} new "
          f"tokens; python {sys.version.split()[0]}, torch {torch.__version__}; code {code_version()}")
    print("\npeak RSS (ru_maxrss, one subprocess per row):")
    print(f"  import torch only                        {res['torch']['maxrss_mib']:7.0f} MiB")
    print(f"  import smile_llm + load default model    {res['load']['maxrss_mib']:7.0f} MiB  (KV pool buffers "
          f"{res['load']['pool_bytes'] / 2**20:.1f} MiB for {res['load']['pool_slots']:,} slots, float32)")
    print(f"  + {args.requests}-request shared-prefix batch (x2)    {b['maxrss_mib']:7.0f} MiB  (after load "
          f"{b['after_load_mib']:.0f} MiB)")
    print(f"  HF load + batched generate (same batch)  {res['hf_batch']['maxrss_mib']:7.0f} MiB  (after load "
          f"{res['hf_batch']['after_load_mib']:.0f} MiB)")
    print("\nKV bytes per token (2 x layers x KV heads x head_dim x element size, checked on a real pool):")
    for name, n in per_token.items():
        print(f"  {name:14} {n:6,} B/token")
    print(f"  HF DynamicCache (float32, the model dtype): {per_token['float32']:,} B/token, per request, no sharing")
    ours_cold, ours_warm = b["cold_pages"] * ps, b["warm_pages"] * ps
    print(f"\nKV held by the {args.requests}-request batch at its peak (from the run):")
    print(f"  ours, cold cache    {b['cold_pages']:5} pages = {ours_cold:6,} tokens (the first prompt is prefilled "
          f"and cached before the others bind, so they share its prefix pages)")
    print(f"  ours, prefix cached {b['warm_pages']:5} pages = {ours_warm:6,} tokens (prefix once + each row's own "
          f"pages)")
    print(f"  HF                  {b['hf_tokens']:,} tokens (sum of sequence lengths; {b['hf_padded_tokens']:,} "
          f"with its left padding)")
    print(f"  {'':20}{'float32':>12}{'bfloat16':>12}{'float8':>12}")
    for label, toks in (("ours cold", ours_cold), ("ours cached", ours_warm), ("HF (no padding)", b["hf_tokens"]),
                        ("HF (padded)", b["hf_padded_tokens"])):
        cells = "".join(f"{toks * n / 2**20:9.2f} MiB" for n in per_token.values())
        print(f"  {label:20}{cells}")
    ratio = b["hf_tokens"] / ours_warm
    print(f"headline: memory: {per_token['float32']:,} B/token f32 / {per_token['bfloat16']:,} bf16 / "
          f"{per_token['float8_e4m3fn']:,} fp8; shared-prefix batch KV {ratio:.1f}x smaller than HF's (prefix cached), "
          f"{b['hf_tokens'] / ours_cold:.1f}x cold; RSS load {res['load']['maxrss_mib']:.0f} MiB, batch "
          f"{b['maxrss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
