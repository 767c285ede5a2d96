"""The tensor layout of a hybrid (Qwen3.5 / Qwen3-Next) checkpoint, derived from its
``ModelConfig``, and the check that a checkpoint agrees with it before any weight is loaded.

Names are the checkpoint's (what ``transformers``' ``save_pretrained`` writes and the published
checkpoints hold): the text model under ``config.weight_prefix`` (``model.``, or
``model.language_model.`` in a multimodal Qwen3.5 checkpoint), ``lm_head.weight`` at the top, the
MTP head under ``mtp.``, Qwen3-Next experts one module per expert
(``mlp.experts.{e}.gate_proj.weight``; transformers fuses them in memory only). ``docs/hybrid.md``
explains each tensor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import TypeVar

from .config import ModelConfig
from .hybrid_config import LINEAR_ATTENTION

Shape = tuple[int, ...]
T = TypeVar("T")
_LAYER = re.compile(r"layers\.(\d+)\.")


def expected_hybrid_tensors(config: ModelConfig) -> dict[str, Shape]:
    """Every tensor a checkpoint of ``config`` must hold, by checkpoint name, in a stable order.
    ``lm_head.weight`` is left out when the embeddings are tied (the checkpoint may still carry it).
    ValueError for a non-hybrid config."""
    if config.linear_attention is None:
        raise ValueError(f"model_type {config.model_type!r} is not a hybrid family")
    d, p = config.hidden_size, config.weight_prefix
    out: dict[str, Shape] = {f"{p}embed_tokens.weight": (config.vocab_size, d)}
    for i, kind in enumerate(config.layer_types):
        lp = f"{p}layers.{i}."
        out.update({f"{lp}input_layernorm.weight": (d,),
                    f"{lp}post_attention_layernorm.weight": (d,)})
        out.update(_deltanet(config, lp) if kind == LINEAR_ATTENTION else _attention(config, lp))
        out.update(_mlp(config, lp, i))
    out[f"{p}norm.weight"] = (d,)
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = (config.vocab_size, d)
    if config.mtp_num_hidden_layers:
        out.update({"mtp.fc.weight": (d, 2 * d), "mtp.pre_fc_norm_embedding.weight": (d,),
                    "mtp.pre_fc_norm_hidden.weight": (d,)})
        for i in range(config.mtp_num_hidden_layers):
            lp = f"mtp.layers.{i}."
            out.update({f"{lp}input_layernorm.weight": (d,),
                        f"{lp}post_attention_layernorm.weight": (d,)})
            out.update(_attention(config, lp))
            out.update(_mlp(config, lp, i))
        out["mtp.norm.weight"] = (d,)
    return out


def check_hybrid_checkpoint(config: ModelConfig, shapes: Mapping[str, Sequence[int]]) -> None:
    """ValueError unless the checkpoint tensors ``shapes`` (name -> shape) are exactly
    ``expected_hybrid_tensors``, ignoring ``config.ignored_weight_prefixes`` and a tied
    ``lm_head.weight`` of the right shape. The message names the first tensor that is missing,
    unexpected or of the wrong shape (both shapes), with its layer type."""
    want = expected_hybrid_tensors(config)
    have = {n: tuple(int(x) for x in s) for n, s in shapes.items()
            if not n.startswith(config.ignored_weight_prefixes)}
    if config.tie_word_embeddings and "lm_head.weight" in have:
        want["lm_head.weight"] = (config.vocab_size, config.hidden_size)
    missing = [n for n in want if n not in have]
    if missing:
        n = missing[0]
        raise ValueError(f"checkpoint lacks {len(missing)} tensors the config needs, first {n!r} "
                         f"(shape {want[n]}){_context(config, n)}")
    unexpected = [n for n in have if n not in want]
    if unexpected:
        n = unexpected[0]
        raise ValueError(f"checkpoint has {len(unexpected)} tensors the config does not describe, "
                         f"first {n!r} (shape {have[n]}){_context(config, n)}")
    for n, shape in want.items():
        if have[n] != shape:
            raise ValueError(f"tensor {n!r} has shape {have[n]} in the checkpoint but the config "
                             f"gives {shape}{_context(config, n)}")


def to_module_names(tensors: Mapping[str, T], config: ModelConfig) -> dict[str, T]:
    """Checkpoint names -> module names: ``config.weight_prefix`` becomes ``model.`` and tensors
    under ``config.ignored_weight_prefixes`` are dropped; other names are kept."""
    p = config.weight_prefix
    return {("model." + n[len(p):] if n.startswith(p) else n): t for n, t in tensors.items()
            if not n.startswith(config.ignored_weight_prefixes)}


def _attention(c: ModelConfig, lp: str) -> dict[str, Shape]:
    d, hd = c.hidden_size, c.head_dim
    # per head: [q_h | gate_h]
    q_rows = c.num_attention_heads * hd * (2 if c.attn_output_gate else 1)
    kv_rows = c.num_key_value_heads * hd
    a = f"{lp}self_attn."
    out: dict[str, Shape] = {f"{a}q_proj.weight": (q_rows, d), f"{a}k_proj.weight": (kv_rows, d),
                             f"{a}v_proj.weight": (kv_rows, d),
                             f"{a}o_proj.weight": (d, c.num_attention_heads * hd),
                             f"{a}q_norm.weight": (hd,), f"{a}k_norm.weight": (hd,)}
    if c.attention_bias:
        out.update({f"{a}q_proj.bias": (q_rows,), f"{a}k_proj.bias": (kv_rows,),
                    f"{a}v_proj.bias": (kv_rows,), f"{a}o_proj.bias": (d,)})
    return out


def _deltanet(c: ModelConfig, lp: str) -> dict[str, Shape]:
    la = c.linear_attention
    assert la is not None
    d, hv, a = c.hidden_size, la.num_value_heads, f"{lp}linear_attn."
    if c.model_type == "qwen3_next":  # fused, grouped per key head (docs/hybrid.md)
        proj: dict[str, Shape] = {f"{a}in_proj_qkvz.weight": (2 * la.key_dim + 2 * la.value_dim, d),
                                  f"{a}in_proj_ba.weight": (2 * hv, d)}
    else:
        proj = {f"{a}in_proj_qkv.weight": (la.conv_dim, d),
                f"{a}in_proj_z.weight": (la.value_dim, d),
                f"{a}in_proj_b.weight": (hv, d), f"{a}in_proj_a.weight": (hv, d)}
    return {**proj, f"{a}conv1d.weight": (la.conv_dim, 1, la.conv_kernel_dim), f"{a}dt_bias": (hv,),
            f"{a}A_log": (hv,), f"{a}norm.weight": (la.value_head_dim,),
            f"{a}out_proj.weight": (d, la.value_dim)}


def _mlp(c: ModelConfig, lp: str, layer_idx: int) -> dict[str, Shape]:
    d, m = c.hidden_size, f"{lp}mlp."
    if c.moe is None or not c.moe.is_sparse(layer_idx):
        i = c.intermediate_size
        return {f"{m}gate_proj.weight": (i, d), f"{m}up_proj.weight": (i, d),
                f"{m}down_proj.weight": (d, i)}
    e, s = c.moe.moe_intermediate_size, c.moe.shared_expert_intermediate_size
    out: dict[str, Shape] = {f"{m}gate.weight": (c.moe.num_experts, d)}
    for x in range(c.moe.num_experts):
        out.update({f"{m}experts.{x}.gate_proj.weight": (e, d),
                    f"{m}experts.{x}.up_proj.weight": (e, d),
                    f"{m}experts.{x}.down_proj.weight": (d, e)})
    out.update({f"{m}shared_expert.gate_proj.weight": (s, d),
                f"{m}shared_expert.up_proj.weight": (s, d),
                f"{m}shared_expert.down_proj.weight": (d, s),
                f"{m}shared_expert_gate.weight": (1, d)})
    return out


def _context(c: ModelConfig, name: str) -> str:
    if name.startswith("mtp."):
        return f"; the config has mtp_num_hidden_layers {c.mtp_num_hidden_layers}"
    found = _LAYER.search(name)
    if found and name.startswith(c.weight_prefix):
        i = int(found.group(1))
        kind = c.layer_types[i] if i < len(c.layer_types) else "absent"
        return f"; layer_types[{i}] is {kind!r}" if kind != "absent" else \
            f"; num_hidden_layers is {c.num_hidden_layers}"
    return ""
