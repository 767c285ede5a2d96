"""Full attention of the hybrid Qwen3.5 / Qwen3-Next layers, with HF parameter names: a sigmoid
output gate (q_proj gives ``[q | gate]`` per head), zero-centred q/k norms, RoPE on the first
``rotary_dim`` dims of each head only, and K/V through the paged pool like the dense ``Attention``
(its KV layer is its index among the full-attention layers: the DeltaNet layers keep no KV)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.nn import functional as F

from .checkpoint.config import ModelConfig
from .layers import PreparedModule, fuse_rows
from .norms import ZeroCenteredRMSNorm

if TYPE_CHECKING:
    from .forward_context import LayerContext


class GatedAttention(PreparedModule):
    """``o_proj(attn(q, k, v) * sigmoid(gate))`` (HF ``Qwen3NextAttention`` / ``Qwen3_5Attention``);
    q, gate, k and v from one matmul (row views of one fused weight, see ``fuse_rows``)."""

    def __init__(self, config: ModelConfig, kv_layer: int) -> None:
        super().__init__()
        self.kv_layer = kv_layer
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim, self.rotary_dim = config.head_dim, config.rotary_dim
        d, hd, bias = config.hidden_size, config.head_dim, config.attention_bias
        self.q_proj = nn.Linear(d, 2 * self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, d, bias=bias)
        self.q_norm = ZeroCenteredRMSNorm(hd, config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(hd, config.rms_norm_eps)
        self._prepare()

    def _prepare(self) -> None:
        self.qkv_weight, self.qkv_bias = fuse_rows(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """``x`` ``[B, S, D]`` at the positions of ``ctx`` -> ``[B, S, D]``; writes this
        layer's K/V first."""
        b, s, _ = x.shape
        h, kv, hd, r = self.num_heads, self.num_kv_heads, self.head_dim, self.rotary_dim
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)
        qg = qkv[..., : 2 * h * hd].view(b, s, h, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:].reshape(b, s, h * hd)
        k = qkv[..., 2 * h * hd : (2 * h + kv) * hd].view(b, s, kv, hd)
        v = qkv[..., (2 * h + kv) * hd :].view(b, s, kv, hd)
        # [B, S, H + Hkv, hd]
        qk = torch.cat((self.q_norm.forward(q), self.k_norm.forward(k)), dim=2)
        # RoPE on the first r dims (ctx.sin has its first half negated: rotate_half as a
        # roll), the rest pass
        rot = qk[..., :r]
        rot = rot * ctx.cos + rot.roll(r // 2, -1) * ctx.sin
        qk = torch.cat((rot, qk[..., r:]), dim=-1) if r < hd else rot
        out = ctx.attend(self.kv_layer, qk[:, :, :h], qk[:, :, h:], v)  # [B*S, H, hd]
        out = out.reshape(b, s, h * hd) * torch.sigmoid(gate)
        return F.linear(out, self.o_proj.weight, self.o_proj.bias)
