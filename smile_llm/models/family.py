"""ModelFamily: what differs between the architectures ``Transformer`` builds, in one
record per family.

A family supplies the main stack's decoder layers, the MTP head's layers and the norm both use;
everything else (embedding, RoPE, LM head, the forward over the paged pool) is shared. A new family
is a module that builds its layers plus one entry in ``families.FAMILIES``, not branches through
the transformer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from .checkpoint.config import ModelConfig


@dataclass(frozen=True)
class ModelFamily:
    """``name``; ``matches(config)``: whether a normalised config is of this family;
    ``layers(config)``: the main stack's decoder layers, in order; ``mtp_layer(config, i)``: layer i
    of the MTP head (a full-attention layer over the head's own KV pool); ``norm(dim, eps)``: the
    family's RMS norm (final norm and the head's norms); ``layer(config, i, kv_layer,
    linear_layer)``: decoder layer i alone, over KV pool layer ``kv_layer`` or DeltaNet state layer
    ``linear_layer`` (a pipeline stage's own numbering, ``stages``; None: the family cannot be
    split into stages)."""

    name: str
    matches: Callable[[ModelConfig], bool]
    layers: Callable[[ModelConfig], list[nn.Module]]
    mtp_layer: Callable[[ModelConfig, int], nn.Module]
    norm: Callable[[int, float], nn.Module]
    layer: Callable[[ModelConfig, int, int, int], nn.Module] | None = None
