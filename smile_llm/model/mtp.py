"""The MTP (multi-token prediction) draft head, Qwen3-Next style, with HF names under ``mtp.``.

For position t it combines the embedding of token t+1 with the main model's last hidden state at t (before the
final norm): ``x = fc(cat(pre_fc_norm_embedding(embed(token[t+1])), pre_fc_norm_hidden(h[t])))``, runs its own
decoder layer(s), applies ``norm`` and the shared LM head to predict token t+2. It shares ``embed_tokens`` and
``lm_head`` with the main model.
"""

from __future__ import annotations

from torch import nn

from .config import ModelConfig
from .layers import DecoderLayer, RMSNorm


class MtpHead(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.pre_fc_norm_embedding = RMSNorm(d, config.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(d, config.rms_norm_eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.mtp_num_hidden_layers))
        self.norm = RMSNorm(d, config.rms_norm_eps)
