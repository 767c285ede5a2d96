"""Training modules of the small hybrid model (``scripts/train_default_model.py --arch hybrid``).

A byte-level Qwen3.5 text model (Hugging Face ``Qwen3_5ForCausalLM`` names, ``model_type`` ``qwen3_5_text``): Gated
DeltaNet layers and gated full-attention layers (3 to 1), zero-centred RMSNorms, partial rotary embedding, tied
embeddings, and a 1-layer MTP head (a gated full-attention layer, under ``mtp.*``). Written for autograd on the CPU:
the gated delta rule is a chunked form with no in-place updates. ``forward_main`` and ``forward_mtp`` have the
dense trainer's contract, so the training loop, evaluation and MTP agreement are shared.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

LINEAR, FULL = "linear_attention", "full_attention"


class ZeroCenteredRMSNorm(nn.Module):
    """``rms_normalise(x) * (1 + weight)`` in float32 (the weight is stored centred on zero)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim))
        self.eps = eps

    def forward(self, x):
        normed = torch.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


def l2norm(x, eps: float = 1e-6):
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def chunked_delta_rule(q, k, v, g, beta, chunk: int = 64):
    """The gated delta rule from a zero state, differentiable: q, k ``[B, T, Hk, dk]``, v ``[B, T, Hv, dv]``, g
    (log decay) and beta ``[B, T, Hv]`` -> ``[B, T, Hv, dv]`` (float32). q and k are L2-normalised here and q is
    scaled by ``dk ** -0.5`` (the kernels' ``use_qk_l2norm_in_kernel``); consecutive value heads share a key head."""
    b, t, hk, dk = k.shape
    hv, dv = v.shape[2], v.shape[3]
    if hv != hk:
        q, k = q.repeat_interleave(hv // hk, dim=2), k.repeat_interleave(hv // hk, dim=2)
    q, k, v, g, beta = (x.transpose(1, 2).float() for x in (q, k, v, g, beta))  # head-major
    q, k = l2norm(q) * dk ** -0.5, l2norm(k)
    pad = -t % chunk
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (t + pad) // chunk
    q, k, v = (x.reshape(b, hv, n, chunk, -1) for x in (q, k, v))
    g, beta = g.reshape(b, hv, n, chunk), beta.reshape(b, hv, n, chunk)
    cum = g.cumsum(-1)
    causal = torch.ones(chunk, chunk, dtype=torch.bool).tril()
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    eye = torch.eye(chunk).expand(b, hv, n, chunk, chunk)
    system = eye + (beta[..., None] * (k @ k.transpose(-1, -2)) * decay).tril(-1)
    inverse = torch.linalg.solve_triangular(system, eye, upper=False, unitriangular=True)
    u_v = inverse @ (v * beta[..., None])
    u_k = inverse @ (k * (beta * cum.exp())[..., None])
    scores = (q @ k.transpose(-1, -2)) * decay
    q_read = q * cum.exp()[..., None]
    k_write = k * (cum[..., -1:] - cum).exp()[..., None]
    state = q.new_zeros(b, hv, dk, dv)
    outs = []
    for i in range(n):
        u = u_v[:, :, i] - u_k[:, :, i] @ state
        outs.append(scores[:, :, i] @ u + q_read[:, :, i] @ state)
        state = cum[:, :, i, -1].exp()[..., None, None] * state + k_write[:, :, i].transpose(-1, -2) @ u
    out = torch.cat(outs, dim=2)[:, :, :t]
    return out.transpose(1, 2)


class GatedDeltaNet(nn.Module):
    """Qwen3.5's DeltaNet mixer: ``in_proj_qkv`` -> causal conv + SiLU -> q, k, v; ``in_proj_b`` -> beta,
    ``in_proj_a`` -> decay; the delta rule; gated RMSNorm with ``in_proj_z``; ``out_proj``."""

    def __init__(self, cfg):
        super().__init__()
        d = cfg["hidden_size"]
        self.hk, self.hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        self.dk, self.dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
        self.kernel = cfg["linear_conv_kernel_dim"]
        self.eps = cfg["rms_norm_eps"]
        conv_dim = 2 * self.hk * self.dk + self.hv * self.dv
        self.in_proj_qkv = nn.Linear(d, conv_dim, bias=False)
        self.in_proj_z = nn.Linear(d, self.hv * self.dv, bias=False)
        self.in_proj_b = nn.Linear(d, self.hv, bias=False)
        self.in_proj_a = nn.Linear(d, self.hv, bias=False)
        self.conv1d = nn.Conv1d(conv_dim, conv_dim, self.kernel, groups=conv_dim, padding=self.kernel - 1, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.hv))
        self.A_log = nn.Parameter(torch.empty(self.hv).uniform_(1, 16).log())
        self.norm = nn.Module()
        self.norm.weight = nn.Parameter(torch.ones(self.dv))
        self.out_proj = nn.Linear(self.hv * self.dv, d, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        mixed = F.silu(self.conv1d(self.in_proj_qkv(x).transpose(1, 2))[..., :t]).transpose(1, 2)
        kd = self.hk * self.dk
        q = mixed[..., :kd].reshape(b, t, self.hk, self.dk)
        k = mixed[..., kd:2 * kd].reshape(b, t, self.hk, self.dk)
        v = mixed[..., 2 * kd:].reshape(b, t, self.hv, self.dv)
        beta = torch.sigmoid(self.in_proj_b(x).float())
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        o = chunked_delta_rule(q, k, v, g, beta)  # float32 [B, T, Hv, dv]
        z = self.in_proj_z(x).reshape(b, t, self.hv, self.dv)
        normed = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.norm.weight.float() * normed * F.silu(z.float())
        return self.out_proj(out.reshape(b, t, -1).to(x.dtype))


class GatedAttention(nn.Module):
    """Full attention with a sigmoid output gate (``q_proj`` gives ``[q | gate]`` per head), zero-centred q/k norms
    and RoPE on the first ``rotary_dim`` dims of each head."""

    def __init__(self, cfg):
        super().__init__()
        d, hd = cfg["hidden_size"], cfg["head_dim"]
        self.nh, self.nkv, self.hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], hd
        self.q_proj = nn.Linear(d, 2 * self.nh * hd, bias=False)
        self.k_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, self.nkv * hd, bias=False)
        self.o_proj = nn.Linear(self.nh * hd, d, bias=False)
        self.q_norm = ZeroCenteredRMSNorm(hd, cfg["rms_norm_eps"])
        self.k_norm = ZeroCenteredRMSNorm(hd, cfg["rms_norm_eps"])

    def forward(self, x, cos, sin):
        b, s, _ = x.shape
        qg = self.q_proj(x).view(b, s, self.nh, 2 * self.hd)
        q, gate = qg[..., :self.hd], qg[..., self.hd:].reshape(b, s, self.nh * self.hd)
        q = self.q_norm(q).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(b, s, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.nkv, self.hd).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        rep = self.nh // self.nkv
        if rep > 1:
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o = o.transpose(1, 2).reshape(b, s, self.nh * self.hd) * torch.sigmoid(gate)
        return self.o_proj(o)


