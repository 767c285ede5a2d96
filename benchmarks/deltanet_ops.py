#!/usr/bin/env python
"""Prefill time of the gated delta rule on the CPU: the chunked form against the step-by-step recurrent form.

One Gated DeltaNet layer's core with Qwen3-Next's head layout (16 query/key heads, 32 value heads, head dims 128,
float32, batch 1, in-kernel L2 normalisation, an initial state, the final state returned) over prompts of 256 and
1024 tokens; transformers' ``torch_chunk_gated_delta_rule`` on the same inputs as a peer when it imports. The forms
are timed in alternation, one run of each per round, and each figure is the median of ``--repeats`` rounds, so the
ratios come from the same moments of a noisy machine. The outputs are checked to agree first.

    .venv/bin/python benchmarks/deltanet_ops.py             # about 30 s on 2 cores
    .venv/bin/python benchmarks/deltanet_ops.py --quick
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from smile_llm.models.deltanet import chunk_gated_delta_rule, recurrent_gated_delta_rule

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_env import code_version  # noqa: E402

NUM_K_HEADS, NUM_V_HEADS, HEAD_DIM = 16, 32, 128


def inputs(seq_len: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seq_len)
    q = torch.randn(1, seq_len, NUM_K_HEADS, HEAD_DIM, generator=gen)
    k = torch.randn(1, seq_len, NUM_K_HEADS, HEAD_DIM, generator=gen)
    v = torch.randn(1, seq_len, NUM_V_HEADS, HEAD_DIM, generator=gen)
    g = -torch.nn.functional.softplus(torch.randn(1, seq_len, NUM_V_HEADS, generator=gen))
    beta = torch.rand(1, seq_len, NUM_V_HEADS, generator=gen)
    state = torch.randn(1, NUM_V_HEADS, HEAD_DIM, HEAD_DIM, generator=gen) * 0.1
    return q, k, v, g, beta, state


def hf_chunk() -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]] | None:
    try:
        from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule
    except ImportError:
        return None
    return torch_chunk_gated_delta_rule  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    hf = hf_chunk()
    forms: dict[str, Callable[..., torch.Tensor]] = {
        "recurrent": lambda q, k, v, g, beta, state: recurrent_gated_delta_rule(
            q, k, v, g, beta, state, output_final_state=True, use_qk_l2norm_in_kernel=True).output,
        "chunked": lambda q, k, v, g, beta, state: chunk_gated_delta_rule(
            q, k, v, g, beta, state, output_final_state=True, use_qk_l2norm_in_kernel=True).output,
    }
    if hf is not None:
        forms["HF chunked"] = lambda q, k, v, g, beta, state: hf(
            q, k, v, g=g, beta=beta, initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)[0]
    print(f"gated delta rule, CPU float32, HK={NUM_K_HEADS} HV={NUM_V_HEADS} D={HEAD_DIM}, batch 1; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads, code {code_version()}; "
          f"medians of {repeats} alternating rounds")
    print(f"{'T':>6s}  " + "  ".join(f"{name:>12s}" for name in forms) + "  recurrent/chunked")
    ms: dict[str, float] = {}
    for seq_len in args.lengths:
        x = inputs(seq_len)
        outputs = {name: form(*x) for name, form in forms.items()}  # warm-up, and the agreement check
        for name, out in outputs.items():
            err = (out - outputs["recurrent"]).abs().max().item()
            assert err <= 1e-4 * outputs["recurrent"].abs().max().item(), f"{name} disagrees: {err:.3g}"
        times: dict[str, list[float]] = {name: [] for name in forms}
        for _ in range(repeats):
            for name, form in forms.items():
                t0 = time.perf_counter()
                form(*x)
                times[name].append(time.perf_counter() - t0)
        ms = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        print(f"{seq_len:6d}  " + "  ".join(f"{ms[name]:9.1f} ms" for name in forms)
              + f"  {ms['recurrent'] / ms['chunked']:8.2f}x")
    vs_hf = f", {ms['HF chunked'] / ms['chunked']:.2f}x transformers' chunked form" if "HF chunked" in ms else ""
    print(f"headline: gated delta rule at T={args.lengths[-1]}: chunked {ms['recurrent'] / ms['chunked']:.2f}x the "
          f"step-by-step form{vs_hf}")


if __name__ == "__main__":
    main()
