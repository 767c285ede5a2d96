"""ModelConfig: the one reader of Hugging Face ``config.json`` fields (Llama, Qwen2, Qwen3, the
hybrid Qwen3.5 and Qwen3-Next families, with an MTP head). The hybrid keys are read by
``hybrid_config``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .fields import (MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN_SIZE, MAX_INTERMEDIATE_SIZE, MAX_LAYERS,
                     MAX_POSITIONS, MAX_VOCAB_SIZE, Fields, shown)
from .hybrid_config import (FULL_ATTENTION, HYBRID_FAMILIES, LINEAR_ATTENTION,
                            LinearAttentionConfig, MoeConfig, read_hybrid_fields,
                            unwrap_text_config)
from ...errors import ConfigError
from ...json_file import read_json

FAMILIES = ("llama", "qwen2", "qwen3", *HYBRID_FAMILIES)
MAX_SPECULATIVE_TOKENS = 7  # Smile's block of 8: drafts + 1 bonus token
MAX_CONFIG_BYTES = 16 << 20  # a config.json larger than this is refused before it is parsed


@dataclass(frozen=True)
class RopeScaling:
    """Llama-3 style frequency scaling (``rope_scaling.rope_type == "llama3"``)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    """A normalised Hugging Face model config (Llama, Qwen2, Qwen3, hybrid Qwen3.5 / Qwen3-Next,
    optional MTP head). Build it with ``from_pretrained(path)`` or ``from_dict(hf_config)``; frozen.
    ``qwen3_5_text`` and a multimodal ``qwen3_5`` config both normalise to ``model_type``
    ``"qwen3_5"``. The fields after ``eos_token_ids`` keep the dense families' meaning at their
    defaults (every layer full attention, full rotary, no gate, ``1 * w`` norms)."""

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
    # "linear_attention" / "full_attention" per layer; () -> all full attention
    layer_types: tuple[str, ...] = ()
    # Gated DeltaNet geometry (hybrid families)
    linear_attention: LinearAttentionConfig | None = None
    moe: MoeConfig | None = None  # sparse MoE with a shared expert (qwen3_next)
    partial_rotary_factor: float = 1.0  # RoPE on the first int(head_dim * factor) dims of each head
    # Qwen3.5 multimodal RoPE; 1-D RoPE for text (docs/hybrid.md)
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False
    # q_proj gives [q | gate] per head; output *= sigmoid(gate) before o_proj
    attn_output_gate: bool = False
    # RMSNorm scales by (1 + w), except the DeltaNet gated norm (w)
    zero_centered_norm: bool = False
    # where the text model's tensors live ("model.language_model." multimodal)
    weight_prefix: str = "model."
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
        """Read ``path/config.json`` (or ``path`` itself when it is the file). FileNotFoundError
        when it is absent; ``ConfigError`` naming the file and the field when it is not a JSON
        object or a field is wrong (see ``from_dict``)."""
        p = Path(path)
        p = p / "config.json" if p.is_dir() else p
        if not p.is_file():
            raise FileNotFoundError(f"no config.json at {p}; pass a Hugging Face model folder")
        raw = read_json(p, MAX_CONFIG_BYTES, lambda message: ConfigError(message, path=p))
        try:
            return cls.from_dict(raw)
        except ConfigError as exc:
            raise exc.in_file(p) from None

    @classmethod
    def from_dict(cls, hf: Mapping[str, Any]) -> ModelConfig:
        """Normalise an HF config dict, checking every field it reads before anything is built from
        it: its type (``fields.Fields``: integers are integers, bools are ``true``/``false``,
        numbers are finite), its range (sizes positive and within the ``fields`` limits,
        token ids inside the vocabulary) and its consistency with the other fields (the heads divide
        into KV groups, ``head_dim`` derivable and even, ``rope_scaling`` complete for its type, the
        hybrid fields of ``hybrid_config``). ``ConfigError`` (a ValueError) naming the field
        otherwise, and for an unsupported family."""
        if not isinstance(hf, Mapping):
            raise ConfigError(f"config.json must hold a JSON object, got {type(hf).__name__}")
        text, extra = unwrap_text_config(hf)
        f = Fields(text, "text_config." if text is not hf else "")
        model_type = f.string("model_type", "").lower()
        if model_type not in FAMILIES:
            raise ConfigError(f"model_type {shown(model_type)} is not supported; use one of "
                              f"{FAMILIES}", field="model_type")
        model_type = "qwen3_5" if model_type == "qwen3_5_text" else model_type
        hybrid = model_type in HYBRID_FAMILIES
        hidden = f.integer("hidden_size", low=1, high=MAX_HIDDEN_SIZE)
        heads = f.integer("num_attention_heads", low=1, high=MAX_HEADS)
        layers = f.integer("num_hidden_layers", low=1, high=MAX_LAYERS)
        vocab = f.integer("vocab_size", low=1, high=MAX_VOCAB_SIZE)
        intermediate = f.integer("intermediate_size", low=1, high=MAX_INTERMEDIATE_SIZE)
        kv_heads = f.integer("num_key_value_heads", heads, low=1, high=MAX_HEADS)
        if heads % kv_heads:
            raise f.error("num_key_value_heads", f"num_attention_heads {heads} is not a multiple "
                                                 f"of num_key_value_heads {kv_heads}")
        head_dim = _head_dim(f, hybrid, hidden, heads)
        act = f.string("hidden_act", "silu")
        if act != "silu":
            raise f.error("hidden_act", f"hidden_act {shown(act)} is not supported for "
                                        f"{model_type} (only 'silu')")
        mtp_layers = (f.optional_integer("mtp_num_hidden_layers", high=MAX_LAYERS)
                      or f.optional_integer("num_nextn_predict_layers", high=MAX_LAYERS) or 0)
        speculative = f.mapping("speculative_config")
        spec = None if speculative is None else speculative.optional_integer(
            "num_speculative_tokens", low=-(1 << 31), high=1 << 31)
        num_spec = (0 if mtp_layers == 0
                    else min(max(spec, 1), MAX_SPECULATIVE_TOKENS) if spec else 3)
        attention_bias = f.flag("attention_bias", False)
        if hybrid:
            extra.update(read_hybrid_fields(f, model_type, layers, head_dim))
        return cls(
            model_type=model_type,
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=intermediate,
            rms_norm_eps=f.number("rms_norm_eps", 1e-6, above=0.0, at_most=1.0),
            rope_theta=_rope_theta(f),
            rope_scaling=_rope_scaling(f),
            max_position_embeddings=f.integer("max_position_embeddings", 4096, low=1,
                                              high=MAX_POSITIONS),
            tie_word_embeddings=f.flag("tie_word_embeddings", False),
            attention_bias=model_type == "qwen2" or attention_bias,
            qk_norm=model_type == "qwen3" or hybrid,
            mtp_num_hidden_layers=mtp_layers,
            num_speculative_tokens=num_spec,
            bos_token_id=f.optional_integer("bos_token_id", high=vocab - 1),
            eos_token_ids=f.token_ids("eos_token_id", vocab),
            **extra,
        )

    def resolve_speculative_tokens(self, requested: int | None) -> int:
        """Smile's rule: 0 without MTP; else the request (or the model default, or
        3), capped at 7."""
        if self.mtp_num_hidden_layers == 0:
            return 0
        n = requested if requested and requested > 0 else self.num_speculative_tokens or 3
        return min(n, MAX_SPECULATIVE_TOKENS)


