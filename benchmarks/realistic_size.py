#!/usr/bin/env python
"""Prefill and decode of a realistic-size model against Hugging Face ``transformers`` on the same weights, in the
same process, on the CPU with 2 torch threads.

A randomly initialised Qwen3 of about 133M parameters (hidden 1024, 8 layers, 16 heads / 8 KV heads of 64,
intermediate 3072, vocab 32,000, tied embeddings) is built with ``Qwen3ForCausalLM``, saved as safetensors with a
word-level ``tokenizer.json`` in a temporary folder, and loaded by ``LanguageModel.from_pretrained``.

At each context length of ``--contexts`` (prompt tokens; default 200, 1,000 and 2,000):

- Prefill: ``generate(prompt, 1)`` (bind, one prefill forward with logits for every position, the first token,
  release; prefix reuse off) against one HF forward on the same ids (logits for every position); the first token is
  checked equal to HF's argmax.
- Decode: ``generate(prompt, --new, speculative_tokens=0)``, per token from ``Completion.stats["decode_s"]``, against
  HF ``generate`` with its own KV cache, per token from a streamer's time stamps (first new token to last); greedy
  tokens checked identical. The pool holds one request of the longest context (as a tightly sized server's does), so
  a row's pages often wrap around the end of the FIFO free list: two runs of consecutive pages, not one.

Every figure is a median of ``--repeats`` runs, ours and HF interleaved; ratios are HF time / our time (goal >= 1.0).

    .venv/bin/python benchmarks/realistic_size.py
    .venv/bin/python benchmarks/realistic_size.py --contexts 200,1000,2000 --repeats 3
    .venv/bin/python benchmarks/realistic_size.py --no-spans   # a row in several runs of slots is gathered
    .venv/bin/python benchmarks/realistic_size.py --quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402

VOCAB = 32000


def build_checkpoint(folder: Path) -> Any:
    """Save a random Qwen3 of about 133M parameters and a word-level tokenizer of its vocabulary into ``folder``;
    returns the HF model (float32, eval)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=VOCAB, hidden_size=1024, intermediate_size=3072, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096,
                      tie_word_embeddings=True, bos_token_id=None, eos_token_id=VOCAB - 1, pad_token_id=None)
    hf = Qwen3ForCausalLM(cfg).eval()
    hf.save_pretrained(folder, safe_serialization=True)
    vocab = {f"w{i}": i for i in range(VOCAB - 2)} | {"<unk>": VOCAB - 2, "<eos>": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(folder / "tokenizer.json"))
    return hf


class StepClock:
    """A ``transformers`` streamer that records when each ``put`` arrives (the prompt first, then each new token)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        self.stamps.append(time.perf_counter())

    def end(self) -> None:
        pass


def prefill_case(lm: Any, hf: Any, prompt: list[int], repeats: int) -> tuple[float, float]:
    """Median seconds of our prefill (``generate(prompt, 1)``) and of HF's forward over ``prompt``."""
    ids = torch.tensor([prompt])
    ours, theirs = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        c = lm.generate(prompt, 1, speculative_tokens=0)
        ours.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        with torch.inference_mode():
            logits = hf(ids).logits
        theirs.append(time.perf_counter() - t0)
    assert c.tokens == [int(logits[0, -1].argmax())], "first token differs from HF"
    return statistics.median(ours), statistics.median(theirs)


def decode_case(lm: Any, hf: Any, prompt: list[int], new: int, repeats: int) -> tuple[float, float]:
    """Median seconds per decoded token: ours from ``stats["decode_s"]``, HF's from its streamer's stamps."""
    ids = torch.tensor([prompt])
    ours, theirs = [], []
    for _ in range(repeats):
        c = lm.generate(prompt, new, speculative_tokens=0)
        assert len(c.tokens) == new, f"ours stopped after {len(c.tokens)} tokens"
        ours.append(c.stats["decode_s"] / (new - 1))
        clock = StepClock()
        with torch.inference_mode():
            h = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                            do_sample=False, pad_token_id=0, streamer=clock)
        theirs.append((clock.stamps[-1] - clock.stamps[1]) / (new - 1))
    assert h[0, len(prompt) :].tolist() == c.tokens, "greedy tokens differ from HF"
    return statistics.median(ours), statistics.median(theirs)


