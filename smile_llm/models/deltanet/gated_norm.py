"""The gated RMSNorm after the DeltaNet core (HF's ``Qwen3NextRMSNormGated``, identical
in ``qwen3_5``).

``weight * rmsnorm(x) * silu(gate)`` over the last dimension (the value head dim). The weight is
plain, initialised to ones: unlike the zero-centred ``1 + w`` of the other Qwen3.5 / Qwen3-Next
RMSNorms, this one is not shifted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gated_rms_norm(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor,
                   eps: float = 1e-6) -> torch.Tensor:
    """HF's rounding, step for step: normalise in float32, round to x's dtype, multiply by
    ``weight`` (in the promoted dtype of the two), multiply by ``silu(gate)`` computed in float32,
    return in x's dtype.

    x, gate: [..., D] (same shape); weight: [D]. Pure: returns a new tensor.
    """
    if gate.shape != x.shape or weight.shape != x.shape[-1:]:
        raise ValueError(f"x and gate must be [..., D] alike and weight [D]: x {tuple(x.shape)}, "
                         f"gate {tuple(gate.shape)}, weight {tuple(weight.shape)}")
    x32 = x.to(torch.float32)
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * normed * F.silu(gate.to(torch.float32))).to(x.dtype)
