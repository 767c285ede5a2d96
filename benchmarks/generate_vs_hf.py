#!/usr/bin/env python
"""Greedy decode speed of ``LanguageModel.generate`` against Hugging Face ``transformers`` ``generate`` on the same
weights, in the same process, on the CPU.

A randomly initialised Qwen3 of the embedded model's shape (12 layers, hidden 128, 4 heads / 2 KV heads of 32,
vocab 257) is saved and loaded by both; each generates ``--new`` tokens greedily after a ``--prompt``-token prompt
(HF forced to the same length with ``min_new_tokens``). Both outputs are checked equal. Medians of ``--repeats``;
the ratio is ours/HF in tokens per second (higher is better for us). One torch thread.

Then the same comparison on the embedded default model (its trained weights, with the MTP head, so ours decodes
speculatively with the model's default drafts per round; HF loads the same folder as ``Qwen3ForCausalLM`` and
ignores the ``mtp.*`` tensors): a ``--default-prompt-bytes`` slice of stdlib source, ``--default-new`` greedy tokens,
outputs checked equal. ``--quick`` shortens both.

    .venv/bin/python benchmarks/generate_vs_hf.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402
from speculative import stdlib_prompts  # noqa: E402


def default_model(args) -> float:
    """Default model, speculation on, against HF on the same weights; returns ours/HF speed."""
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    from smile_llm.language_model import LanguageModel
    from smile_llm.models.shipped import DEFAULT_MODEL_DIR

    hf_logging.set_verbosity_error()
    hf, info = Qwen3ForCausalLM.from_pretrained(str(DEFAULT_MODEL_DIR), torch_dtype=torch.float32,
                                                output_loading_info=True)
    hf.eval()
    ignored = sorted({".".join(k.split(".")[:2]) for k in info.get("unexpected_keys", [])})
    text = stdlib_prompts(1, args.default_prompt_bytes)[0]
    lm = LanguageModel.default(max_batch_size=1, max_seq_len=args.default_prompt_bytes + args.default_new + 64)
    lm.pool.prefix_reuse_enabled = False  # full prefill every run, like HF
    prompt = lm.encode(text)
    ids = torch.tensor([prompt])
    lm.generate(prompt, 8)
    ours, plain, theirs = [], [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        c = lm.generate(prompt, args.default_new)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        c0 = lm.generate(prompt, args.default_new, speculative_tokens=0)
        plain.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            h = hf.generate(ids, max_new_tokens=args.default_new, min_new_tokens=args.default_new, do_sample=False,
                            pad_token_id=0)
        theirs.append(time.perf_counter() - t0)
    n = len(c.tokens)
    assert c.tokens == c0.tokens, "speculative output differs from plain"
    assert h[0, len(prompt) : len(prompt) + n].tolist() == c.tokens, "outputs differ from HF"
    o, p0, t = statistics.median(ours), statistics.median(plain), statistics.median(theirs)
    print(f"\ndefault model (trained weights, MTP head; HF ignored {ignored or 'nothing'}): stdlib prompt of "
          f"{len(prompt)} tokens, {args.default_new} new tokens ({n} generated, {c.finish_reason}), greedy, "
          f"medians of {args.repeats}")
    print(f"  smile-llm, speculative {o * 1e3:8.1f} ms  {n / o:7.1f} tokens/s (mean accepted length "
          f"{c.stats['mean_accepted_length']:.2f})")
    print(f"  smile-llm, plain       {p0 * 1e3:8.1f} ms  {n / p0:7.1f} tokens/s")
    print(f"  transformers           {t * 1e3:8.1f} ms  {n / t:7.1f} tokens/s")
    print(f"  ours/HF speed {t / o:.2f}x speculative, {t / p0:.2f}x plain (outputs identical)")
    return t / o


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=100)
    p.add_argument("--new", type=int, default=100)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--default-prompt-bytes", type=int, default=100)
    p.add_argument("--default-new", type=int, default=200)
    p.add_argument("--quick", action="store_true", help="2 repeats, 50 new tokens")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.new, args.default_new = 2, 50, 50
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from smile_llm.language_model import LanguageModel

    torch.set_num_threads(1)
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=257, hidden_size=128, intermediate_size=384, num_hidden_layers=args.layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                      tie_word_embeddings=True)
    hf = Qwen3ForCausalLM(cfg).eval()
    folder = tempfile.mkdtemp()
    hf.save_pretrained(folder)
    lm = LanguageModel.from_pretrained(folder, max_seq_len=args.prompt + args.new + 16)
    lm.pool.prefix_reuse_enabled = False  # time the full prefill every run, like HF
    prompt = [int(t) for t in torch.randint(0, 256, (args.prompt,))]
    ids = torch.tensor([prompt])
    ours, theirs = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        c = lm.generate(prompt, args.new)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            h = hf.generate(ids, max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False)
        theirs.append(time.perf_counter() - t0)
    assert h[0, args.prompt : args.prompt + len(c.tokens)].tolist() == c.tokens, "outputs differ"
    o, t = statistics.median(ours), statistics.median(theirs)
    print(f"generate_vs_hf: Qwen3 {args.layers} layers x hidden 128, prompt {args.prompt}, {args.new} new tokens, "
          f"greedy, 1 thread, medians of {args.repeats}; torch {torch.__version__}; code {code_version()}")
    print(f"  smile-llm     {o * 1e3:8.1f} ms  {args.new / o:7.1f} tokens/s (prefill + decode)")
    print(f"  transformers  {t * 1e3:8.1f} ms  {args.new / t:7.1f} tokens/s")
    print(f"  ours/HF speed {t / o:.2f}x (outputs identical)")
    ratio = default_model(args)
    print(f"headline: single stream ours/HF: default model (speculative) {ratio:.2f}x (goal >= 2x), "
          f"random weights (plain) {t / o:.2f}x")


if __name__ == "__main__":
    main()
