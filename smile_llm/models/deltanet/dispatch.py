"""One entry point for the gated delta rule: fla's kernels on CUDA when installed, the PyTorch
forms otherwise.

Choice per call (T = window length)::

    output_all_states           PyTorch recurrent, on the tensors' device (fla returns no
                                per-position states; the chunked form's per-position states cost
                                3-5x more on 2-8 positions)
    CUDA tensors and fla        fla fused recurrent when T <= FLA_RECURRENT_MAX_LEN, fla chunked
                                above
    anything else               PyTorch recurrent when T <= RECURRENT_MAX_LEN, chunked above

Every path has the contract of ``recurrent_gated_delta_rule`` (layouts in ``convention``).
"""

from __future__ import annotations

import torch

from .chunked import chunk_gated_delta_rule
from .convention import DeltaRuleOutput
from .fla_kernels import fla_available, fla_chunk_gated_delta_rule, fla_recurrent_gated_delta_rule
from .recurrent import recurrent_gated_delta_rule

# Up to these window lengths the step-by-step form is used. PyTorch on the CPU: the chunked form
# overtakes it from 3-4 positions (Qwen3-Next's 16 key / 32 value heads of 128, float32, 2 cores:
# 1.1 vs 1.2 ms at 3, 1.3 vs 1.1 ms at 4). fla: decode steps and speculative verify windows go to
# the fused recurrent kernel, as vLLM and SGLang do (not measured here).
RECURRENT_MAX_LEN = 3
FLA_RECURRENT_MAX_LEN = 16


def gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, initial_state: torch.Tensor | None = None,
                     output_final_state: bool = False, use_qk_l2norm_in_kernel: bool = False,
                     output_all_states: bool = False) -> DeltaRuleOutput:
    """The gated delta rule over ``[0, T)`` from ``initial_state`` by the form the
    table above picks."""
    seq_len = q.shape[1]
    if q.is_cuda and not output_all_states and fla_available():
        short = seq_len <= FLA_RECURRENT_MAX_LEN
        fla_form = fla_recurrent_gated_delta_rule if short else fla_chunk_gated_delta_rule
        return fla_form(q, k, v, g, beta, initial_state, output_final_state,
                        use_qk_l2norm_in_kernel)
    short = seq_len <= RECURRENT_MAX_LEN or output_all_states
    torch_form = recurrent_gated_delta_rule if short else chunk_gated_delta_rule
    return torch_form(q, k, v, g, beta, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                      output_all_states)
