"""fla-core's Triton kernels for the gated delta rule (CUDA), behind the convention
of ``convention``.

fla is imported inside the functions, never when this module is:
``import smile_llm.models.deltanet`` works on machines without it (``pip install fla-core``; the
``gpu`` extra). Query/key heads are repeated to the value heads here rather than relying on fla's
grouped-value support, and the state is handed over as float32, so the results mean exactly what the
PyTorch forms' do.

fla API used (fla-core 0.6)::

    fla.ops.gated_delta_rule.chunk_gated_delta_rule(q, k, v, g, beta, scale=, initial_state=,
        output_final_state=, use_qk_l2norm_in_kernel=)
        -> (o [B, T, HV, DV], final_state float32[B, HV, DK, DV] | None)
    fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule(q, k, v, g=, beta=, scale=,
        initial_state=, output_final_state=, use_qk_l2norm_in_kernel=)   -> the same
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from .convention import DeltaRuleOutput, check_shapes

INSTALL_HINT = ("fla-core is not installed: pip install fla-core (CUDA only; the PyTorch forms "
                "run everywhere)")


@functools.lru_cache(maxsize=1)
def fla_available() -> bool:
    """Whether ``fla.ops.gated_delta_rule`` imports (checked once; False without CUDA
    torch or triton)."""
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:  # ImportError, or triton failing to initialise without a driver
        return False
    return True


def fla_chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, initial_state: torch.Tensor | None = None,
                               output_final_state: bool = False,
                               use_qk_l2norm_in_kernel: bool = False) -> DeltaRuleOutput:
    """fla's chunked kernel (prefill); raises ``ImportError`` with an install hint without fla."""
    require_fla()
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return _call(chunk_gated_delta_rule, q, k, v, g, beta, initial_state, output_final_state,
                 use_qk_l2norm_in_kernel)


def fla_recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                   g: torch.Tensor, beta: torch.Tensor,
                                   initial_state: torch.Tensor | None = None,
                                   output_final_state: bool = False,
                                   use_qk_l2norm_in_kernel: bool = False) -> DeltaRuleOutput:
    """fla's fused recurrent kernel (decode, short windows); raises ``ImportError`` with an install
    hint without fla."""
    require_fla()
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

    return _call(fused_recurrent_gated_delta_rule, q, k, v, g, beta, initial_state,
                 output_final_state, use_qk_l2norm_in_kernel)


def _call(kernel: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
          beta: torch.Tensor, initial_state: torch.Tensor | None, output_final_state: bool,
          use_qk_l2norm_in_kernel: bool) -> DeltaRuleOutput:
    check_shapes(q, k, v, g, beta, initial_state)
    group = v.shape[2] // k.shape[2]
    if group > 1:
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    state = None if initial_state is None else initial_state.to(torch.float32).contiguous()
    out, final_state = kernel(q.contiguous(), k.contiguous(), v.contiguous(), g=g.contiguous(),
                              beta=beta.contiguous(), scale=q.shape[-1] ** -0.5,
                              initial_state=state, output_final_state=output_final_state,
                              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)
    return DeltaRuleOutput(out.to(q.dtype), final_state if output_final_state else None, None)


def require_fla() -> None:
    """Raises ``ImportError`` with the install hint when fla does not import."""
    if not fla_available():
        raise ImportError(INSTALL_HINT)
