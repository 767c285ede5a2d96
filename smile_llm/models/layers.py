"""Decoder-layer building blocks with Hugging Face module names (so weights load by name): RMSNorm,
rotary embedding, paged attention through the KV pool, SwiGLU MLP, and the decoder layer."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.nn import functional as F

from .checkpoint.config import ModelConfig, RopeScaling
from .family import ModelFamily

if TYPE_CHECKING:
    from .forward_context import LayerContext


class PreparedModule(nn.Module):
    """A module whose ``forward`` reads tensors derived from its parameters (fused weights), made by
    ``_prepare`` at construction and again after every ``.to()`` (``_apply``), which gives
    parameters new tensors. The derived tensors share the parameters' storage, so loading by name
    (``copy_``) needs no ``_prepare``."""

    def _prepare(self) -> None:
        """Derive the tensors ``forward`` reads from the parameters (subclasses;
        nothing by default)."""

    def _apply(self, fn: Any, recurse: bool = True) -> PreparedModule:
        super()._apply(fn, recurse)
        self._prepare()
        return self


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32 like HF."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """RMS-normalise ``x`` over its last dimension (in float32) and scale by ``weight``; same
        shape and dtype as ``x``."""
        # one fused kernel, same math
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return torch.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """float32 ``[head_dim / 2]`` inverse frequencies, with Llama-3 scaling when
    configured (HF's formula)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    if scaling is None:
        return inv_freq
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor
                                                              - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def fuse_rows(*linears: nn.Linear) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) whose row blocks *are* the parameters of ``linears`` (same
    ``in_features``): each linear's ``weight``/``bias`` is re-pointed at a view of it, so loading by
    name (``copy_``) fills the fused tensor and one matmul computes every output. The views share
    memory: clone them before saving with safetensors."""
    with torch.no_grad():
        weight = torch.cat([lin.weight for lin in linears])
        biases = [lin.bias for lin in linears]
        bias = (torch.cat([b for b in biases if b is not None])
                if all(b is not None for b in biases) else None)
    row = 0
    for lin in linears:
        n = lin.out_features
        lin.weight = nn.Parameter(weight[row : row + n], requires_grad=lin.weight.requires_grad)
        if bias is not None and lin.bias is not None:
            lin.bias = nn.Parameter(bias[row : row + n], requires_grad=lin.bias.requires_grad)
        row += n
    return weight, bias


class Attention(PreparedModule):
    """Self-attention with HF parameter names (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``;
    ``q_norm``/``k_norm`` for Qwen3), GQA, RoPE, K/V written through the forward's KV-step handle
    (``ForwardContext.attend``) and attention through the backend over the step CSR.

    q, k and v come from one matmul: their weights are row views of one fused tensor (``fuse_rows``,
    redone after any ``.to()``, see ``PreparedModule``). The q/k norms run as one normalisation over
    all heads, and RoPE once over q and k together."""

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
        self._prepare()

    def _prepare(self) -> None:
        self.qkv_weight, self.qkv_bias = fuse_rows(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """``x`` ``[B, S, D]`` at the positions of ``ctx`` -> ``[B, S, D]``; writes this layer's K/V
        of the S positions into the pool first."""
        b, s, _ = x.shape  # [B, S, D]
        h, kv, hd = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias).view(b, s, h + 2 * kv, hd)
        qk, v = qkv[:, :, : h + kv], qkv[:, :, h + kv :]
        # HF's per-head RMSNorm, all heads at once
        if self.q_norm is not None and self.k_norm is not None:
            w = torch.cat((self.q_norm.weight.expand(h, hd), self.k_norm.weight.expand(kv, hd)))
            qk = torch.rms_norm(qk, (hd,), None, self.q_norm.eps) * w
        # RoPE: q * cos + rotate_half(q) * sin, with rotate_half as a roll (ctx.sin has its
        # first half negated)
        qk = qk * ctx.cos + qk.roll(hd // 2, -1) * ctx.sin
        out = ctx.attend(self.layer_idx, qk[:, :, :h], qk[:, :, h:], v)  # [B*S, H, head_dim]
        return F.linear(out.reshape(b, s, h * hd), self.o_proj.weight)


class MLP(PreparedModule):
    """The SwiGLU feed-forward block: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, gate and up in
    one matmul (their weights are row views of one fused tensor, as in ``Attention``)."""

    def __init__(self, config: ModelConfig, intermediate_size: int | None = None) -> None:
        super().__init__()
        d, inner = config.hidden_size, intermediate_size or config.intermediate_size
        self.gate_proj = nn.Linear(d, inner, bias=False)
        self.up_proj = nn.Linear(d, inner, bias=False)
        self.down_proj = nn.Linear(inner, d, bias=False)
        self.inner = inner
        self._prepare()

    def _prepare(self) -> None:
        self.gate_up_weight, _ = fuse_rows(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., D]`` -> ``[..., D]``."""
        gate, up = F.linear(x, self.gate_up_weight).split(self.inner, dim=-1)
        return F.linear(F.silu(gate) * up, self.down_proj.weight)


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer: ``x + self_attn(input_layernorm(x))``, then
    ``+ mlp(post_attention_layernorm(x))``.
    """

    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """``x`` ``[B, S, D]`` -> ``[B, S, D]``; writes this layer's K/V of the
        window into the pool."""
        # The blocks' forward is called directly: no hooks are used, and Module.__call__ costs ~2 us
        # a call on the CPU, as much as a small kernel.
        # With tensor parallelism both blocks are row-parallel: ctx.reduce sums the ranks'
        # partial outputs.
        x = x + ctx.reduce(self.self_attn.forward(self.input_layernorm.forward(x), ctx))
        return x + ctx.reduce(self.mlp.forward(self.post_attention_layernorm.forward(x)))


def _dense_layers(config: ModelConfig) -> list[nn.Module]:
    return [DecoderLayer(config, i) for i in range(config.num_hidden_layers)]


def _dense_layer(config: ModelConfig, index: int, kv_layer: int, linear_layer: int) -> nn.Module:
    return DecoderLayer(config, kv_layer)  # every layer attends: its KV layer is its own


def _every_config(config: ModelConfig) -> bool:
    return True


# Llama, Qwen2, Qwen3 and their kin: pre-norm attention + SwiGLU layers; the MTP head's layers
# are the same kind
DENSE = ModelFamily("dense", matches=_every_config, layers=_dense_layers, mtp_layer=DecoderLayer,
                    norm=RMSNorm, layer=_dense_layer)
