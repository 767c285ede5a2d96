"""The hybrid part of ``ModelConfig``: Qwen3.5 (``qwen3_5``, ``qwen3_5_text``) and Qwen3-Next
(``qwen3_next``) fields.

These families interleave Gated DeltaNet layers ("linear_attention") with gated full-attention
layers; Qwen3-Next adds a sparse MoE with a shared expert. ``read_hybrid_fields`` turns the HF keys
into ``ModelConfig`` keyword arguments with the defaults of transformers' ``Qwen3_5TextConfig`` /
``Qwen3NextConfig`` (so a config that omits a key means what it means to HF), and raises
``ConfigError`` (a ValueError) naming the field for a value of the wrong type, out of range or
inconsistent with another. ``unwrap_text_config`` reads the text model of a multimodal Qwen3.5
``config.json``. The semantics are written up in ``docs/hybrid.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .fields import (MAX_CONV_KERNEL, MAX_EXPERTS, MAX_HEAD_DIM, MAX_HEADS, MAX_INTERMEDIATE_SIZE,
                     MAX_LAYERS, Fields, shown)

HYBRID_FAMILIES = ("qwen3_5", "qwen3_5_text", "qwen3_next")
LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"
LAYER_TYPES = (LINEAR_ATTENTION, FULL_ATTENTION)
# the text model's tensors in a Qwen3_5ForConditionalGeneration
MULTIMODAL_TEXT_PREFIX = "model.language_model."
VISION_PREFIX = "model.visual."
# mamba_ssm_dtype: the DeltaNet recurrent state's storage
STATE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LinearAttentionConfig:
    """Gated DeltaNet geometry (HF ``linear_*`` keys). Query/key heads are shared by groups of
    ``num_value_heads // num_key_heads`` consecutive value heads."""

    num_key_heads: int  # linear_num_key_heads
    num_value_heads: int  # linear_num_value_heads
    key_head_dim: int  # linear_key_head_dim
    value_head_dim: int  # linear_value_head_dim
    conv_kernel_dim: int  # linear_conv_kernel_dim: the short causal conv's width K
    # mamba_ssm_dtype when the config names it (Qwen3.5 releases: float32)
    state_dtype: str = "float32"

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
    """Qwen3-Next's sparse MoE: softmax router over ``num_experts``, top ``num_experts_per_tok``
    (renormalised when ``norm_topk_prob``), plus a shared expert scaled by
    ``sigmoid(shared_expert_gate(x))``."""

    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool = True
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_sparse(self, layer_idx: int) -> bool:
        """HF's rule: layer ``layer_idx`` is MoE unless listed in ``mlp_only_layers`` or off
        the sparse step."""
        return (layer_idx not in self.mlp_only_layers
                and (layer_idx + 1) % self.decoder_sparse_step == 0)


def unwrap_text_config(hf: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, Any]]:
    """A multimodal Qwen3.5 config (``model_type`` ``qwen3_5`` with a ``text_config``) -> (the text
    config, extra ``ModelConfig`` keywords: checkpoint prefixes and a note that the vision tower is
    ignored). Token ids and ``tie_word_embeddings`` fall back to the top level when the text config
    lacks them. Anything else -> (hf, {})."""
    if (str(hf.get("model_type", "")).lower() != "qwen3_5"
            or not isinstance(hf.get("text_config"), dict)):
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


def derive_layer_types(f: Fields, num_layers: int) -> tuple[str, ...]:
    """``layer_types`` as given, else HF's derivation from ``full_attention_interval`` (default 4):
    layer i is full attention when ``(i + 1) % interval == 0``. ConfigError naming the field for an
    unknown type or a wrong length."""
    given = f.str_list("layer_types", max_len=MAX_LAYERS)
    if given is None:
        interval = f.integer("full_attention_interval", 4, low=-(1 << 31), high=MAX_LAYERS)
        if interval < 1:
            raise f.error("full_attention_interval",
                          f"full_attention_interval {interval} must be at least 1")
        return tuple(FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION
                     for i in range(num_layers))
    for i, t in enumerate(given):
        if t not in LAYER_TYPES:
            raise f.error("layer_types", f"layer_types[{i}] is {shown(t)}: unknown layer type; "
                                         f"use one of {LAYER_TYPES}")
    if len(given) != num_layers:
        raise f.error("layer_types", f"layer_types has {len(given)} entries but num_hidden_layers "
                                     f"is {num_layers}")
    return given


