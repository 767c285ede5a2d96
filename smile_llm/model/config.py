"""ModelConfig: the one reader of Hugging Face ``config.json`` fields (Llama, Qwen2, Qwen3, the hybrid Qwen3.5 and
Qwen3-Next families, with an MTP head). The hybrid keys are read by ``config_hybrid``."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .config_hybrid import (FULL_ATTENTION, HYBRID_FAMILIES, LINEAR_ATTENTION, LinearAttentionConfig, MoeConfig,
                            read_hybrid_fields, unwrap_text_config)

FAMILIES = ("llama", "qwen2", "qwen3", *HYBRID_FAMILIES)
MAX_SPECULATIVE_TOKENS = 7  # Smile's block of 8: drafts + 1 bonus token


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (``rope_scaling.rope_type == "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """A normalised Hugging Face model config (Llama, Qwen2, Qwen3, hybrid Qwen3.5 / Qwen3-Next, optional MTP head).
    Build it with ``from_pretrained(path)`` or ``from_dict(hf_config)``; frozen. ``qwen3_5_text`` and a multimodal
    ``qwen3_5`` config both normalise to ``model_type`` ``"qwen3_5"``. The fields after ``eos_token_ids`` keep the
    dense families' meaning at their defaults (every layer full attention, full rotary, no gate, ``1 * w`` norms)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projection bias (Qwen2: always)
    qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3)
    mtp_num_hidden_layers: int = 0
    num_speculative_tokens: int = 0  # the model's default draft count (0 without MTP)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    layer_types: tuple[str, ...] = ()  # "linear_attention" / "full_attention" per layer; () -> all full attention
    linear_attention: LinearAttentionConfig | None = None  # Gated DeltaNet geometry (hybrid families)
    moe: MoeConfig | None = None  # sparse MoE with a shared expert (qwen3_next)
    partial_rotary_factor: float = 1.0  # RoPE on the first int(head_dim * factor) dims of each head
    mrope_section: tuple[int, ...] | None = None  # Qwen3.5 multimodal RoPE; 1-D RoPE for text (docs/hybrid.md)
    mrope_interleaved: bool = False
    attn_output_gate: bool = False  # q_proj gives [q | gate] per head; output *= sigmoid(gate) before o_proj
    zero_centered_norm: bool = False  # RMSNorm scales by (1 + w), except the DeltaNet gated norm (w)
    weight_prefix: str = "model."  # where the text model's tensors live ("model.language_model." multimodal)
    ignored_weight_prefixes: tuple[str, ...] = ()  # checkpoint tensors not loaded (a vision tower)
    notes: tuple[str, ...] = ()  # what was read but is not served, for the loader to report

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", (FULL_ATTENTION,) * self.num_hidden_layers)

    @property
    def is_hybrid(self) -> bool:
        """True when some layer is a Gated DeltaNet layer."""
        return LINEAR_ATTENTION in self.layer_types

    @property
    def rotary_dim(self) -> int:
        """Dims of each head that RoPE rotates (the first ones); the rest pass through."""
        return int(self.head_dim * self.partial_rotary_factor)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Read ``path/config.json`` (or ``path`` itself when it is the file)."""
        p = Path(path)
        p = p / "config.json" if p.is_dir() else p
        if not p.is_file():
            raise FileNotFoundError(f"no config.json at {p}; pass a Hugging Face model folder")
        return cls.from_dict(json.loads(p.read_text()))

    @classmethod
    def from_dict(cls, hf: dict[str, Any]) -> ModelConfig:
        """Normalise an HF config dict. ValueError for an unsupported family or inconsistent head counts."""
        hf, extra = unwrap_text_config(hf)
        model_type = str(hf.get("model_type", "")).lower()
        if model_type not in FAMILIES:
            raise ValueError(f"model_type {model_type!r} is not supported; use one of {FAMILIES}")
        model_type = "qwen3_5" if model_type == "qwen3_5_text" else model_type
        hybrid = model_type in HYBRID_FAMILIES
        try:
            hidden = int(hf["hidden_size"])
            heads = int(hf["num_attention_heads"])
            layers = int(hf["num_hidden_layers"])
            vocab = int(hf["vocab_size"])
            intermediate = int(hf["intermediate_size"])
        except KeyError as exc:
            raise ValueError(f"config.json lacks {exc.args[0]!r}") from None
        kv_heads = int(hf.get("num_key_value_heads") or heads)
        head_dim = int(hf.get("head_dim") or (256 if hybrid else hidden // heads))  # HF's hybrid default is 256
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        mtp_layers = int(hf.get("mtp_num_hidden_layers") or hf.get("num_nextn_predict_layers") or 0)
        spec = (hf.get("speculative_config") or {}).get("num_speculative_tokens")
        num_spec = 0 if mtp_layers == 0 else min(max(int(spec), 1), MAX_SPECULATIVE_TOKENS) if spec else 3
        eos = hf.get("eos_token_id")
        eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else []))
        if hybrid:
            extra.update(read_hybrid_fields(hf, model_type, layers, head_dim))
        return cls(
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(hf.get("rope_theta", (hf.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
            rope_scaling=_rope_scaling(hf.get("rope_scaling") or hf.get("rope_parameters")),
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            qk_norm=model_type == "qwen3" or hybrid,
            mtp_num_hidden_layers=mtp_layers,
            num_speculative_tokens=num_spec,
            bos_token_id=None if hf.get("bos_token_id") is None else int(hf["bos_token_id"]),
            eos_token_ids=eos_ids,
            **extra,
        )

    def resolve_speculative_tokens(self, requested: int | None) -> int:
        """Smile's rule: 0 without MTP; else the request (or the model default, or 3), capped at 7."""
        if self.mtp_num_hidden_layers == 0:
            return 0
        n = requested if requested and requested > 0 else self.num_speculative_tokens or 3
        return min(n, MAX_SPECULATIVE_TOKENS)

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (``rope_scaling``, ``linear_attention`` and ``moe`` stay dataclasses or None); not an
        HF config."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _rope_scaling(raw: Any) -> RopeScaling | None:
    if not raw:
        return None
    kind = raw.get("rope_type", raw.get("type"))
    if kind in (None, "default"):
        return None
    if kind != "llama3":
        raise ValueError(f"rope_scaling type {kind!r} is not supported (only 'llama3')")
    return RopeScaling(float(raw["factor"]), float(raw.get("low_freq_factor", 1.0)),
                       float(raw.get("high_freq_factor", 4.0)), int(raw["original_max_position_embeddings"]))
