"""Attention over a key set split in two parts, computed part by part and merged by log-sum-exp
(FlashInfer's ``merge_state``): ``softmax`` over the union of two disjoint key sets equals each
part's normalised output weighted by ``exp(lse_part - lse_union)``. ``dense_attention`` computes one
part from dense K/V with its log-sum-exp; ``merge_by_lse`` combines two parts (``merge_states`` also
returns the union's LSE)."""

from __future__ import annotations

import torch

LN2 = 0.6931471805599453  # FlashInfer's LSE is base 2: lse_natural = lse_base2 * ln 2
LOG2E = 1.4426950408889634  # and lse_base2 = lse_natural * log2(e)


def dense_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of fp32 ``q`` ``[B, Hkv, G, D]`` (the G query heads of each KV head, or G
    queries) over fp32 ``k``/``v`` ``[B, Hkv, L, D]`` with ``L >= 1``: the normalised output
    ``[B, Hkv, G, D]`` and the natural-log LSE ``[B, Hkv, G, 1]`` of the scaled logits. One fused
    kernel on the CPU; plain matmuls elsewhere."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, scale=scale)
        return out, lse.unsqueeze(-1)
    return _dense_matmuls(q, k, v, scale)


def _dense_matmuls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``dense_attention`` in plain matmuls (any device)."""
    s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)  # [B, Hkv, G, L]
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.matmul(s.sub_(lse).exp_(), v), lse


def merge_by_lse(out0: torch.Tensor, lse0: torch.Tensor, out1: torch.Tensor,
                 lse1: torch.Tensor) -> torch.Tensor:
    """Attention over two disjoint key sets from each one's normalised output and natural-log LSE
    (``[..., 1]``): ``out0 * exp(lse0 - lse) + out1 * exp(lse1 - lse)`` with
    ``lse = logaddexp(lse0, lse1)``; writes into the outputs. A part that saw no key
    (``lse = -inf``) gets weight 0."""
    return merge_states(out0, lse0, out1, lse1)[0]


def merge_states(out0: torch.Tensor, lse0: torch.Tensor, out1: torch.Tensor,
                 lse1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``merge_by_lse`` and the union's natural-log LSE ``logaddexp(lse0, lse1)``, so that a third
    part can be merged in; writes into the outputs. Both parts without a key (both LSEs -inf) give
    NaN: callers that may meet such a query clear it."""
    lse = torch.logaddexp(lse0, lse1)
    return out0.mul_((lse0 - lse).exp_()).add_(out1.mul_((lse1 - lse).exp_())), lse
