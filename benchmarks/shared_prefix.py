#!/usr/bin/env python
"""16 requests sharing a ~1,000-token system prompt: ``LanguageModel.generate_batch`` against batched
``transformers`` ``generate`` (left padding) on the same default-model weights, greedy, on the CPU.

The shared prefix is the first ``--prefix-bytes`` bytes of this Python's ``textwrap.py`` (the default model is
byte-level, so bytes = tokens); each request appends a distinct user line of 20-40 bytes and generates ``--new``
greedy tokens. Ours, per repeat (fresh model for "cold"):

- cold: an empty prefix cache, one ``generate_batch`` call. Rows are bound before any is prefilled, so the prefix
  is not shared inside the batch: each row computes it (the tree only gets it when a request finishes).
- primed: an empty cache, ``generate(prefix, 1)`` first (its time included), then ``generate_batch``: every row
  reuses the prefix pages.
- warm: the prefix is already cached (by the previous run); ``generate_batch`` alone (steady state of a server).
- warm, plain: as warm with ``speculative_tokens=0``.
- engine cold: a fresh model, the 16 requests submitted together to an ``InferenceEngine`` (its default prefill
  budget of 512 tokens a step): the first is prefilled alone, the others wait until its prompt is cached, then match
  it (in-batch prefix sharing) and prefill their own lines together.
- warm, ``speculative_max_batch=8``: as warm, but a step of more than 8 rows decodes plainly (the rows speculate
  again once the batch shrinks to 8): speculation pays for a small batch, not for 16 rows over a long context.

The peer is HF ``Qwen3ForCausalLM.from_pretrained`` of the same folder (it ignores the ``mtp.*`` tensors) with
``input_ids`` built from our tokenizer, left-padded, with an attention mask, ``min_new_tokens = max_new_tokens``.
Tokens are compared per request (ours plain = ours speculative = HF); a row where batched HF differs is re-run
through HF unbatched. Medians of ``--repeats``, all variants interleaved. One torch thread. Saves
``results/shared_prefix.png``.

    .venv/bin/python benchmarks/shared_prefix.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version

SUFFIXES = ["\n# Q: what does dedent do?\n", "\n# Q: how is a paragraph wrapped here?\n",
            "\n# user: show me fill()\n", "\n# user: explain the TextWrapper class\n",
            "\n# question: width default?\n", "\n# question: what is expand_tabs for?\n",
            "\n# ask: shorten() example\n", "\n# ask: how are long words broken up?\n",
            "\n# note: indent each line please\n", "\n# note: what does drop_whitespace mean?\n",
            "\n# todo: wrap at 40 cols\n", "\n# todo: keep the tabs as they are, ok?\n",
            "\n# help: sentence endings\n", "\n# help: how do I fix sentence spacing?\n",
            "\n# hi: placeholder text?\n", "\n# hi: what does max_lines limit exactly?\n"]


def system_prompt(nbytes: int) -> str:
    return Path(textwrap.__file__).read_text(encoding="utf-8")[:nbytes]


def peak_used_pages(lm, prompts, new: int) -> int:
    """Pages in use (tree + rows) when the first row of ``lm.generate_batch(prompts, new)`` finishes: every row is
    still bound then, with its whole capacity allocated, so this is the batch's peak."""
    pool = lm.pool
    seen: list[int] = []
    original = pool.finish_request

    def finish(rid, tokens):
        if not seen:
            seen.append(pool.stats()["num_pages"] - pool.stats()["free_pages"])
        return original(rid, tokens)

    pool.finish_request = finish
    try:
        lm.generate_batch(prompts, new)
    finally:
        del pool.finish_request
    return seen[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--prefix-bytes", type=int, default=1000)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="4 requests, 1 repeat")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    if args.quick:
        args.requests, args.repeats = 4, 1
    from transformers import Qwen3ForCausalLM
    from transformers.utils import logging as hf_logging

    from smile_llm import LanguageModel
    from smile_llm.engine import InferenceEngine, SamplingParams
    from smile_llm.models.shipped import DEFAULT_MODEL_DIR

    torch.set_num_threads(1)
    system = system_prompt(args.prefix_bytes)
    prompts = [system + SUFFIXES[i % len(SUFFIXES)] + ("" if i < len(SUFFIXES) else f"#{i}\n")
               for i in range(args.requests)]
    seq_len = max(len(x.encode()) for x in prompts) + args.new + 32

    def fresh() -> LanguageModel:
        return LanguageModel.default(max_batch_size=args.requests, max_seq_len=seq_len)

    hf_logging.set_verbosity_error()
    hf, info = Qwen3ForCausalLM.from_pretrained(str(DEFAULT_MODEL_DIR), torch_dtype=torch.float32,
                                                output_loading_info=True)
    hf.eval()
    ignored = sorted({k.split(".")[0] + "." + k.split(".")[1] for k in info.get("unexpected_keys", [])})
    lm = fresh()
    ids = [lm.encode(x) for x in prompts]
    pad = 0
    width = max(len(x) for x in ids)
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids])

    def run_hf() -> list[list[int]]:
        with torch.inference_mode():
            out = hf.generate(input_ids, attention_mask=mask, max_new_tokens=args.new, min_new_tokens=args.new,
                              do_sample=False, pad_token_id=pad)
        return [r[width:].tolist() for r in out]

    lm.generate_batch(prompts[:2], 4)  # warm-up (fills the cache: "warm" model from here on)
    times: dict[str, list[float]] = {k: [] for k in ("cold", "engine cold", "primed", "warm", "warm max8",
                                                      "warm plain", "HF")}
    outs = {}
    for rep in range(args.repeats):
        cold = fresh()
        t0 = time.perf_counter()
        outs["cold"] = cold.generate_batch(prompts, args.new)
        times["cold"].append(time.perf_counter() - t0)
        cold_stats = cold.pool.stats()
        del cold
        served = fresh()
        t0 = time.perf_counter()
        with InferenceEngine(served, max_batch_size=args.requests) as engine:
            handles = [engine.submit(x, SamplingParams(max_new_tokens=args.new)) for x in prompts]
            outs["engine cold"] = [h.result() for h in handles]
        times["engine cold"].append(time.perf_counter() - t0)
        del served
        primed = fresh()
        t0 = time.perf_counter()
        primed.generate(system, 1)
        outs["primed"] = primed.generate_batch(prompts, args.new)
        times["primed"].append(time.perf_counter() - t0)
        del primed
        t0 = time.perf_counter()
        outs["warm"] = lm.generate_batch(prompts, args.new)
        times["warm"].append(time.perf_counter() - t0)
        lm.speculative_max_batch = 8
        t0 = time.perf_counter()
        outs["warm max8"] = lm.generate_batch(prompts, args.new)
        times["warm max8"].append(time.perf_counter() - t0)
        lm.speculative_max_batch = None
        t0 = time.perf_counter()
        outs["warm plain"] = lm.generate_batch(prompts, args.new, speculative_tokens=0)
        times["warm plain"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hf_tokens = run_hf()
        times["HF"].append(time.perf_counter() - t0)
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    # KV footprint of one batch on a fresh pool with the prefix primed: pages the pool holds at peak
    probe = fresh()
    probe.generate(system, 1)
    tree_before = probe.pool.stats()["tree_pages"]
    peak_pages = peak_used_pages(probe, prompts, args.new)
    st = probe.pool.stats()
    del probe

    plain = outs["warm plain"]
    for name in ("cold", "engine cold", "primed", "warm", "warm max8"):
        for i, (a, b) in enumerate(zip(outs[name], plain)):
            assert a.tokens == b.tokens, f"{name} row {i} differs from plain greedy"
    differ = []
    for i, c in enumerate(plain):
        n = len(c.tokens)
        if hf_tokens[i][:n] != c.tokens:
            differ.append(i)
    unbatched_ok = []
    for i in differ:
        with torch.inference_mode():
            h = hf.generate(torch.tensor([ids[i]]), max_new_tokens=args.new, min_new_tokens=args.new,
                            do_sample=False, pad_token_id=pad)
        unbatched_ok.append(h[0, len(ids[i]):len(ids[i]) + len(plain[i].tokens)].tolist() == plain[i].tokens)
    stops = sum(c.finish_reason == "stop" for c in plain)

    med = {k: statistics.median(v) for k, v in times.items()}
    gen = sum(len(c.tokens) for c in plain)
    prompt_tokens = sum(len(x) for x in ids)
    print(f"shared_prefix: default model (12 layers x 128, MTP head), {args.requests} requests, shared prefix "
          f"{len(lm.encode(system))} tokens + suffixes of {min(len(x) for x in ids) - len(lm.encode(system))}-"
          f"{max(len(x) for x in ids) - len(lm.encode(system))} tokens, {args.new} greedy new tokens each, 1 thread, "
          f"medians of {args.repeats}; torch {torch.__version__}; code {code_version()}")
    print(f"HF loaded {type(hf).__name__} from the default folder; tensors it ignored: {ignored or 'none'}")
    print(f"{'variant':40} {'wall s':>8} {'gen tok/s':>10} {'ours/HF':>8}")
    labels = {"cold": "ours cold (empty cache, 1 batch)", "engine cold": "ours engine cold (16 submits at once)",
              "primed": "ours primed (generate(prefix,1)+batch)",
              "warm": "ours warm (prefix cached)", "warm max8": "ours warm, speculative_max_batch=8",
              "warm plain": "ours warm, speculative_tokens=0",
              "HF": "HF batched generate (left pad)"}
    for k in ("cold", "engine cold", "primed", "warm", "warm max8", "warm plain", "HF"):
        print(f"{labels[k]:40} {med[k]:8.3f} {gen / med[k]:10.1f} {med['HF'] / med[k]:7.2f}x")
    print(f"cached prompt tokens per row: cold {[c.stats['cached_tokens'] for c in outs['cold']][:3]}..., engine cold "
          f"{[c.stats['cached_tokens'] for c in outs['engine cold']][:3]}..., primed "
          f"{outs['primed'][0].stats['cached_tokens']}, warm {outs['warm'][0].stats['cached_tokens']} "
          f"(prompts {len(ids[0])}-{width} tokens, {prompt_tokens} in all)")
    print(f"cold pool after the batch: {cold_stats['tree_pages']} tree pages = "
          f"{cold_stats['tree_pages'] * cold_stats['page_size']} cached tokens")
    print(f"mean accepted length (warm, speculative): "
          f"{statistics.mean(c.stats['mean_accepted_length'] for c in outs['warm']):.2f}")
    print(f"tokens: ours speculative == ours plain for all rows (cold, engine cold, primed, warm, warm max8); ours vs "
          f"HF batched: "
          f"{len(plain) - len(differ)}/{len(plain)} rows identical"
          + (f"; the {len(differ)} differing rows vs HF unbatched: {sum(unbatched_ok)} identical" if differ else "")
          + f"; rows that hit EOS: {stops}")
    ps = st["page_size"]
    hf_tokens_held = sum(len(x) + args.new for x in ids)
    print(f"KV held at the batch's peak (primed pool): ours {peak_pages} pages = {peak_pages * ps} tokens "
          f"({tree_before} prefix pages shared + the rows' own pages, page rounding included) vs HF {hf_tokens_held} "
          f"tokens (sum of sequence lengths, no padding): {hf_tokens_held / (peak_pages * ps):.1f}x less KV for ours")
    head = med["HF"] / med["warm"]
    print(f"headline: shared prefix {args.requests} req: ours warm {head:.2f}x HF (speculative_max_batch=8: "
          f"{med['HF'] / med['warm max8']:.2f}x, plain {med['HF'] / med['warm plain']:.2f}x), primed "
          f"{med['HF'] / med['primed']:.2f}x, cold {med['HF'] / med['cold']:.2f}x, engine cold "
          f"{med['HF'] / med['engine cold']:.2f}x (goal >= 5x)")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(8, 4))
    keys = ["HF", "cold", "engine cold", "primed", "warm plain", "warm", "warm max8"]
    ax.bar([labels[k].replace(" (", "\n(").replace(", ", ",\n") for k in keys], [gen / med[k] for k in keys],
           color=["grey", "C0", "C0", "C0", "C1", "C2", "C2"])
    ax.set_ylabel("generated tokens/s (16 x 32, incl. prefill)")
    ax.set_title(f"{args.requests} requests sharing a {len(lm.encode(system))}-token prefix, CPU 1 thread")
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(out / "shared_prefix.png", dpi=110)
    print(f"wrote {out / 'shared_prefix.png'}")


if __name__ == "__main__":
    main()
