"""Qwen3-Next's sparse MoE block with a shared expert (HF ``Qwen3NextSparseMoeBlock``, with its
parameter names): a softmax router picks the top ``num_experts_per_tok`` experts per token (their
weights renormalised when ``norm_topk_prob``), each a SwiGLU MLP
(``experts.{i}.gate_proj/up_proj/down_proj``, as checkpoints store them), plus a shared SwiGLU
expert scaled by ``sigmoid(shared_expert_gate(x))``."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .checkpoint.config import ModelConfig
from .layers import MLP


class _Router(nn.Module):
    """``gate.weight`` ``[E, D]``."""

    def __init__(self, num_experts: int, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, dim))


class SparseMoe(nn.Module):
    """``experts(x) + sigmoid(shared_expert_gate(x)) * shared_expert(x)`` over ``[..., D]``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        moe = config.moe
        if moe is None:
            raise ValueError("a SparseMoe layer needs the config's moe settings")
        self.top_k, self.norm_topk_prob = moe.num_experts_per_tok, moe.norm_topk_prob
        self.num_experts = moe.num_experts
        self.gate = _Router(moe.num_experts, config.hidden_size)
        self.experts = nn.ModuleList(MLP(config, moe.moe_intermediate_size)
                                     for _ in range(moe.num_experts))
        self.shared_expert = MLP(config, moe.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(config.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[..., D]`` -> ``[..., D]``; each token through its top-k experts (only the
        experts some token picked run, one matmul pair each) and the gated shared expert."""
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        probs = F.softmax(F.linear(flat, self.gate.weight), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)  # [N, k]
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(flat.dtype)
        out = torch.zeros_like(flat)
        for expert in torch.unique(chosen).tolist():
            token, slot = torch.where(chosen == expert)
            y = self.experts[expert].forward(flat[token]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        shared = (self.shared_expert.forward(flat)
                  * torch.sigmoid(F.linear(flat, self.shared_expert_gate.weight)))
        return (out + shared).reshape(shape)
