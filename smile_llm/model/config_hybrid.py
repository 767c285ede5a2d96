"""The hybrid part of ``ModelConfig``: Qwen3.5 (``qwen3_5``, ``qwen3_5_text``) and Qwen3-Next (``qwen3_next``) fields.

These families interleave Gated DeltaNet layers ("linear_attention") with gated full-attention layers; Qwen3-Next
adds a sparse MoE with a shared expert. ``read_hybrid_fields`` turns the HF keys into ``ModelConfig`` keyword
arguments with the defaults of transformers' ``Qwen3_5TextConfig`` / ``Qwen3NextConfig`` (so a config that omits a
key means what it means to HF), and raises ValueError naming the field for inconsistent input. ``unwrap_text_config``
reads the text model of a multimodal Qwen3.5 ``config.json``. The semantics are written up in ``docs/hybrid.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_text", "qwen3_next")
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
LAYER_TYPES = (LINEAR_ATTENTION, FULL_ATTENTION)
MULTIMODAL_TEXT_PREFIX = "model.language_model."  # the text model's tensors in a Qwen3_5ForConditionalGeneration
VISION_PREFIX = "model.visual."


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Gated DeltaNet geometry (HF ``linear_*`` keys). Query/key heads are shared by groups of
    ``num_value_heads // num_key_heads`` consecutive value heads."""

    num_key_heads: int  # linear_num_key_heads
    num_value_heads: int  # linear_num_value_heads
    key_head_dim: int  # linear_key_head_dim
    value_head_dim: int  # linear_value_head_dim
    conv_kernel_dim: int  # linear_conv_kernel_dim: the short causal conv's width K
    state_dtype: str = "float32"  # mamba_ssm_dtype when the config names it (Qwen3.5 releases: float32)

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the depthwise conv: q, k and v concatenated."""
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state_shape(self) -> tuple[int, int]:
        """Per request and layer: the last K-1 conv inputs, ``[conv_dim, K-1]``."""
        return (self.conv_dim, self.conv_kernel_dim - 1)

    @property
    def recurrent_state_shape(self) -> tuple[int, int, int]:
        """Per request and layer: the delta-rule memory, ``[H_v, d_k, d_v]``."""
        return (self.num_value_heads, self.key_head_dim, self.value_head_dim)

    def state_bytes(self, conv_itemsize: int, recurrent_itemsize: int) -> int:
        """Bytes of one request's state in one DeltaNet layer (conv state + recurrent state)."""
        c, w = self.conv_state_shape
        h, dk, dv = self.recurrent_state_shape
        return c * w * conv_itemsize + h * dk * dv * recurrent_itemsize


@dataclass(frozen=True)
class MoeConfig:
    """Qwen3-Next's sparse MoE: softmax router over ``num_experts``, top ``num_experts_per_tok`` (renormalised when
    ``norm_topk_prob``), plus a shared expert scaled by ``sigmoid(shared_expert_gate(x))``."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_sparse(self, layer_idx: int) -> bool:
        """HF's rule: layer ``layer_idx`` is MoE unless listed in ``mlp_only_layers`` or off the sparse step."""
        return layer_idx not in self.mlp_only_layers and (layer_idx + 1) % self.decoder_sparse_step == 0