def rotate(x, cos, sin):
    """Rotate-half RoPE on the first ``cos.shape[-1]`` dims of ``x`` ``[B, H, S, hd]``; the rest pass through."""
    r = cos.shape[-1]
    rot, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = torch.cat((-rot[..., half:], rot[..., :half]), dim=-1)
    return torch.cat((rot * cos.to(x.dtype) + rotated * sin.to(x.dtype), rest), dim=-1)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, f = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class HybridLayer(nn.Module):
    def __init__(self, cfg, layer_type: str):
        super().__init__()
        self.is_linear = layer_type == LINEAR
        self.input_layernorm = ZeroCenteredRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        if self.is_linear:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.post_attention_layernorm = ZeroCenteredRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h) if self.is_linear else self.self_attn(h, cos, sin))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(HybridLayer(cfg, t) for t in cfg["layer_types"])
        self.norm = ZeroCenteredRMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class MtpHead(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d, eps = cfg["hidden_size"], cfg["rms_norm_eps"]
        self.pre_fc_norm_embedding = ZeroCenteredRMSNorm(d, eps)
        self.pre_fc_norm_hidden = ZeroCenteredRMSNorm(d, eps)
        self.fc = nn.Linear(2 * d, d, bias=False)
        self.layers = nn.ModuleList(HybridLayer(cfg, FULL) for _ in range(cfg["mtp_num_hidden_layers"]))
        self.norm = ZeroCenteredRMSNorm(d, eps)


class MtpForwards:
    """``forward_main`` / ``forward_mtp`` over ``model`` (embed_tokens, layers, norm), ``mtp`` and ``_rope`` (the
    dense trainer's ``Qwen3WithMTP`` and ``HybridWithMTP`` alike)."""

    def forward_main(self, ids):
        """(last decoder layer output before the final norm, logits)."""
        cos, sin = self._rope(0, ids.shape[1])
        h = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        return h, self.logits(self.model.norm(h))

    def forward_mtp(self, hidden, next_ids, pos_start: int):
        """MTP step: hidden[t] (pre-norm) + embedding of token t+1 -> (MTP pre-norm output, logits for t+2)."""
        e = self.mtp.pre_fc_norm_embedding(self.model.embed_tokens(next_ids))
        x = self.mtp.fc(torch.cat([e, self.mtp.pre_fc_norm_hidden(hidden)], dim=-1))
        cos, sin = self._rope(pos_start, next_ids.shape[1])
        for layer in self.mtp.layers:
            x = layer(x, cos, sin)
        return x, self.logits(self.mtp.norm(x))

    def logits(self, h_normed):
        return F.linear(h_normed, self.model.embed_tokens.weight)  # tied lm_head


class HybridWithMTP(MtpForwards, nn.Module):
    """The hybrid model and its MTP head (``MtpForwards``: the dense trainer's contract)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        self.mtp = MtpHead(cfg)
        rope = cfg["rope_parameters"]
        self.rotary_dim = int(cfg["head_dim"] * rope["partial_rotary_factor"])
        self.theta = rope["rope_theta"]

    def _rope(self, start: int, length: int):
        r = self.rotary_dim
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, r, 2, dtype=torch.int64).float() / r))
        freqs = torch.arange(start, start + length).float()[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def init_hybrid_weights(model: HybridWithMTP, n_layers: int) -> None:
    """Matrices ~N(0, 0.02) (output projections scaled down by depth); norms, A_log and dt_bias as constructed."""
    std = 0.02
    for name, p in model.named_parameters():
        if p.dim() == 1:
            continue
        if name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight")):
            nn.init.normal_(p, std=std / math.sqrt(2 * n_layers))
        elif name.endswith("conv1d.weight"):
            nn.init.normal_(p, std=1.0 / math.sqrt(p.shape[-1]))
        else:
            nn.init.normal_(p, std=std)


def hybrid_hf_config(dense: dict, args) -> dict:
    """The dense trainer's Hugging Face config ``dense`` made a ``qwen3_5_text`` one (``Qwen3_5ForCausalLM``) with a
    1-layer MTP head: ``args.layers`` layers, every ``args.full_every``-th one full attention, the others Gated
    DeltaNet; partial rotary (a quarter of each head) with Qwen3.5's multimodal RoPE sections (1-D for text)."""
    types = [FULL if (i + 1) % args.full_every == 0 else LINEAR for i in range(args.layers)]
    rotary = int(args.head_dim * 0.25)
    cfg = {k: v for k, v in dense.items() if k not in ("rope_theta", "rope_scaling", "use_sliding_window",
                                                       "sliding_window", "max_window_layers")}
    cfg.update({
        "architectures": ["Qwen3_5ForCausalLM"],
        "model_type": "qwen3_5_text",
        "max_position_embeddings": 4096,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [rotary // 4, rotary // 8, rotary // 8], "mrope_interleaved": True},
        "layer_types": types,
        "full_attention_interval": args.full_every,
        "linear_num_key_heads": args.linear_heads,
        "linear_num_value_heads": args.linear_heads,
        "linear_key_head_dim": args.linear_head_dim,
        "linear_value_head_dim": args.linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "pad_token_id": None,
    })
    return cfg
