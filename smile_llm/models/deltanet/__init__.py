"""Gated DeltaNet operators (Qwen3-Next / Qwen3.5 linear attention) as pure tensor functions: no
modules, no pool.

- ``recurrent_gated_delta_rule`` (decode, verify windows) and ``chunk_gated_delta_rule`` (prefill):
  the gated delta rule in PyTorch, float32 inside, with initial / final / per-position states
  (``convention`` gives the layouts);
- ``fla_chunk_gated_delta_rule`` / ``fla_recurrent_gated_delta_rule``: fla-core's CUDA kernels,
  imported lazily;
- ``gated_delta_rule``: picks among them by device and window length;
- ``causal_conv1d_prefill`` / ``causal_conv1d_update``: the short causal conv over
  q/k/v, with its state;
- ``gated_rms_norm``: the norm gated by ``silu(z)`` after the core.
"""

from .chunked import DEFAULT_CHUNK_SIZE, chunk_gated_delta_rule
from .conv import ConvOutput, causal_conv1d_prefill, causal_conv1d_update
from .convention import DeltaRuleOutput, l2norm
from .dispatch import FLA_RECURRENT_MAX_LEN, RECURRENT_MAX_LEN, gated_delta_rule
from .fla_kernels import fla_available, fla_chunk_gated_delta_rule, fla_recurrent_gated_delta_rule
from .gated_norm import gated_rms_norm
from .recurrent import recurrent_gated_delta_rule

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "FLA_RECURRENT_MAX_LEN",
    "RECURRENT_MAX_LEN",
    "ConvOutput",
    "DeltaRuleOutput",
    "causal_conv1d_prefill",
    "causal_conv1d_update",
    "chunk_gated_delta_rule",
    "fla_available",
    "fla_chunk_gated_delta_rule",
    "fla_recurrent_gated_delta_rule",
    "gated_delta_rule",
    "gated_rms_norm",
    "l2norm",
    "recurrent_gated_delta_rule",
]
