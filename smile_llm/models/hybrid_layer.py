"""One decoder layer of the hybrid Qwen3.5 / Qwen3-Next families (HF ``Qwen3NextDecoderLayer``):
zero-centred pre-norms, a token mixer that is either Gated DeltaNet (``linear_attn``) or gated full
attention (``self_attn``), and a SwiGLU MLP or (Qwen3-Next) a sparse MoE with a shared expert."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from .compiled import outside
from .checkpoint.config import ModelConfig
from .checkpoint.hybrid_config import FULL_ATTENTION, LINEAR_ATTENTION
from .family import ModelFamily
from .gated_attention import GatedAttention
from .gated_deltanet import gated_deltanet
from .layers import MLP
from .moe import SparseMoe
from .norms import ZeroCenteredRMSNorm

if TYPE_CHECKING:
    from .forward_context import LayerContext


class HybridDecoderLayer(nn.Module):
    """``x + mixer(input_layernorm(x))``, then ``+ mlp(post_attention_layernorm(x))``. ``kv_layer``
    (full attention) and ``linear_layer`` (DeltaNet) are the layer's index among its kind: its KV
    pool layer or its state slot. ``layer_type`` defaults to ``config.layer_types[layer_idx]`` (the
    MTP head's layers pass full attention)."""

    def __init__(self, config: ModelConfig, layer_idx: int, kv_layer: int, linear_layer: int,
                 layer_type: str | None = None) -> None:
        super().__init__()
        self.is_linear = (layer_type or config.layer_types[layer_idx]) == LINEAR_ATTENTION
        self.input_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(config.hidden_size, config.rms_norm_eps)
        if self.is_linear:
            self.linear_attn = gated_deltanet(config, linear_layer)
        else:
            self.self_attn = GatedAttention(config, kv_layer)
        self.sparse = config.moe is not None and config.moe.is_sparse(layer_idx)
        self.mlp: nn.Module = SparseMoe(config) if self.sparse else MLP(config)

    def forward(self, x: torch.Tensor, ctx: LayerContext) -> torch.Tensor:
        """``x`` ``[B, S, D]`` -> ``[B, S, D]``; advances this layer's state or writes its K/V."""
        h = self.input_layernorm.forward(x)
        # DeltaNet advances per-request state and a sparse MoE runs the experts its tokens picked:
        # both run outside a compiled graph (``compiled.outside``)
        mixed = outside(self.linear_attn, h, ctx) if self.is_linear else \
            self.self_attn.forward(h, ctx)
        # With tensor parallelism both blocks are row-parallel: ctx.reduce sums the ranks'
        # partial outputs.
        x = x + ctx.reduce(mixed)
        h = self.post_attention_layernorm.forward(x)
        mlp = outside(self.mlp, h, ctx, False) if self.sparse else self.mlp.forward(h)
        return x + ctx.reduce(mlp)


def layer_indices(config: ModelConfig) -> list[tuple[int, int]]:
    """Per layer, its (KV layer, linear layer) index: how many full-attention and DeltaNet
    layers precede it."""
    out, kv, linear = [], 0, 0
    for t in config.layer_types:
        out.append((kv, linear))
        if t == LINEAR_ATTENTION:
            linear += 1
        else:
            kv += 1
    return out


def _hybrid_layers(config: ModelConfig) -> list[nn.Module]:
    return [HybridDecoderLayer(config, i, kv, linear)
            for i, (kv, linear) in enumerate(layer_indices(config))]


def _is_hybrid(config: ModelConfig) -> bool:
    return config.is_hybrid


def _mtp_layer(config: ModelConfig, index: int) -> nn.Module:
    """The head's layer ``index``: full (gated) attention over the head's own KV layer ``index``."""
    return HybridDecoderLayer(config, index, index, -1, FULL_ATTENTION)


# Qwen3.5 / Qwen3-Next: Gated DeltaNet and gated-attention layers (MoE where the config says),
# zero-centred norms
HYBRID = ModelFamily("hybrid", matches=_is_hybrid, layers=_hybrid_layers, mtp_layer=_mtp_layer,
                     norm=ZeroCenteredRMSNorm, layer=HybridDecoderLayer)
