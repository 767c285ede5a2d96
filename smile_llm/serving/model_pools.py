"""The KV pool (and, for a hybrid model, the DeltaNet state pool it carries) of one loaded model on
one rank: sized from the config, the stage's layers and the memory left, stored as ``kv_dtype``
asks, and the same size on every rank of a parallel job."""

from __future__ import annotations

from typing import Any

import torch

from ..cache import KvCacheLayout, KvCachePool, StatePool
from ..cache.kv_dtype import LayerFormats, kv_formats
from ..models.checkpoint.config import ModelConfig
from ..models.checkpoint.hybrid_config import FULL_ATTENTION
from ..models.stages import PipelineStage
from ..models.state_step import state_specs


def kv_storage(config: ModelConfig, kv_dtype: Any, kv_scales: tuple[float, float] | None,
               dtype: torch.dtype, page_size: int) -> tuple[LayerFormats, ...]:
    """The KV formats of every attention layer of the model (``kv_formats``: ``kv_dtype`` per
    layer and side, default ``dtype``), checked for the whole model before any rank joins a process
    group, so that every rank refuses alike: ValueError for a packed format the geometry does not
    fit, or ``kv_scales`` without an FP8 layer."""
    kv_layers = sum(1 for t in config.layer_types if t == FULL_ATTENTION)
    formats = kv_formats(kv_dtype, kv_layers, dtype)
    KvCacheLayout(kv_layers, config.num_key_value_heads, config.head_dim, 1,
                  page_size).layer_page_bytes(formats, page_size)
    if kv_scales is not None and not any(f.k.fp8 or f.v.fp8 for f in formats):
        raise ValueError(f"kv_scales apply to FP8 KV only; kv_dtype is "
                         f"{', '.join(map(str, formats))}")
    return formats


def allocate_pools(config: ModelConfig, local: ModelConfig, stage: PipelineStage,
                   device: torch.device, dtype: torch.dtype, *, max_batch_size: int,
                   max_seq_len: int, page_size: int, mem_fraction: float | None,
                   formats: tuple[LayerFormats, ...], kv_scales: tuple[float, float] | None,
                   state_snapshots: int | None) -> KvCachePool:
    """This rank's KV pool for ``max_batch_size`` rows of ``max_seq_len`` tokens: its stage's
    attention layers and this rank's KV heads (``local``), stored as ``formats`` (``kv_storage``:
    every attention layer's; this stage takes its own), ``kv_scales`` where the stage has FP8
    layers, sized from ``mem_fraction`` (default 0.85) of the free memory after the DeltaNet state
    pool of a hybrid model (Smile's order; its ``state_snapshots`` prefix snapshots, default
    ``2 * max_batch_size``, attached to the pool). With more than one rank, every rank's pool takes
    the smallest rank's size."""
    layout = KvCacheLayout(len(stage.kv_layers), local.num_key_value_heads, config.head_dim,
                           max_batch_size, max_seq_len)
    formats = formats[stage.kv_layers.start:stage.kv_layers.stop]
    snapshots = 2 * max_batch_size if state_snapshots is None else state_snapshots
    states = (StatePool(state_specs(local, dtype, len(stage.linear_layers)), max_batch_size,
                        device, snapshots) if config.is_hybrid else None)
    options: dict[str, Any] = {"kv_formats": formats, "compute_dtype": dtype,
                               "num_tails": 2 * max_batch_size + 4,
                               "first_layer": stage.kv_layers.start}
    pool = KvCachePool.allocate(layout, device, dtype, mem_fraction or 0.85, page_size, **options)
    if stage.world.size > 1:  # sized from each device's free memory on CUDA: take the smallest
        slots = min(stage.world.all_gather_object(pool.num_slots))
        if slots != pool.num_slots:
            pool.close()
            pool = KvCachePool(layout.num_layers, slots, layout.num_kv_heads, layout.head_dim,
                               page_size, device, dtype, **options)
    if kv_scales is not None and any(f.k.fp8 or f.v.fp8 for f in formats):
        pool.set_kv_scales(*kv_scales)
    if states is not None:  # a prefix hit then ends at a node with a state snapshot, restored
        pool.attach_state(states)
    return pool
