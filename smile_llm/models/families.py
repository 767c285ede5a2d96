"""The registry of model families (``family.ModelFamily``): the hybrid Qwen3.5 / Qwen3-Next families
(Gated DeltaNet and gated attention, with or without MoE) and the dense decoder (Llama, Qwen2,
Qwen3, Mistral-style, with or without MoE). The first entry that matches a config builds it."""

from __future__ import annotations

from .checkpoint.config import ModelConfig
from .family import ModelFamily
from .hybrid_layer import HYBRID
from .layers import DENSE

FAMILIES: tuple[ModelFamily, ...] = (HYBRID, DENSE)


def family_of(config: ModelConfig) -> ModelFamily:
    """The family that builds ``config`` (the dense decoder matches every config the others do
    not)."""
    return next(f for f in FAMILIES if f.matches(config))
