#!/usr/bin/env python
"""The draft-model drafter on the embedded default model: acceptance and wall-clock speedup over plain decoding.

The draft models are (1) the shipped 2-layer draft model (``DEFAULT_DRAFT_DIR``, trained like the default model on
the same corpus; ``--no-shipped`` leaves it out), (2) the default model itself (``--no-self`` leaves it out): every
draft is the target's own greedy token, an upper bound on acceptance at the target's own cost per draft, and (3)
copies of its first N layers with its final norm and (tied) LM head (``--layers``), written into a temporary
folder: smaller models with the same tokenizer, never trained as such. For every prompt (slices of this Python's standard library sources, ``speculative.stdlib_prompts``), every
draft model and every k in ``--ks``, ``generate`` runs greedily with ``drafter="draft:DIR"`` and plain decoding
(``speculative_tokens=0``) in the same process, interleaved, ``--repeats`` times; every speculative output is
checked equal to the plain one token for token. Reported per draft model and k: tokens per round (accepted drafts +
the bonus), target and draft forwards per generated token, decode tokens/s and the speedup over plain decoding
(median over prompts and repeats of the per-run decode-time ratio). One torch thread.

    .venv/bin/python benchmarks/draft_model.py
    .venv/bin/python benchmarks/draft_model.py --quick
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402
from speculative import stdlib_prompts  # noqa: E402


def first_layers_copy(src: Path, layers: int, dst: Path) -> Path:
    """Write ``src``'s first ``layers`` decoder layers, embeddings, final norm and LM head (no MTP head) as a
    checkpoint in ``dst``, with its tokenizer files; returns ``dst``."""
    from safetensors.torch import load_file, save_file

    cfg = json.loads((src / "config.json").read_text())
    cfg.update(num_hidden_layers=layers, max_window_layers=layers, mtp_num_hidden_layers=0)
    cfg.pop("speculative_config", None)
    kept = {name: t for name, t in load_file(str(src / "model.safetensors")).items()
            if not name.startswith("mtp.")
            and not (name.startswith("model.layers.") and int(name.split(".")[2]) >= layers)}
    dst.mkdir(parents=True, exist_ok=True)
    (dst / "config.json").write_text(json.dumps(cfg))
    save_file(kept, str(dst / "model.safetensors"))
    for f in src.iterdir():
        if "tokenizer" in f.name:
            shutil.copy(f, dst / f.name)
    return dst


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ks", default="2,3,4")
    p.add_argument("--layers", default="4,8", help="first-N-layer copies to draft with (empty: none)")
    p.add_argument("--no-self", action="store_true", help="leave out the default model drafting for itself")
    p.add_argument("--no-shipped", action="store_true", help="leave out the shipped 2-layer draft model")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--prompt-bytes", type=int, default=300)
    p.add_argument("--new", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true",
                   help="2 prompts, 60 tokens, 1 repeat, k = 3, the shipped draft model and the 8-layer copy")
    args = p.parse_args()
    if args.quick:
        args.prompts, args.new, args.repeats, args.ks, args.layers, args.no_self = 2, 60, 1, "3", "8", True
    from smile_llm import LanguageModel
    from smile_llm.models.shipped import DEFAULT_DRAFT_DIR, DEFAULT_MODEL_DIR

    torch.set_num_threads(1)
    ks = [int(k) for k in args.ks.split(",")]
    prompts = stdlib_prompts(args.prompts, args.prompt_bytes)
    seq_len = args.prompt_bytes + args.new + 64
    work = Path(tempfile.mkdtemp(prefix="draft_model_bench_"))
    drafts = {} if args.no_shipped else {"the shipped draft model (2 layers, trained)": DEFAULT_DRAFT_DIR}
    if not args.no_self:
        drafts["the default model itself (12 layers)"] = DEFAULT_MODEL_DIR
    for n in [int(x) for x in args.layers.split(",") if x]:
        drafts[f"its first {n} layers"] = first_layers_copy(DEFAULT_MODEL_DIR, n, work / f"first_{n}")
    plain_lm = LanguageModel.default(max_batch_size=1, max_seq_len=seq_len, drafter=None)
    models = {name: LanguageModel.default(max_batch_size=1, max_seq_len=seq_len, drafter=f"draft:{path}")
              for name, path in drafts.items()}
    for lm in [plain_lm, *models.values()]:
        lm.generate(prompts[0], 20)  # warm-up
    cases = [(name, k) for name in models for k in ks]
    ratios: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    tps: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    totals = {c: {"rounds": 0, "round_tokens": 0, "forwards": 0, "drafts": 0, "tokens": 0} for c in cases}
    plain_tps: list[float] = []
    for rep in range(args.repeats):
        for i, prompt in enumerate(prompts):
            plain = plain_lm.generate(prompt, args.new, speculative_tokens=0)
            plain_tps.append(plain.stats["tokens_per_s"])
            for name, lm in models.items():
                for k in ks:
                    c = lm.generate(prompt, args.new, speculative_tokens=k)
                    assert c.tokens == plain.tokens, f"{name} k={k} prompt {i}: differs from plain greedy"
                    s, t = c.stats, totals[(name, k)]
                    ratios[(name, k)].append(plain.stats["decode_s"] / s["decode_s"])
                    tps[(name, k)].append(s["tokens_per_s"])
                    t["rounds"] += s["speculative_rounds"]
                    t["round_tokens"] += sum(n * r for n, r in s["accept_length_histogram"].items())
                    t["forwards"] += round(s["target_forwards_per_token"] * (len(c.tokens) - 1))  # decode only
                    t["drafts"] += s["proposed_drafts"]  # one draft forward per draft
                    t["tokens"] += len(c.tokens) - 1  # the prefill produced the first token
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    for lm in [plain_lm, *models.values()]:
        lm.close()
    shutil.rmtree(work, ignore_errors=True)

    head = (f"draft_model: default model (12 layers x 128) as target, {len(prompts)} stdlib prompts of "
            f"{args.prompt_bytes} bytes, {args.new} new tokens, greedy, 1 thread, {args.repeats} repeats; "
            f"torch {torch.__version__}; code {code_version()}")
    lines = [head, "", f"plain decoding: {statistics.median(plain_tps):.1f} tokens/s (median)", "",
             "| draft model | k | tokens / round | target forwards / token | draft forwards / token | tokens/s | "
             "speedup vs plain | outputs equal |", "|---|---|---|---|---|---|---|---|"]
    rows = []
    for case in cases:
        t = totals[case]
        per_round = t["round_tokens"] / max(t["rounds"], 1)
        speedup = statistics.median(ratios[case])
        rows.append((case, per_round, speedup))
        lines.append(f"| {case[0]} | {case[1]} | {per_round:.2f} | {t['forwards'] / max(t['tokens'], 1):.3f} | "
                     f"{t['drafts'] / max(t['tokens'], 1):.3f} | {statistics.median(tps[case]):.1f} | "
                     f"{speedup:.2f}x | yes |")
    print("\n".join(lines))
    best = max(rows, key=lambda r: r[2])
    top = max(rows, key=lambda r: r[1])
    print(f"headline: draft-model drafter best {best[2]:.2f}x plain decode ({best[0][0]}, k={best[0][1]}, "
          f"{best[1]:.2f} tokens/round); most accepted: {top[0][0]} k={top[0][1]} {top[1]:.2f} tokens/round; "
          f"outputs identical")


if __name__ == "__main__":
    main()