def _head_dim(f: Fields, hybrid: bool, hidden: int, heads: int) -> int:
    """``head_dim`` as given, else HF's default: 256 for the hybrid families,
    ``hidden_size / num_attention_heads`` for the dense ones (which must divide). A dense model's
    head_dim must be even (RoPE rotates pairs of dims)."""
    if f.has("head_dim"):
        head_dim = f.integer("head_dim", low=1, high=MAX_HEAD_DIM)
    elif hybrid:
        head_dim = 256
    elif hidden % heads:
        raise f.error("num_attention_heads",
                      f"hidden_size {hidden} is not a multiple of num_attention_heads "
                      f"{heads}, and there is no head_dim to use instead")
    else:
        head_dim = hidden // heads
    if not hybrid and head_dim % 2:
        raise f.error("head_dim", f"head_dim {head_dim} must be even: RoPE rotates pairs of "
                                  "dimensions")
    return head_dim


def _rope_fields(f: Fields) -> Fields | None:
    """The RoPE scaling object: ``rope_scaling`` when non-empty, else ``rope_parameters``
    (transformers 5)."""
    scaling = f.mapping("rope_scaling")
    return scaling if scaling is not None and scaling.raw else f.mapping("rope_parameters")


def _rope_theta(f: Fields) -> float:
    """``rope_theta`` at the top level, else inside ``rope_parameters``, else 10000; a finite
    positive number."""
    if f.has("rope_theta"):
        return f.number("rope_theta", above=0.0)
    params = f.mapping("rope_parameters")
    return params.number("rope_theta", 10000.0, above=0.0) if params is not None else 10000.0


def _rope_scaling(f: Fields) -> RopeScaling | None:
    """Llama-3 scaling from the RoPE scaling object (``_rope_fields``): None for no type or
    ``"default"``; for ``"llama3"`` a positive ``factor``, positive ``low_freq_factor`` <
    ``high_freq_factor`` and a positive ``original_max_position_embeddings`` (both required).
    ConfigError naming the field for any other type."""
    rope = _rope_fields(f)
    if rope is None:
        return None
    key = "rope_type" if rope.has("rope_type") else "type"
    kind = rope.string(key, "default")
    if kind == "default":
        return None
    if kind != "llama3":
        raise rope.error(key, f"{rope.name(key)} {shown(kind)} is not supported (only 'llama3')")
    low = rope.number("low_freq_factor", 1.0, above=0.0)
    high = rope.number("high_freq_factor", 4.0, above=0.0)
    if not high > low:
        raise rope.error("high_freq_factor", f"{rope.name('high_freq_factor')} {high:g} must be "
                                             f"greater than {rope.name('low_freq_factor')} {low:g}")
    return RopeScaling(rope.number("factor", above=0.0), low, high,
                       rope.integer("original_max_position_embeddings", low=1, high=MAX_POSITIONS))
