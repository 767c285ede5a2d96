#!/usr/bin/env python
"""Greedy decode speed of ``LanguageModel.generate`` against Hugging Face ``transformers`` ``generate`` on the same
weights, in the same process, on the CPU.

A randomly initialised Qwen3 of the embedded model's shape (12 layers, hidden 128, 4 heads / 2 KV heads of 32,
vocab 257) is saved and loaded by both; each generates ``--new`` tokens greedily after a ``--prompt``-token prompt
(HF forced to the same length with ``min_new_tokens``). Both outputs are checked equal. Medians of ``--repeats``;
the ratio is ours/HF in tokens per second (higher is better for us). One torch thread.

    .venv/bin/python benchmarks/generate_vs_hf.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", type=int, default=100)
    p.add_argument("--new", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--layers", type=int, default=12)
    args = p.parse_args()
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from smile_llm.model import LanguageModel

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
          f"greedy, 1 thread, medians of {args.repeats}; torch {torch.__version__}")
    print(f"  smile-llm     {o * 1e3:8.1f} ms  {args.new / o:7.1f} tokens/s (prefill + decode)")
    print(f"  transformers  {t * 1e3:8.1f} ms  {args.new / t:7.1f} tokens/s")
    print(f"  ours/HF speed {t / o:.2f}x (outputs identical)")


if __name__ == "__main__":
    main()
