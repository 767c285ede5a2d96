#!/usr/bin/env python
"""MTP speculative decoding on the embedded default model: acceptance and wall-clock speedup over plain decoding.

For every prompt (slices of this Python's own standard library sources, which the default model was trained on)
and every k in ``--ks``, ``generate`` runs greedily with ``speculative_tokens=k`` and with plain decoding
(``speculative_tokens=0``) in the same process, interleaved, ``--repeats`` times. Every speculative output is
checked equal to the plain one token for token. Reported per k: mean accepted length (tokens per round: accepted
drafts + the bonus), target forwards per generated token, for each draft KV mode (history, per-round), the acceptance-length histogram, decode tokens/s and the
speedup over plain decoding (median over prompts and repeats of the per-run decode-time ratio). Writes
``speculative.md`` and ``speculative.png`` under ``--out``. One torch thread.

    .venv/bin/python benchmarks/speculative.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402

MODULES = ["argparse.py", "textwrap.py", "string.py", "shutil.py", "csv.py", "dataclasses.py", "json/encoder.py",
           "collections/__init__.py", "logging/__init__.py", "enum.py", "functools.py", "pathlib.py"]


def stdlib_prompts(count: int, length: int) -> list[str]:
    """``length`` bytes of source starting at a line boundary near the middle of ``count`` stdlib modules."""
    root = Path(os.__file__).parent
    out = []
    for name in MODULES:
        path = root / name
        if not path.exists():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        start = text.find("\n", len(text) // 2) + 1
        out.append(text[start : start + length])
        if len(out) == count:
            break
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ks", default="1,2,3,4")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--prompt-bytes", type=int, default=300)
    p.add_argument("--new", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--draft-kv", default="history,per_round", help="draft KV modes to compare")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args()
    from smile_llm import LanguageModel

    torch.set_num_threads(1)
    ks = [int(k) for k in args.ks.split(",")]
    modes = args.draft_kv.split(",")
    prompts = stdlib_prompts(args.prompts, args.prompt_bytes)
    models = {m: LanguageModel.default(max_batch_size=1, max_seq_len=args.prompt_bytes + args.new + 64, draft_kv=m)
              for m in modes}
    for lm in models.values():
        lm.generate(prompts[0], 20)  # warm-up
    cases = [(m, k) for m in modes for k in ks]
    ratios: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    tps: dict[tuple[str, int], list[float]] = {c: [] for c in cases}
    plain_tps: list[float] = []
    hist: dict[tuple[str, int], Counter[int]] = {c: Counter() for c in cases}
    rounds = {c: 0 for c in cases}
    forwards = {c: 0 for c in cases}
    tokens = {c: 0 for c in cases}
    for rep in range(args.repeats):
        for i, prompt in enumerate(prompts):
            for mode, lm in models.items():
                plain = lm.generate(prompt, args.new, speculative_tokens=0)
                plain_tps.append(plain.stats["tokens_per_s"])
                for k in ks:
                    c = lm.generate(prompt, args.new, speculative_tokens=k)
                    assert c.tokens == plain.tokens, f"{mode} k={k} prompt {i}: differs from plain greedy"
                    case = (mode, k)
                    ratios[case].append(plain.stats["decode_s"] / c.stats["decode_s"])
                    tps[case].append(c.stats["tokens_per_s"])
                    hist[case].update(c.stats["accept_length_histogram"])
                    rounds[case] += c.stats["speculative_rounds"]
                    forwards[case] += c.stats["forwards"] - 1  # the prefill forward produced the first token
                    tokens[case] += len(c.tokens) - 1
        print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    rows = []
    for case in cases:
        mean_len = sum(n * c for n, c in hist[case].items()) / max(rounds[case], 1)
        rows.append((case, mean_len, forwards[case] / max(tokens[case], 1), statistics.median(tps[case]),
                     statistics.median(ratios[case]), dict(sorted(hist[case].items()))))
    head = (f"speculative: default model (12 layers x 128, 1-layer MTP head), {len(prompts)} stdlib prompts of "
            f"{args.prompt_bytes} bytes, {args.new} new tokens, greedy, 1 thread, {args.repeats} repeats; "
            f"torch {torch.__version__}; code {code_version()}")
    lines = [head, "", f"plain decoding: {statistics.median(plain_tps):.1f} tokens/s (median)", "",
             "| draft KV | k | mean accepted length | target forwards / token | tokens/s | speedup vs plain | "
             "outputs equal | accept-length histogram |", "|---|---|---|---|---|---|---|---|"]
    for (mode, k), mean_len, fpt, t, r, h in rows:
        lines.append(f"| {mode} | {k} | {mean_len:.2f} | {fpt:.3f} | {t:.1f} | {r:.2f}x | yes | {h} |")
    report = "\n".join(lines)
    print(report)
    best = max(rows, key=lambda r: r[4])
    print(f"headline: MTP speculative {best[4]:.2f}x plain decode (best: {best[0][0]} k={best[0][1]}, mean accepted "
          f"length {best[1]:.2f}); outputs identical")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speculative.md").write_text(report + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (pip install matplotlib)", file=sys.stderr)
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    main = modes[0]
    width = 0.8 / len(ks)
    for j, k in enumerate(ks):
        total = max(sum(hist[(main, k)].values()), 1)
        xs = list(range(1, k + 2))
        a.bar([x + (j - len(ks) / 2 + 0.5) * width for x in xs], [hist[(main, k)].get(x, 0) / total for x in xs],
              width=width, label=f"k={k}")
    a.set_xlabel("tokens per round (accepted drafts + bonus)")
    a.set_ylabel("fraction of rounds")
    a.set_title(f"acceptance-length histogram ({main} draft KV)")
    a.legend()
    for mode in modes:
        b.plot(ks, [r[4] for r in rows if r[0][0] == mode], "o-", label=f"speedup vs plain ({mode})")
        b.plot(ks, [r[1] for r in rows if r[0][0] == mode], "s--", label=f"mean accepted length ({mode})")
    b.axhline(1.0, color="grey", lw=0.8)
    b.set_xlabel("drafts per round (k)")
    b.set_xticks(ks)
    b.set_title("default model, greedy, CPU 1 thread")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "speculative.png", dpi=110)
    print(f"wrote {out / 'speculative.md'} and {out / 'speculative.png'}")


if __name__ == "__main__":
    main()