def contexts(text: str) -> list[int]:
    """``--contexts``: comma-separated positive prompt lengths."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 2:
        raise argparse.ArgumentTypeError(f"expected prompt lengths of at least 2 tokens, got {text!r}")
    return values


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", type=contexts, default=[200, 1000, 2000],
                   help="comma-separated prompt lengths, each timed for prefill and decode (default 200,1000,2000)")
    p.add_argument("--new", type=int, default=64, help="greedy tokens decoded")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="2 repeats, 16 new tokens")
    p.add_argument("--no-spans", action="store_true",
                   help="gather a row's K/V whenever its slots are not one run of consecutive slots (the reference "
                        "backend without reads by span, for before/after figures)")
    args = p.parse_args()
    if args.quick:
        args.repeats, args.new = 2, 16
    from transformers.utils import logging as hf_logging

    from smile_llm.attention.torch import plan as torch_plan
    from smile_llm.language_model import LanguageModel

    if args.no_spans:
        torch_plan.SPAN_MIN_TOKENS = 1 << 62  # _spans then lists a row only when its slots are one run

    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        hf = build_checkpoint(folder)
        cfg = json.loads((folder / "config.json").read_text())
        lm = LanguageModel.from_pretrained(folder, max_batch_size=1, max_seq_len=max(args.contexts) + args.new + 64)
    lm.pool.prefix_reuse_enabled = False  # a full prefill every run, like HF
    params = sum(t.numel() for t in hf.parameters())
    gen = torch.Generator().manual_seed(1)
    prompts = {n: [int(t) for t in torch.randint(0, VOCAB - 2, (n,), generator=gen)] for n in sorted(set(args.contexts))}
    print(f"realistic_size: random Qwen3, {params / 1e6:.1f}M parameters (hidden {cfg['hidden_size']}, "
          f"{cfg['num_hidden_layers']} layers, {cfg['num_attention_heads']} heads / {cfg['num_key_value_heads']} KV "
          f"heads of {cfg['head_dim']}, intermediate {cfg['intermediate_size']}, vocab {cfg['vocab_size']}, tied), "
          f"float32, {args.threads} threads, medians of {args.repeats}, {args.new} greedy tokens; torch "
          f"{torch.__version__}; code {code_version()}{' (--no-spans)' if args.no_spans else ''}; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    ratios = []
    for n in args.contexts:
        lm.generate(prompts[n], 4, speculative_tokens=0)  # warm-up at this length, both
        with torch.inference_mode():
            hf(torch.tensor([prompts[n]]))
        o, t = prefill_case(lm, hf, prompts[n], args.repeats)
        ratios.append((f"prefill {n}", t / o))
        print(f"  context {n:5d}   prefill: ours {o * 1e3:8.1f} ms   HF {t * 1e3:8.1f} ms   HF/ours {t / o:.2f}x "
              f"(first token identical)", flush=True)
        o, t = decode_case(lm, hf, prompts[n], args.new, args.repeats)
        ratios.append((f"decode {n}", t / o))
        print(f"  context {n:5d}   decode:  ours {o * 1e3:6.2f} ms/token   HF {t * 1e3:6.2f} ms/token   "
              f"HF/ours {t / o:.2f}x (tokens identical)", flush=True)
    print(f"(load average at the end {', '.join(f'{x:.1f}' for x in os.getloadavg())})")
    print("headline: realistic size (133M Qwen3, 2 threads) HF/ours: "
          + ", ".join(f"{name} {r:.2f}x" for name, r in ratios) + " (goal >= 1.0)")


if __name__ == "__main__":
    main()
