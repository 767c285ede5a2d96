#!/usr/bin/env python
"""Hybrid models (Gated DeltaNet + gated attention; Qwen3-Next adds a sparse MoE) single stream, greedy: our
``generate`` against ``transformers``' ``generate`` on the same weights, in the same process, and MTP speculative
decoding against plain decoding.

First the shipped hybrid default model (``LanguageModel.default(kind="hybrid")``, trained: its MTP head's drafts are
accepted as often as they really are) on stdlib source: ours plain, ours speculative (the MTP head, 3 drafts per
round) and ``transformers``' ``Qwen3_5ForCausalLM``, all three greedy outputs checked identical. Then each family as
a seeded random model of a larger shape for the CPU
(hidden 256, 8 layers as 3 DeltaNet + 1 full attention twice, 4 query / 2 KV heads of 64 with partial rotary 0.25,
DeltaNet 4 key heads x 32 and 8 value heads x 32, conv width 4, vocabulary 257; Qwen3-Next: 8 experts of 128, top
2, a shared expert of 256), saved with ``save_pretrained`` and loaded by both. Each run generates ``--new`` tokens
after a ``--prompt``-token prompt; the tokens are checked identical, the timings interleaved (medians of
``--repeats``). Also printed: each request's DeltaNet state bytes beside the KV bytes per token.

    .venv/bin/python benchmarks/hybrid_generate.py [--new 128] [--prompt 200] [--repeats 3] [--threads 1] [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_env import code_version  # noqa: E402

SHAPE: dict[str, Any] = {
    "vocab_size": 257, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 8,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 2,
    "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
    "linear_conv_kernel_dim": 4, "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None,
    "pad_token_id": None,
}
FAMILY: dict[str, dict[str, Any]] = {
    "qwen3_5": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                    "mrope_section": [4, 2, 2], "mrope_interleaved": True}},
    "qwen3_next": {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                   "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128,
                   "shared_expert_intermediate_size": 256, "norm_topk_prob": True, "decoder_sparse_step": 1},
}


def build(family: str, folder: Path, seed: int) -> Any:
    """Save a seeded random ``family`` model into ``folder``; returns the HF model (float32, eval)."""
    import transformers

    config_cls, model_cls = {"qwen3_5": (transformers.Qwen3_5TextConfig, transformers.Qwen3_5ForCausalLM),
                             "qwen3_next": (transformers.Qwen3NextConfig, transformers.Qwen3NextForCausalLM)}[family]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**SHAPE, **FAMILY[family])).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # non-degenerate logits: zero-centred norms near 0, projections ~1/sqrt(fan_in)
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif p.dim() == 1 and "norm" in name:
                p.copy_(0.1 * noise)
            elif name.endswith("A_log"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 4.0, generator=g).log())
            elif name.endswith("dt_bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "smile_tokenizer.json").write_text(json.dumps({"vocab_size": 257, "eos_token_id": 256}))
    return model


def timed(fns: dict[str, Any], repeats: int) -> dict[str, float]:
    """Median seconds of each function, run in rotating order ``repeats`` times."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for rep in range(repeats):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def hf_greedy(hf: Any, prompt: list[int], new: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def trained_model(args: argparse.Namespace) -> str:
    """Ours plain, ours speculative and transformers on the shipped hybrid model; returns the headline part."""
    import transformers

    from smile_llm import LanguageModel
    from smile_llm.models.shipped import DEFAULT_MODEL_DIRS

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from speculative import stdlib_prompts

    lm = LanguageModel.default(kind="hybrid", max_seq_len=args.prompt + args.new + 16, max_batch_size=1)
    hf = transformers.Qwen3_5ForCausalLM.from_pretrained(str(DEFAULT_MODEL_DIRS["hybrid"]),
                                                         torch_dtype=torch.float32).eval()
    (text,) = stdlib_prompts(1, args.prompt)
    prompt = lm.encode(text)
    new = args.new
    lm.pool.prefix_reuse_enabled = False  # every run prefills the prompt: the same work as transformers
    plain = lm.generate(prompt, new, speculative_tokens=0).tokens
    spec = lm.generate(prompt, new)
    theirs = hf_greedy(hf, prompt, new)
    n = min(len(plain), len(theirs))
    assert plain == spec.tokens and plain[:n] == theirs[:n], "greedy tokens differ (plain, speculative, transformers)"
    ms = timed({"plain": lambda: lm.generate(prompt, new, speculative_tokens=0),
                "speculative": lambda: lm.generate(prompt, new),
                "transformers": lambda: hf_greedy(hf, prompt, new)}, args.repeats)
    st = spec.stats
    print(f"hybrid default model ({lm.config.num_hidden_layers} layers, "
          f"{sum(t == 'full_attention' for t in lm.config.layer_types)} full attention), {len(prompt)}-token stdlib "
          f"prompt, {len(plain)} new tokens")
    for name, t in ms.items():
        print(f"  {name:12s} {t * 1e3:8.1f} ms  ({len(plain) / t:6.1f} tok/s)")
    print(f"  speculative: {st['mean_accepted_length']:.2f} tokens per round, {st['target_forwards_per_token']:.2f} "
          f"target forwards per token; identical tokens in all three")
    lm.close()
    return (f"hybrid default model: plain {ms['transformers'] / ms['plain']:.2f}x transformers, MTP speculative "
            f"{ms['plain'] / ms['speculative']:.2f}x plain ({st['mean_accepted_length']:.2f} tokens/round)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--prompt", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="32 new tokens after 100, 1 repeat")
    args = p.parse_args()
    if args.quick:
        args.new, args.prompt, args.repeats = 32, 100, 1
    torch.set_num_threads(args.threads)
    from smile_llm import LanguageModel

    print(f"hybrid_generate: smile_llm {code_version()}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; greedy, {args.new} new tokens after {args.prompt} prompt tokens, medians of {args.repeats}\n")
    headline = trained_model(args)
    prompt = [(37 * i + 11) % 256 for i in range(args.prompt)]
    ratios = []
    print("\nseeded random models, hidden 256, 8 layers")
    for family in ("qwen3_5", "qwen3_next"):
        with tempfile.TemporaryDirectory() as tmp:
            hf = build(family, Path(tmp), 1234)
            lm = LanguageModel.from_pretrained(tmp, max_seq_len=args.prompt + args.new + 16, max_batch_size=1,
                                               drafter=None)
            lm.pool.prefix_reuse_enabled = False
            ours = lm.generate(prompt, args.new).tokens  # also the warm-up
            assert ours == hf_greedy(hf, prompt, args.new), f"{family}: greedy tokens differ from transformers"
            ms = timed({"ours": lambda: lm.generate(prompt, args.new),
                        "hf": lambda: hf_greedy(hf, prompt, args.new)}, args.repeats)
            o, h = ms["ours"], ms["hf"]
            ratios.append(f"{family} {h / o:.2f}x")
            (states,) = lm.pool.state_pools
            kv_bytes = 2 * lm.pool.num_layers * lm.pool.num_kv_heads * lm.pool.head_dim * 4
            print(f"{family:10s} ours {o * 1e3:7.1f} ms ({args.new / o:6.1f} tok/s)   transformers {h * 1e3:7.1f} ms "
                  f"({args.new / h:6.1f} tok/s)   speedup {h / o:5.2f}x; identical tokens")
            print(f"{'':10s} per request: DeltaNet state {states.bytes_per_request:,} bytes (fixed), KV "
                  f"{kv_bytes:,} bytes per token ({lm.pool.num_layers} of {lm.config.num_hidden_layers} layers "
                  f"keep KV)")
            lm.close()
    print(f"headline: {headline}; random hidden-256 models vs transformers: {', '.join(ratios)}")


if __name__ == "__main__":
    main()