def read_hybrid_fields(f: Fields, model_type: str, num_layers: int,
                       head_dim: int) -> dict[str, Any]:
    """The hybrid ``ModelConfig`` keywords of a ``qwen3_5``/``qwen3_next`` text config (see the
    module doc); every field typed and range-checked by ``Fields`` (ConfigError naming it)."""
    rope = f.mapping("rope_parameters")
    if rope is None or not rope.raw:
        rope = f.mapping("rope_scaling") or Fields({}, "rope_parameters.")
    if not f.flag("attn_output_gate", True):
        raise f.error("attn_output_gate",
                      "attn_output_gate false is not supported: transformers' Qwen3.5/Qwen3-Next "
                      "attention always gates (q_proj has 2 * num_attention_heads * head_dim rows)")
    where = f if f.has("partial_rotary_factor") else rope
    factor = where.number("partial_rotary_factor", 0.25, above=0.0, at_most=1.0)
    rotary_dim = int(head_dim * factor)
    if rotary_dim < 2 or rotary_dim % 2:
        raise where.error("partial_rotary_factor",
                          f"partial_rotary_factor {factor} gives rotary dimension "
                          f"{rotary_dim} of head_dim {head_dim}; it must be even and in "
                          f"[2, head_dim]")
    mrope = rope.int_list("mrope_section", high=MAX_HEAD_DIM, max_len=8)
    if mrope is not None and sum(mrope) != rotary_dim // 2:
        raise rope.error("mrope_section",
                         f"mrope_section {list(mrope)} sums to {sum(mrope)} but the rotary "
                         f"dimension {rotary_dim} has {rotary_dim // 2} frequencies")
    linear = LinearAttentionConfig(
        num_key_heads=f.integer("linear_num_key_heads", 16, low=1, high=MAX_HEADS),
        num_value_heads=f.integer("linear_num_value_heads", 32, low=1, high=MAX_HEADS),
        key_head_dim=f.integer("linear_key_head_dim", 128, low=1, high=MAX_HEAD_DIM),
        value_head_dim=f.integer("linear_value_head_dim", 128, low=1, high=MAX_HEAD_DIM),
        conv_kernel_dim=f.integer("linear_conv_kernel_dim", 4, low=2, high=MAX_CONV_KERNEL),
        state_dtype=f.string("mamba_ssm_dtype", "float32", choices=STATE_DTYPES),
    )
    if linear.num_value_heads % linear.num_key_heads:
        raise f.error("linear_num_value_heads",
                      f"linear_num_value_heads {linear.num_value_heads} is not a multiple "
                      f"of linear_num_key_heads {linear.num_key_heads}")
    return {
        "layer_types": derive_layer_types(f, num_layers),
        "linear_attention": linear,
        "moe": _read_moe(f, num_layers) if model_type == "qwen3_next" else None,
        "partial_rotary_factor": factor,
        "mrope_section": mrope,
        "mrope_interleaved": rope.flag("mrope_interleaved", False),
        "attn_output_gate": True,
        "zero_centered_norm": True,
    }


def _read_moe(f: Fields, num_layers: int) -> MoeConfig | None:
    num_experts = f.integer("num_experts", 512, high=MAX_EXPERTS)
    if num_experts == 0:
        return None  # HF: every layer is a dense MLP
    moe = MoeConfig(
        num_experts=num_experts,
        num_experts_per_tok=f.integer("num_experts_per_tok", 10, low=1, high=MAX_EXPERTS),
        moe_intermediate_size=f.integer("moe_intermediate_size", 512, low=1,
                                        high=MAX_INTERMEDIATE_SIZE),
        shared_expert_intermediate_size=f.integer("shared_expert_intermediate_size", 512, low=1,
                                                  high=MAX_INTERMEDIATE_SIZE),
        norm_topk_prob=f.flag("norm_topk_prob", True),
        decoder_sparse_step=f.integer("decoder_sparse_step", 1, low=1, high=MAX_LAYERS),
        mlp_only_layers=f.int_list("mlp_only_layers", high=MAX_LAYERS, max_len=MAX_LAYERS) or (),
    )
    if moe.num_experts_per_tok > moe.num_experts:
        raise f.error("num_experts_per_tok", f"num_experts_per_tok {moe.num_experts_per_tok} "
                                             f"exceeds num_experts {moe.num_experts}")
    bad = [i for i in moe.mlp_only_layers if not 0 <= i < num_layers]
    if bad:
        raise f.error("mlp_only_layers", f"mlp_only_layers names layer {bad[0]} but "
                                         f"num_hidden_layers is {num_layers}")
    return moe
