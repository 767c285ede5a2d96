"""The zero-centred RMSNorm of the hybrid Qwen3.5 / Qwen3-Next families:
``rms_normalise(x) * (1 + weight)``, all in float32 and cast back at the end (HF's
``Qwen3NextRMSNorm``: the weight is stored centred on zero)."""

from __future__ import annotations

import torch
from torch import nn


class ZeroCenteredRMSNorm(nn.Module):
    """``(x / rms(x)) * (1 + weight)`` over the last dimension, computed in float32 then cast
    to ``x``'s dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` ``[..., dim]``; same shape and dtype."""
        normed = torch.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)
