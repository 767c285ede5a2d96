"""Decoder building blocks with Hugging Face module names (so weights load by name): RMSNorm, rotary embedding,
paged attention through the KV pool, SwiGLU MLP, and the decoder layer."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from .config import ModelConfig, RopeScaling

if TYPE_CHECKING:
    from .context import ForwardContext


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32 like HF."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMS-normalise ``x`` over its last dimension (in float32) and scale by ``weight``; same shape and dtype as
        ``x``."""
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:  # one fused kernel, same math
            return nn.functional.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """float32 ``[head_dim / 2]`` inverse frequencies, with Llama-3 scaling when configured (HF's formula)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """``cat(-x2, x1)`` of the two halves of the last dimension (HF's RoPE helper)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    """Self-attention with HF parameter names (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``; ``q_norm``/``k_norm`` for
    Qwen3), GQA, RoPE, K/V written through ``pool.put`` and attention through the backend over the step CSR."""

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = config.head_dim
        d, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(d, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(d, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, d, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``x`` ``[B, S, D]`` at the positions of ``ctx`` -> ``[B, S, D]``; writes this layer's K/V of the S positions
        into the pool first."""
        b, s, _ = x.shape  # [B, S, D]
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(b, s, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, s, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = ctx.cos, ctx.sin  # [B, S, 1, head_dim]
        q = (q * cos + rotate_half(q) * sin).to(x.dtype)
        k = (k * cos + rotate_half(k) * sin).to(x.dtype)
        out = ctx.attend(self.layer_idx, q, k, v)  # [B*S, H, head_dim]
        return self.o_proj(out.reshape(b, s, self.num_heads * self.head_dim))


class MLP(nn.Module):
    """The SwiGLU feed-forward block: ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, inner = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., D]`` -> ``[..., D]``."""
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer: ``x + self_attn(input_layernorm(x))``, then ``+ mlp(post_attention_layernorm(x))``.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``x`` ``[B, S, D]`` -> ``[B, S, D]``; writes this layer's K/V of the window into the pool."""
        x = x + self.self_attn(self.input_layernorm(x), ctx)
        return x + self.mlp(self.post_attention_layernorm(x))
