"""The MTP (multi-token prediction) draft head, Qwen3-Next style, with HF names under ``mtp.``.

MTP position t combines the embedding of token t+1 with the main model's last hidden state at t
(before the final norm):
``x = fc(cat(pre_fc_norm_embedding(embed(token[t+1])), pre_fc_norm_hidden(h[t])))``, runs its own
decoder layer(s) with causal attention over the MTP positions held in its own KV pool, then ``norm``
and the shared LM head predict token t+2. For a chained draft the head's own output ``x`` (before
``norm``) is the next hidden input, as the shipped model was trained. ``embed_tokens`` and
``lm_head`` are the main model's.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .checkpoint.config import ModelConfig
from .families import family_of
from .forward_context import LayerContext


class MtpHead(nn.Module):
    """The MTP draft head with HF names under ``mtp.``: ``pre_fc_norm_embedding``,
    ``pre_fc_norm_hidden``, ``fc`` ``[D, 2D]``, ``layers.N`` (decoder layers) and ``norm``; shares
    the main model's embedding and LM head. Its layers and norms are its family's
    (``ModelFamily.mtp_layer``, ``norm``): in the hybrid families full-attention
    ``HybridDecoderLayer``s (gated attention; Qwen3-Next's MoE) and zero-centred norms."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d, eps, n = config.hidden_size, config.rms_norm_eps, config.mtp_num_hidden_layers
        family = family_of(config)
        norm = family.norm
        self.pre_fc_norm_embedding: nn.Module = norm(d, eps)
        self.pre_fc_norm_hidden: nn.Module = norm(d, eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList(family.mtp_layer(config, i) for i in range(n))
        self.norm: nn.Module = norm(d, eps)

    def forward(self, embedded: torch.Tensor, hidden: torch.Tensor,
                ctx: LayerContext) -> torch.Tensor:
        """``embedded`` (embeddings of the next tokens) and ``hidden`` ``[B, S, D]`` -> the
        head's output ``x`` ``[B, S, D]`` before ``norm``. Writes the S positions of ``ctx`` into
        the MTP pool's layers."""
        x = F.linear(torch.cat([self.pre_fc_norm_embedding.forward(embedded),
                                self.pre_fc_norm_hidden.forward(hidden.to(embedded.dtype))],
                               dim=-1), self.fc.weight)
        for layer in self.layers:
            x = layer.forward(x, ctx)
        return x