def unwrap_text_config(hf: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A multimodal Qwen3.5 config (``model_type`` ``qwen3_5`` with a ``text_config``) -> (the text config, extra
    ``ModelConfig`` keywords: checkpoint prefixes and a note that the vision tower is ignored). Token ids and
    ``tie_word_embeddings`` fall back to the top level when the text config lacks them. Anything else -> (hf, {})."""
    if str(hf.get("model_type", "")).lower() != "qwen3_5" or not isinstance(hf.get("text_config"), dict):
        return hf, {}
    text = dict(hf["text_config"])
    for key in ("bos_token_id", "eos_token_id", "tie_word_embeddings"):
        if key not in text and key in hf:
            text[key] = hf[key]
    text["model_type"] = "qwen3_5"
    extra: dict[str, Any] = {
        "weight_prefix": MULTIMODAL_TEXT_PREFIX,
        "ignored_weight_prefixes": (VISION_PREFIX,),
        "notes": (f"multimodal Qwen3.5 checkpoint: only the text model is served; the vision tower "
                  f"({VISION_PREFIX}*) and image/video tokens are ignored",),
    }
    return text, extra


def derive_layer_types(hf: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    """``layer_types`` as given, else HF's derivation from ``full_attention_interval`` (default 4): layer i is full
    attention when ``(i + 1) % interval == 0``. ValueError naming the field for an unknown type or a wrong length."""
    raw = hf.get("layer_types")
    if raw is None:
        interval = int(hf.get("full_attention_interval", 4))
        if interval < 1:
            raise ValueError(f"full_attention_interval {interval} must be at least 1")
        return tuple(FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION for i in range(num_layers))
    types = tuple(str(t) for t in raw)
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise ValueError(f"layer_types[{i}] is {t!r}: unknown layer type; use one of {LAYER_TYPES}")
    if len(types) != num_layers:
        raise ValueError(f"layer_types has {len(types)} entries but num_hidden_layers is {num_layers}")
    return types


def read_hybrid_fields(hf: dict[str, Any], model_type: str, num_layers: int, head_dim: int) -> dict[str, Any]:
    """The hybrid ``ModelConfig`` keywords of a ``qwen3_5``/``qwen3_next`` text config (see the module doc)."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported for {model_type} (only 'silu')")
    if hf.get("attn_output_gate", True) is False:
        raise ValueError("attn_output_gate false is not supported: transformers' Qwen3.5/Qwen3-Next attention always "
                         "gates (q_proj has 2 * num_attention_heads * head_dim rows)")
    factor = float(hf.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25)))
    rotary_dim = int(head_dim * factor)
    if not 0.0 < factor <= 1.0 or rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"partial_rotary_factor {factor} gives rotary dimension {rotary_dim} of head_dim "
                         f"{head_dim}; it must be even and in [2, head_dim]")
    section = rope.get("mrope_section")
    mrope = None if section is None else tuple(int(s) for s in section)
    if mrope is not None and sum(mrope) != rotary_dim // 2:
        raise ValueError(f"mrope_section {list(mrope)} sums to {sum(mrope)} but the rotary dimension {rotary_dim} "
                         f"has {rotary_dim // 2} frequencies")
    linear = LinearAttentionConfig(
        num_key_heads=_positive(hf, "linear_num_key_heads", 16),
        num_value_heads=_positive(hf, "linear_num_value_heads", 32),
        key_head_dim=_positive(hf, "linear_key_head_dim", 128),
        value_head_dim=_positive(hf, "linear_value_head_dim", 128),
        conv_kernel_dim=_positive(hf, "linear_conv_kernel_dim", 4),
        state_dtype=str(hf.get("mamba_ssm_dtype") or "float32"),
    )
    if linear.num_value_heads % linear.num_key_heads:
        raise ValueError(f"linear_num_value_heads {linear.num_value_heads} is not a multiple of "
                         f"linear_num_key_heads {linear.num_key_heads}")
    return {
        "layer_types": derive_layer_types(hf, num_layers),
        "linear_attention": linear,
        "moe": _read_moe(hf, num_layers) if model_type == "qwen3_next" else None,
        "partial_rotary_factor": factor,
        "mrope_section": mrope,
        "mrope_interleaved": bool(rope.get("mrope_interleaved", False)),
        "attn_output_gate": True,
        "zero_centered_norm": True,
    }


def _read_moe(hf: dict[str, Any], num_layers: int) -> MoeConfig | None:
    num_experts = int(hf.get("num_experts", 512))
    if num_experts == 0:
        return None  # HF: every layer is a dense MLP
    moe = MoeConfig(
        num_experts=_positive(hf, "num_experts", 512),
        num_experts_per_tok=_positive(hf, "num_experts_per_tok", 10),
        moe_intermediate_size=_positive(hf, "moe_intermediate_size", 512),
        shared_expert_intermediate_size=_positive(hf, "shared_expert_intermediate_size", 512),
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
        decoder_sparse_step=_positive(hf, "decoder_sparse_step", 1),
        mlp_only_layers=tuple(int(i) for i in hf.get("mlp_only_layers") or ()),
    )
    if moe.num_experts_per_tok > moe.num_experts:
        raise ValueError(f"num_experts_per_tok {moe.num_experts_per_tok} exceeds num_experts {moe.num_experts}")
    bad = [i for i in moe.mlp_only_layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"mlp_only_layers names layer {bad[0]} but num_hidden_layers is {num_layers}")
    return moe


def _positive(hf: dict[str, Any], key: str, default: int) -> int:
    value = int(hf.get(key, default))
    if value < 1:
        raise ValueError(f"{key} {value} must be positive")
    return value
